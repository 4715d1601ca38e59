{{- if .Values.tls.secretsNamespace.create }}
# Talos creates namespaces first, whatever their place in the manifest.
apiVersion: v1
kind: Namespace
metadata:
  name: {{ .Values.tls.secretsNamespace.name | quote }}
  labels:
    app.kubernetes.io/part-of: cilium
{{- end }}
