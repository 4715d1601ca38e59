{{- if and .Values.operator.enabled .Values.tls.secretsNamespace.create }}
# The operator manages TLS secrets (Ingress, Gateway API, TLS interception) in the secrets namespace.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: cilium-operator-tlsinterception-secrets
  namespace: {{ .Values.tls.secretsNamespace.name | quote }}
  labels:
    app.kubernetes.io/part-of: cilium
rules:
- apiGroups: [""]
  resources: [secrets]
  verbs: [create, delete, update, patch]
{{- end }}
