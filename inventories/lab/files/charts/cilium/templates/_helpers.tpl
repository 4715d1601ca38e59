{{/* Namespace of every object: namespaceOverride or the release namespace (as the upstream chart). */}}
{{- define "cilium.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* KUBERNETES_SERVICE_HOST / _PORT values, quoted. */}}
{{- define "k8sServiceHost" -}}
{{- .Values.k8sServiceHost | toString | quote -}}
{{- end -}}
{{- define "k8sServicePort" -}}
{{- .Values.k8sServicePort | toString | quote -}}
{{- end -}}

{{/* Agent and operator images. */}}
{{- define "cilium.image" -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}
{{- define "cilium.operator.image" -}}
{{- printf "%s:%s" .Values.operator.image.repository .Values.operator.image.tag -}}
{{- end -}}

{{/* Environment both containers get: node name, namespace, and the API server address without kube-proxy. */}}
{{- define "cilium.commonEnv" -}}
- name: K8S_NODE_NAME
  valueFrom:
    fieldRef:
      apiVersion: v1
      fieldPath: spec.nodeName
- name: CILIUM_K8S_NAMESPACE
  valueFrom:
    fieldRef:
      apiVersion: v1
      fieldPath: metadata.namespace
{{- if .Values.k8sServiceHost }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ include "k8sServiceHost" . }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ include "k8sServicePort" . }}
{{- end }}
{{- end -}}
