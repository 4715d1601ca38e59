"""Talos' shared layer-2 VIP, as far as the lab needs it: which control plane holds the address.

Talos gives a control-plane VIP to one node at a time. Each control plane whose machine config names the
address on a link runs an operator that campaigns for it in an etcd election, and the elected node alone
adds the address to its link (announced with gratuitous ARP). The lab has no links and no ARP: it answers
the Kubernetes API on the VIP exactly while a control plane holds it (lab/k8s/lab.py), so a cluster whose
configs carry no VIP has no API on its endpoint, as on real hardware.

What is imitated, siderolabs/talos v1.13.9 (the same lines at v1.12.11):

- where a VIP comes from: the Layer2VIPConfig document (pkg/machinery/config/types/network/layer2_vip.go:53-72,
  name = the address, link required :109-117) and the legacy `machine.network.interfaces[].vip.ip`, also on
  the interface's VLANs (internal/app/machined/pkg/controllers/network/operator_vip_config.go:118-158);
- who may campaign: a node whose etcd service is running and healthy and whose kubelet lifecycle exists
  (internal/app/machined/pkg/controllers/network/operator/vip.go:154-189, waitForPreconditions) - in the
  lab, a configured control plane with a healthy etcd, up; its campaign then lasts while etcd runs, healthy
  or not (operator/vip.go:281-310);
- who wins: the etcd election is a FIFO queue ordered by the campaign key's create revision
  (operator/vip.go:226-264): the first node to campaign holds the address until its campaign ends (etcd
  stopped, the node shutting down: operator/vip.go:281-310), then the next in the queue takes it;
- only the leader has the address (operator/vip.go:96-124, AddressSpecs returns nothing otherwise).

HCloudVIPConfig and the Equinix Metal VIP are not layer 2 (the provider's API moves the address): they
are not modelled.
"""

LAYER2_VIP_KIND = 'Layer2VIPConfig'


def layer2_vips(config):
    """The addresses `config` (lab.talos.machineconfig.MachineConfig or None) shares as layer-2 VIPs."""
    if config is None:
        return set()
    found = set()
    # operator_vip_config.go:150-158: the new-style documents (a Layer2VIPConfig always names its link)
    for document in config.documents:
        if document.get('kind') == LAYER2_VIP_KIND and document.get('name') and document.get('link'):
            found.add(str(document['name']))
    # operator_vip_config.go:118-148: the legacy form, on an interface or one of its VLANs
    network = config.machine.get('network') if isinstance(config.machine, dict) else None
    interfaces = (network or {}).get('interfaces') if isinstance(network, dict) else None
    for interface in interfaces or []:
        if not isinstance(interface, dict) or interface.get('ignore'):
            continue
        for holder in [interface] + [vlan for vlan in interface.get('vlans') or [] if isinstance(vlan, dict)]:
            vip = holder.get('vip')
            if isinstance(vip, dict) and vip.get('ip'):
                found.add(str(vip['ip']))
    return found


def can_campaign(node):
    """operator/vip.go:154-189: etcd running and healthy on a configured control plane that is up (to join)."""
    if node is None or not node.control_plane or getattr(node, 'phase', 'running') != 'running':
        return False
    etcd = node.service('etcd')
    return etcd is not None and etcd.is_healthy


def still_campaigning(node):
    """operator/vip.go:281-310: a campaign, once joined, ends only when etcd stops or the node goes down - an etcd
    that turns unhealthy while it runs (a slow disk) keeps its place in the queue, and the leader keeps the VIP."""
    if node is None or not node.control_plane or getattr(node, 'phase', 'running') != 'running':
        return False
    etcd = node.service('etcd')
    return etcd is not None and getattr(etcd, 'state', None) == 'Running'


class Election(object):
    """One VIP's election among the control planes of one cluster (etcd key talos:vip:election:<address>)."""

    def __init__(self, address):
        self.address = address
        self.queue = []     # node keys in campaign order (the create revision of their election keys)

    @property
    def leader(self):
        return self.queue[0] if self.queue else None

    def campaigning(self, key, node):
        """Whether the node campaigns now: it joins with a healthy etcd, and stays while its etcd runs."""
        return still_campaigning(node) if key in self.queue else can_campaign(node)

    def update(self, candidates):
        """candidates: {node key: True if that node campaigns now}. Returns the leader's key or None.

        A node that stops campaigning leaves the queue (its session lease revoked, operator/vip.go:226-238);
        a node that starts campaigning joins at its end; the head of the queue is the leader.
        """
        self.queue = [key for key in self.queue if candidates.get(key)]
        for key, campaigning in candidates.items():
            if campaigning and key not in self.queue:
                self.queue.append(key)
        return self.leader

    def status(self, nodes):
        """{'address', 'holder'} for `lab status`: the VIP and the name of the control plane that holds it (None:
        nobody). nodes: the lab's Talos nodes by key."""
        leader = nodes.get(self.leader) if self.leader is not None else None
        return {'address': self.address, 'holder': leader.name if leader is not None else None}
