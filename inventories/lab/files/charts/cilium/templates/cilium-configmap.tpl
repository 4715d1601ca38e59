apiVersion: v1
kind: ConfigMap
metadata:
  name: cilium-config
  namespace: {{ include "cilium.namespace" . }}
data:
  cluster-name: {{ .Values.cluster.name | quote }}
  cluster-id: {{ .Values.cluster.id | quote }}
  ipam: {{ .Values.ipam.mode | quote }}
  kube-proxy-replacement: {{ .Values.kubeProxyReplacement | toString | quote }}
  routing-mode: {{ .Values.routingMode | quote }}
  {{- if eq .Values.routingMode "tunnel" }}
  tunnel-protocol: {{ .Values.tunnelProtocol | quote }}
  {{- end }}
  {{- if .Values.autoDirectNodeRoutes }}
  auto-direct-node-routes: "true"
  {{- end }}
  {{- if .Values.ipv4NativeRoutingCIDR }}
  ipv4-native-routing-cidr: {{ .Values.ipv4NativeRoutingCIDR | quote }}
  {{- end }}
  enable-bpf-masquerade: {{ .Values.bpf.masquerade | toString | quote }}
  enable-host-legacy-routing: {{ .Values.bpf.hostLegacyRouting | toString | quote }}
  cgroup-root: {{ .Values.cgroup.hostRoot | quote }}
  enable-ipv4: "true"
  enable-ipv6: "false"
  enable-hubble: {{ .Values.hubble.enabled | toString | quote }}
  {{- if .Values.hubble.enabled }}
  hubble-listen-address: ":{{ .Values.hubble.peerService.targetPort }}"
  {{- end }}
  operator-api-serve-addr: "127.0.0.1:9234"
  cni-exclusive: "true"
  cni-log-file: "/var/run/cilium/cilium-cni.log"
  debug: "false"
