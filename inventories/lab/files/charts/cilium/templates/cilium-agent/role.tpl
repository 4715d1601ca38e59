apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: cilium-config-agent
  namespace: {{ include "cilium.namespace" . }}
  labels:
    app.kubernetes.io/part-of: cilium
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch]
