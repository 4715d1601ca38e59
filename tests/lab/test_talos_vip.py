"""lab/talos/vip.py: where a node's config puts a layer-2 VIP, who may campaign, and the election's FIFO order."""

from lab.talos import vip as talos_vip
from lab.talos.machineconfig import MachineConfig


def _config(*documents, machine=None):
    v1alpha1 = {'version': 'v1alpha1', 'machine': dict({'type': 'controlplane'}, **(machine or {})), 'cluster': {}}
    return MachineConfig([v1alpha1] + list(documents))


def test_vips_from_the_document_and_from_the_legacy_interfaces_and_vlans():
    assert talos_vip.layer2_vips(None) == set()
    assert talos_vip.layer2_vips(_config()) == set()
    assert talos_vip.layer2_vips(_config({'apiVersion': 'v1alpha1', 'kind': 'Layer2VIPConfig', 'name': '10.0.0.10',
                                          'link': 'ens18'})) == {'10.0.0.10'}
    # a document without its link is not a VIP Talos would run (layer2_vip.go: link must be specified)
    assert talos_vip.layer2_vips(_config({'apiVersion': 'v1alpha1', 'kind': 'Layer2VIPConfig', 'name': '10.0.0.10'})) == set()
    legacy = {'network': {'interfaces': [
        {'interface': 'ens18', 'vip': {'ip': '10.0.0.10'}, 'vlans': [{'vlanId': 20, 'vip': {'ip': '10.20.0.10'}}]},
        {'interface': 'ens19', 'ignore': True, 'vip': {'ip': '10.9.9.9'}}]}}
    assert talos_vip.layer2_vips(_config(machine=legacy)) == {'10.0.0.10', '10.20.0.10'}


class _Service(object):
    def __init__(self, healthy, state='Running'):
        self.is_healthy = healthy
        self.state = state


class _Node(object):
    def __init__(self, control_plane=True, etcd=True, phase='running', etcd_state='Running'):
        self.control_plane = control_plane
        self.phase = phase
        self._etcd = None if etcd is None else _Service(etcd, etcd_state)

    def service(self, name):
        assert name == 'etcd'
        return self._etcd


def test_only_an_up_control_plane_with_a_healthy_etcd_campaigns():
    assert talos_vip.can_campaign(_Node())
    assert not talos_vip.can_campaign(None)
    assert not talos_vip.can_campaign(_Node(control_plane=False))
    assert not talos_vip.can_campaign(_Node(etcd=False))
    assert not talos_vip.can_campaign(_Node(etcd=None))
    assert not talos_vip.can_campaign(_Node(phase='rebooting'))


def test_the_first_to_campaign_holds_the_vip_until_it_stops_then_the_next_in_the_queue():
    election = talos_vip.Election('10.0.0.10')
    assert election.update({'cp-1': False, 'cp-2': False}) is None
    assert election.update({'cp-1': False, 'cp-2': True}) == 'cp-2'
    assert election.update({'cp-1': True, 'cp-2': True}) == 'cp-2'      # a later campaigner queues behind the leader
    assert election.update({'cp-1': True, 'cp-2': False}) == 'cp-1'     # the leader's campaign ended: the next one
    assert election.update({'cp-1': True, 'cp-2': True}) == 'cp-1'      # cp-2 back: at the end of the queue
    assert election.update({'cp-2': True}) == 'cp-2'                    # a node gone from the fleet leaves the queue


def test_a_campaign_joins_with_a_healthy_etcd_and_lasts_while_etcd_runs():
    election = talos_vip.Election('10.0.0.10')
    unhealthy = _Node(etcd=False)
    assert not election.campaigning('cp-1', unhealthy)                  # an unhealthy etcd does not join
    assert election.update({'cp-1': election.campaigning('cp-1', _Node())}) == 'cp-1'
    assert election.campaigning('cp-1', unhealthy)                      # the leader's etcd turns unhealthy: it stays
    assert not election.campaigning('cp-1', _Node(etcd_state='Finished'))   # etcd stopped: the campaign ends
    assert not election.campaigning('cp-1', _Node(phase='rebooting'))
