"""The lab's pure parts: addresses, DHCP, timing, the fault registry, the inventory."""
import asyncio
import os

import pytest
import yaml

from lab import inventory
from lab.addresses import DhcpServer, Net, agent_enabled, nic_mac, parse_ipconfig
from lab.faults import FaultError, FaultRegistry, Param
from lab.timing import Timing


# ------------------------------------------------------------------------------ addresses

def test_net_gives_the_documented_addresses():
    net = Net('127.0.10')
    assert (net.gateway, net.pve_host, net.endpoint_host) == ('127.0.10.1', '127.0.10.2', '127.0.10.10')
    assert net.static_host(1) == '127.0.10.11'
    assert net.static_host(89) == '127.0.10.99'
    with pytest.raises(ValueError, match='static addresses'):
        net.static_host(90)


@pytest.mark.parametrize('text, reason', [
    ('127.0', 'three octets'), ('127.0.300', 'three octets'), ('10.0.10', 'loopback'), ('a.b.c', 'three octets'),
])
def test_net_refuses_bad_values_and_says_why(text, reason):
    with pytest.raises(ValueError, match=reason):
        Net(text)


def test_parse_ipconfig():
    static = parse_ipconfig('ip=127.0.10.11/24,gw=127.0.10.1')
    assert (static.address, static.prefix, static.gateway, static.static) == ('127.0.10.11', 24, '127.0.10.1', True)
    assert parse_ipconfig('ip=dhcp').static is False
    assert parse_ipconfig(None) is None
    with pytest.raises(ValueError, match='no prefix'):
        parse_ipconfig('ip=127.0.10.11')
    with pytest.raises(ValueError, match='not an IPv4 address'):
        parse_ipconfig('ip=nonsense/24')


def test_nic_mac_reads_both_pve_formats():
    assert nic_mac({'net0': 'virtio=BC:24:11:00:00:01,bridge=vmbr0'}) == 'bc:24:11:00:00:01'
    assert nic_mac({'net0': 'model=virtio,macaddr=BC:24:11:00:00:02,bridge=vmbr0'}) == 'bc:24:11:00:00:02'
    assert nic_mac({'net0': 'virtio,bridge=vmbr0'}) is None
    assert nic_mac({}) is None


@pytest.mark.parametrize('value, enabled', [
    ('1', True), ('enabled=1', True), ('1,fstrim_cloned_disks=1', True), ('enabled=1,type=virtio', True),
    ('0', False), ('enabled=0', False), (None, False), ('', False),
])
def test_agent_enabled(value, enabled):
    assert agent_enabled({'agent': value} if value is not None else {}) is enabled


def test_dhcp_keeps_leases_and_skips_taken_addresses():
    dhcp = DhcpServer(Net('127.0.10'))
    assert dhcp.lease('aa') == '127.0.10.100'
    assert dhcp.lease('bb', taken={'127.0.10.101'}) == '127.0.10.102'
    assert dhcp.lease('aa') == '127.0.10.100'
    assert dhcp.release('aa') == '127.0.10.100'
    assert dhcp.lease('cc') == '127.0.10.100'
    # A returning MAC gets its old address back when it is free again.
    dhcp.release('bb')
    assert dhcp.lease('bb') == '127.0.10.102'


def test_dhcp_pool_runs_out():
    dhcp = DhcpServer(Net('127.0.10'), first=100, last=101)
    assert dhcp.lease('a') and dhcp.lease('b')
    assert dhcp.lease('c') is None


# ------------------------------------------------------------------------------ timing

def test_instant_profile_imposes_nothing_and_realistic_scales():
    assert Timing('instant', 1.0).seconds('vm_boot') == 0.0
    realistic = Timing('realistic', 0.5)
    assert realistic.nominal('vm_boot') == 20.0
    assert realistic.seconds('vm_boot') == 10.0
    assert realistic.pve_time_scale == 0.5
    assert Timing('instant', 0.5).pve_time_scale == 0.0


def test_ranges_are_drawn_from_the_seed():
    first, again = (Timing('realistic', 1.0, seed=7), Timing('realistic', 1.0, seed=7))
    first = [first.nominal('image_pull') for count in range(3)]
    again = [again.nominal('image_pull') for count in range(3)]
    assert first == again
    assert all(10.0 <= value <= 30.0 for value in first)


def test_unknown_kind_and_bad_values_are_refused():
    timing = Timing()
    with pytest.raises(KeyError, match='unknown delay kind'):
        timing.nominal('coffee_break')
    with pytest.raises(ValueError, match='profile'):
        Timing('slow')
    with pytest.raises(ValueError, match='time scale'):
        Timing('realistic', -1)
    with pytest.raises(ValueError, match='range'):
        timing.register('x', (5, 1))


def test_sleep_records_the_delay():
    timing = Timing('realistic', 0.0)
    timing.register('flux_reconcile', 12, 'a Flux reconcile')
    record = asyncio.run(timing.sleep('flux_reconcile', 'apps'))
    assert record['kind'] == 'flux_reconcile' and record['target'] == 'apps'
    assert record['nominal'] == 12.0 and record['planned'] == 0.0 and record['outcome'] == 'done'
    assert timing.query(kind='flux_reconcile') == [record]


def test_cancelled_sleep_is_recorded_as_cancelled():
    timing = Timing('realistic', 10.0)

    async def scenario():
        task = asyncio.ensure_future(timing.sleep('vm_boot', 'vm1'))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(scenario())
    assert timing.query()[0]['outcome'] == 'cancelled'


# ------------------------------------------------------------------------------ faults

def make_registry():
    registry = FaultRegistry()
    applied, cleared = [], []

    def apply(target, times=None, hard=False):
        if target == 'missing':
            raise FaultError('no such thing')
        applied.append((target, times, hard))
        return {'target': target}

    async def clear(target):
        cleared.append(target)
    registry.register('thing-broken', 'a thing breaks', 'thing', apply, clear,
                      params=[Param('times', int, None), Param('hard', bool, False)])
    registry.register('all-broken', 'everything breaks', None, apply, clear)
    return registry, applied, cleared


def test_fault_apply_converts_params_and_clear_undoes():
    registry, applied, cleared = make_registry()
    record = asyncio.run(registry.apply('thing-broken', 'a', {'times': '3', 'hard': 'yes'}))
    assert applied == [('a', 3, True)]
    assert record['params'] == {'times': 3, 'hard': True}
    assert registry.is_active('thing-broken', 'a')
    assert [r['target'] for r in asyncio.run(registry.clear('thing-broken'))] == ['a']
    assert cleared == ['a'] and not registry.active


@pytest.mark.parametrize('name, target, params, message', [
    ('nope', None, {}, "unknown fault 'nope'; known faults: all-broken, thing-broken"),
    ('thing-broken', None, {}, 'needs a target'),
    ('all-broken', 'x', {}, 'takes no target'),
    ('thing-broken', 'a', {'tims': '1'}, 'has no parameter tims; it takes: hard, times'),
    ('thing-broken', 'a', {'times': 'many'}, "parameter times must be an integer, got 'many'"),
    ('thing-broken', 'a', {'hard': 'maybe'}, 'parameter hard must be a boolean'),
    ('thing-broken', 'missing', {}, 'no such thing'),
])
def test_fault_errors_name_the_field(name, target, params, message):
    registry, applied, cleared = make_registry()
    with pytest.raises(FaultError, match=message):
        asyncio.run(registry.apply(name, target, params))
    assert not applied and not registry.active and not cleared


def test_expired_fault_leaves_the_active_list():
    registry, applied, cleared = make_registry()
    asyncio.run(registry.apply('all-broken'))
    assert applied == [(None, None, False)]
    assert registry.expire('all-broken') is not None
    assert asyncio.run(registry.clear()) == [] and cleared == []


# ------------------------------------------------------------------------------ inventory

def test_inventory_has_the_contract_shape():
    text = inventory.render(Net('127.0.10'), '/r/lab/run', 3, 3, ['pve1'])
    assert text.startswith('# Written by `python -m lab up` (3 control planes, 3 workers, net 127.0.10). Do not edit.')
    data = yaml.safe_load(text)
    cps = data['cluster']['children']['controlplane']['hosts']
    workers = data['cluster']['children']['worker']['hosts']
    assert cps['lab-cp-1'] == {'vm_id': 1011, 'vm_pve_node': 'pve1', 'node_ip': '127.0.10.11', 'node_prefix': 24,
                               'node_gateway': '127.0.10.1'}
    assert sorted(cps) == ['lab-cp-1', 'lab-cp-2', 'lab-cp-3']
    assert workers['lab-w-3'] == {'vm_id': 1023, 'vm_pve_node': 'pve1'}
    assert data['cluster']['vars'] == {
        'lab_net': '127.0.10', 'lab_run_dir': '/r/lab/run', 'pve_api_host': '127.0.10.2', 'pve_api_port': 8006,
        'pve_api_user': 'proxtalos@pve', 'pve_api_token_id': 'proxtalos',
        'pve_api_token_secret': "{{ lookup('ansible.builtin.file', '/r/lab/run/pve-token') }}",
        'pve_ca_path': '/r/lab/run/pve-ca.pem', 'cluster_endpoint_host': '127.0.10.10'}


def test_large_labs_keep_vm_ids_unique_and_spread_pve_nodes():
    nodes = inventory.plan_nodes(Net('127.0.10'), 11, 40, ['pve1', 'pve2'])
    ids = [n['vm_id'] for n in nodes]
    assert len(set(ids)) == len(ids) == 51
    assert ids[:10] == list(range(1011, 1020)) + [1110]
    assert [n['vm_id'] for n in nodes if n['group'] == 'worker'][8:11] == [1029, 2010, 2011]
    assert {n['vm_pve_node'] for n in nodes} == {'pve1', 'pve2'}


@pytest.mark.parametrize('cps, workers, message', [(0, 1, 'control_planes must be 1-89'), (90, 1, 'control_planes'),
                                                   (1, 156, 'workers must be 0-155')])
def test_inventory_limits(cps, workers, message):
    with pytest.raises(ValueError, match=message):
        inventory.plan_nodes(Net('127.0.10'), cps, workers, ['pve1'])


def test_repo_inventory_is_written_only_for_the_default_run_dir(tmp_path):
    from lab import DEFAULT_RUN_DIR
    from lab.world import LabOptions
    assert LabOptions().writes_repo_inventory is True
    assert LabOptions(run_dir=DEFAULT_RUN_DIR + '/').writes_repo_inventory is True
    assert LabOptions(run_dir=str(tmp_path)).writes_repo_inventory is False
    assert LabOptions(run_dir=str(tmp_path), repo_inventory=True).writes_repo_inventory is True


# ---- which Kubernetes a lab runs: --kubernetes, else $PROXTALOS_LAB_KUBERNETES, else upstream -------------------------

LAB_SET = ('lab.talos', 'lab.k8s', 'lab.flux')
UPSTREAM_SET = ('lab.talos', 'lab.k8s_upstream', 'lab.flux_upstream')
UPSTREAM_KUBERNETES_SET = ('lab.talos', 'lab.k8s_upstream', 'lab.flux_sources')


def _up_options(argv, monkeypatch, env=None, flux_env=None):
    from lab import cli  # pylint: disable=import-outside-toplevel
    monkeypatch.delenv('PROXTALOS_LAB_KUBERNETES', raising=False)
    monkeypatch.delenv('PROXTALOS_LAB_FLUX', raising=False)
    if env is not None:
        monkeypatch.setenv('PROXTALOS_LAB_KUBERNETES', env)
    if flux_env is not None:
        monkeypatch.setenv('PROXTALOS_LAB_FLUX', flux_env)
    return cli.options_from(cli.build_parser().parse_args(['up'] + argv))


def test_the_default_world_is_upstream_kubernetes_with_upstream_flux(monkeypatch):
    from lab.world import LabOptions, flux_world, kubernetes_world  # pylint: disable=import-outside-toplevel
    assert _up_options([], monkeypatch).extensions == UPSTREAM_SET
    assert LabOptions().extensions == UPSTREAM_SET
    assert kubernetes_world(environ={}) == 'upstream'
    assert flux_world(environ={}) == 'upstream'
    # Flux follows the Kubernetes the same environment chooses when the caller names none
    assert flux_world(environ={'PROXTALOS_LAB_KUBERNETES': 'lab'}) == 'lab'


def test_the_kubernetes_switch_selects_the_retiring_lab_world(monkeypatch):
    assert _up_options(['--kubernetes', 'lab'], monkeypatch).extensions == LAB_SET
    assert _up_options([], monkeypatch, env='lab').extensions == LAB_SET
    assert _up_options(['--kubernetes', 'lab', '--flux', 'lab'], monkeypatch).extensions == LAB_SET
    # the option wins over the variable; given extensions get the chosen Kubernetes in place of the other
    assert _up_options(['--kubernetes', 'upstream'], monkeypatch, env='lab').extensions == UPSTREAM_SET
    assert _up_options(['--extensions', 'talos,k8s'], monkeypatch).extensions == ('lab.talos', 'lab.k8s_upstream')
    assert _up_options(['--extensions', 'talos,k8s_upstream'], monkeypatch, env='lab').extensions == ('lab.talos', 'lab.k8s')
    with pytest.raises(ValueError, match="PROXTALOS_LAB_KUBERNETES must be one of lab, upstream, got 'k3s'"):
        _up_options([], monkeypatch, env='k3s')


def test_the_flux_switch_selects_the_simulation_or_upstream_controllers_on_upstream_kubernetes_only(monkeypatch):
    assert _up_options(['--kubernetes', 'upstream', '--flux', 'upstream'], monkeypatch).extensions == UPSTREAM_SET
    assert _up_options([], monkeypatch, env='upstream', flux_env='upstream').extensions == UPSTREAM_SET
    # the option wins over the variable; lab Flux on upstream Kubernetes is the Git server and mirror only (lab.flux_sources)
    assert _up_options(['--flux', 'lab'], monkeypatch, env='upstream', flux_env='upstream').extensions == UPSTREAM_KUBERNETES_SET
    assert _up_options([], monkeypatch, flux_env='lab').extensions == UPSTREAM_KUBERNETES_SET
    with pytest.raises(ValueError, match='--flux upstream needs upstream Kubernetes'):
        _up_options(['--kubernetes', 'lab', '--flux', 'upstream'], monkeypatch)
    with pytest.raises(ValueError, match='PROXTALOS_LAB_FLUX upstream needs upstream Kubernetes'):
        _up_options(['--kubernetes', 'lab'], monkeypatch, flux_env='upstream')
    with pytest.raises(ValueError, match="PROXTALOS_LAB_FLUX must be one of lab, upstream, got 'argo'"):
        _up_options([], monkeypatch, flux_env='argo')


def test_a_lab_on_upstream_kubernetes_names_the_upstream_cilium_chart_in_its_inventory():
    import types  # pylint: disable=import-outside-toplevel
    from lab import upstream  # pylint: disable=import-outside-toplevel
    from lab.world import World  # pylint: disable=import-outside-toplevel

    def lab_vars(extensions, extra=None):
        return World._inventory_vars(types.SimpleNamespace(options=types.SimpleNamespace(extensions=extensions),  # pylint: disable=protected-access
                                                           run_dir='/r/lab/run', _inventory_extra=extra or {}))
    assert lab_vars(('lab.talos', 'lab.k8s', 'lab.flux')) == {}
    # what an extension adds (lab.flux_upstream: its Git server) comes with them
    assert lab_vars(('lab.talos', 'lab.k8s', 'lab.flux'), {'lab_git_push': True}) == {'lab_git_push': True}
    wanted = {'lab_cilium_chart': upstream.chart('cilium-chart'), 'lab_cilium_manifest': '/r/lab/run/cilium-manifest.yaml'}
    assert lab_vars(('lab.talos', 'lab.k8s_upstream', 'lab.flux_sources')) == wanted
    text = inventory.render(Net('127.0.10'), '/r/lab/run', 1, 0, ['pve1'], extra_vars=wanted)
    assert {k: v for k, v in yaml.safe_load(text)['cluster']['vars'].items() if k in wanted} == wanted
    # inventories/lab/group_vars/all/cni.yml takes them over its stand-in chart and manifest
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           'inventories', 'lab', 'group_vars', 'all', 'cni.yml'), encoding='utf-8') as handle:
        cni = yaml.safe_load(handle)
    assert cni['cni_helm_chart_ref'].startswith('{{ lab_cilium_chart | default(')
    assert cni['cni_cilium_manifest'].startswith('{{ lab_cilium_manifest | default(')


def test_a_lab_on_upstream_kubernetes_without_the_fetched_chart_refuses_to_start_naming_it(tmp_path, monkeypatch):
    import types  # pylint: disable=import-outside-toplevel
    from lab.world import LabError, World  # pylint: disable=import-outside-toplevel
    monkeypatch.setenv('PROXTALOS_CACHE', str(tmp_path / 'empty-cache'))
    fake = types.SimpleNamespace(options=types.SimpleNamespace(extensions=('lab.talos', 'lab.k8s_upstream')), run_dir=str(tmp_path))
    with pytest.raises(LabError, match=r'--kubernetes upstream: chart cilium-chart 1.18.2 is not fetched .* run `make setup`'):
        World._inventory_vars(fake)  # pylint: disable=protected-access
