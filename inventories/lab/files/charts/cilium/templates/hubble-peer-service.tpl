{{- if .Values.hubble.enabled }}
apiVersion: v1
kind: Service
metadata:
  name: hubble-peer
  namespace: {{ include "cilium.namespace" . }}
  labels:
    k8s-app: cilium
    app.kubernetes.io/part-of: cilium
    app.kubernetes.io/name: hubble-peer
spec:
  selector:
    k8s-app: cilium
  ports:
  - name: peer-service
    port: 443
    protocol: TCP
    targetPort: {{ .Values.hubble.peerService.targetPort }}
  internalTrafficPolicy: Local
{{- end }}
