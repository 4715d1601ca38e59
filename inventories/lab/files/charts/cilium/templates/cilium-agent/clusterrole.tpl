apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: cilium
  labels:
    app.kubernetes.io/part-of: cilium
rules:
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [namespaces, services, pods, endpoints, nodes]
  verbs: [get, list, watch]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch, get]
- apiGroups: [cilium.io]
  resources:
  - ciliumloadbalancerippools
  - ciliumbgppeeringpolicies
  - ciliumclusterwidenetworkpolicies
  - ciliumendpoints
  - ciliumidentities
  - ciliumnetworkpolicies
  - ciliumnodes
  - ciliumnodeconfigs
  verbs: [list, watch]
- apiGroups: [cilium.io]
  resources: [ciliumidentities, ciliumendpoints, ciliumnodes]
  verbs: [create]
- apiGroups: [cilium.io]
  resources: [ciliumendpoints]
  verbs: [delete, get]
- apiGroups: [cilium.io]
  resources: [ciliumnodes, ciliumnodes/status]
  verbs: [get, update]
- apiGroups: [cilium.io]
  resources: [ciliumendpoints/status, ciliumendpoints]
  verbs: [patch]
