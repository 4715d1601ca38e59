{{- if .Values.operator.enabled }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: cilium-operator
  namespace: {{ include "cilium.namespace" . }}
{{- end }}
