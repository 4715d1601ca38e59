{{- define "widget-operator.labels" -}}
app.kubernetes.io/name: widget-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- define "widget-operator.selector" -}}
app.kubernetes.io/name: widget-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
