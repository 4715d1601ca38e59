apiVersion: v1
kind: ServiceAccount
metadata:
  name: cilium
  namespace: {{ include "cilium.namespace" . }}
