apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ .Release.Name }}
  labels:
    {{- include "widget-operator.labels" . | nindent 4 }}
rules:
- apiGroups: [lab.proxtalos.dev]
  resources: [widgets]
  verbs: [get, list, watch, update, patch]
- apiGroups: [lab.proxtalos.dev]
  resources: [widgets/status]
  verbs: [get, update, patch]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update]
