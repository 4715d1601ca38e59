"""_multicluster: the cross-cluster checks on plain values (the fixture inventories are in tests/integration)."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _multicluster
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError


def cluster(name, cid, pod, svc, **extra):
    values = {'name': name, 'inventory': 'inventories/%s' % name, 'id': cid, 'pod_cidr': pod, 'service_cidr': svc}
    values.update(extra)
    return values


INFRA = cluster('infra', 1, '10.100.0.0/16', '10.101.0.0/16', lb_pools=['10.20.0.192/28'])
APPS = cluster('apps', 2, '10.110.0.0/16', '10.111.0.0/16', lb_pools=[{'name': 'apps', 'blocks': [{'start': '10.30.0.200', 'stop': '10.30.0.231'}]}])


def problems_of(*clusters):
    return _multicluster.check(list(clusters))[1]


def test_distinct_clusters_have_no_problem():
    assert problems_of(INFRA, APPS) == []


def test_duplicate_name_and_id_name_both_sides():
    problems = problems_of(INFRA, dict(APPS, name='infra', id='1'))
    assert [(p['check'], p['value'], p['conflict']) for p in problems] == [('name', 'infra', 'infra'), ('id', 1, 1)]
    assert 'cluster_id 1 is also the id of cluster infra (inventories/infra)' in problems[1]['message']


@pytest.mark.parametrize('value, text', [
    (0, 'outside 1-255'), (256, 'outside 1-255'), ('one', 'is not an integer'), (True, 'is not an integer'),
    (None, 'is not set'),
])
def test_cluster_id_range(value, text):
    problems = problems_of(dict(INFRA, id=value))
    assert [p['check'] for p in problems] == ['id']
    assert text in problems[0]['message']


def test_cluster_name_form():
    problems = problems_of(dict(INFRA, name='Infra_1'))
    assert problems[0]['check'] == 'name' and 'not a Cilium cluster name' in problems[0]['message']
    assert problems_of(dict(INFRA, name='a' * 33))[0]['check'] == 'name'


def test_service_cidr_overlapping_the_other_clusters_pod_cidr():
    problems = problems_of(INFRA, dict(APPS, service_cidr='10.100.64.0/18'))
    assert [(p['cluster'], p['field'], p['value'], p['conflict']) for p in problems] == [
        ('apps', 'cluster_service_cidr', '10.100.64.0/18', '10.100.0.0/16')]


def test_own_pod_and_service_cidr_overlap_and_host_bits():
    problems = problems_of(dict(INFRA, service_cidr='10.100.128.0/17'))
    assert 'overlaps its own cluster_pod_cidr' in problems[0]['message']
    problems = problems_of(dict(INFRA, pod_cidr='10.100.0.1/16'))
    assert problems[0]['field'] == 'cluster_pod_cidr' and 'has host bits set' in problems[0]['message']


def test_native_routing():
    assert problems_of(dict(INFRA, cilium_values={'routingMode': 'native', 'ipv4NativeRoutingCIDR': '10.100.0.0/16'})) == []
    missing = problems_of(dict(INFRA, cilium_values={'routingMode': 'native'}))
    assert missing[0]['check'] == 'native_routing' and 'is not set' in missing[0]['message']
    legacy = problems_of(dict(INFRA, cilium_values={'tunnel': 'disabled'}))
    assert legacy[0]['check'] == 'native_routing'
    # tunnel mode needs no native routing CIDR
    assert problems_of(dict(INFRA, cilium_values={'routingMode': 'tunnel'})) == []


def test_cilium_values_must_agree_with_cluster_id_and_name():
    problems = problems_of(dict(INFRA, cilium_values={'cluster': {'id': 9, 'name': 'other'}}))
    assert sorted((p['field'], p['value']) for p in problems) == [('cilium_values.cluster.id', 9), ('cilium_values.cluster.name', 'other')]


def test_lb_pools_overlapping_across_clusters_and_within_one():
    problems = problems_of(INFRA, dict(APPS, lb_pools=['10.20.0.200-10.20.0.210']))
    assert [(p['cluster'], p['check'], p['value'], p['conflict']) for p in problems] == [
        ('apps', 'lb_pool', '10.20.0.200-10.20.0.210', '10.20.0.192/28')]
    within = problems_of(dict(INFRA, lb_pools=['10.20.0.192/28', {'name': 'second', 'blocks': ['10.20.0.200/29']}]))
    assert 'of the same cluster' in within[0]['message']
    # a disabled pool takes no addresses
    assert problems_of(INFRA, dict(APPS, lb_pools=[{'name': 'old', 'disabled': True, 'blocks': ['10.20.0.192/28']}])) == []


def test_pool_cidr_with_host_bits_names_the_real_network():
    problems = problems_of(dict(INFRA, lb_pools=['10.20.0.200/28']))
    assert [(p['check'], p['value'], p['conflict']) for p in problems] == [('lb_pool', '10.20.0.200/28', '10.20.0.192/28')]
    assert '10.20.0.192-10.20.0.207' in problems[0]['message']


def test_requested_ips_and_service_selectors():
    pool = {'name': 'web-only', 'blocks': [{'cidr': '10.30.0.0/24'}],
            'service_selector': {'matchLabels': {'io.kubernetes.service.namespace': 'web'}}}
    inside = dict(APPS, lb_pools=[pool], lb_ips=[{'service': 'web/front', 'ips': '10.30.0.5, 10.30.0.6'}])
    assert problems_of(inside) == []
    wrong_namespace = dict(APPS, lb_pools=[pool], lb_ips=[{'service': 'db/pg', 'ips': ['10.30.0.7']}])
    problems = problems_of(wrong_namespace)
    assert problems[0]['check'] == 'lb_ip' and 'serviceSelector does not select' in problems[0]['message']
    outside = problems_of(dict(APPS, lb_ips=[{'service': 'web/front', 'ips': ['10.30.1.1']}]))
    assert outside[0]['value'] == '10.30.1.1' and 'apps 10.30.0.200-10.30.0.231' in outside[0]['conflict']
    none_declared = problems_of(dict(INFRA, lb_pools=[], lb_ips=[{'service': 'a/b', 'ips': ['10.0.0.1']}]))
    assert 'no pool is declared' in none_declared[0]['message']


def test_pool_overlapping_the_clusters_own_cidrs():
    problems = problems_of(dict(INFRA, lb_pools=['10.101.255.0/24']))
    assert 'overlaps its own cluster_service_cidr 10.101.0.0/16' in problems[0]['message']


@pytest.mark.parametrize('clusters, field', [
    ([], 'clusters'),
    (['not a dict'], 'clusters[0]'),
    ([dict(INFRA, lb_pools=[{'blocks': [{'start': '10.0.0.9', 'stop': '10.0.0.1'}]}])], 'clusters[0].lb_pools[0]'),
    ([dict(INFRA, lb_ips=[{'service': 'a/b', 'ips': ['10.0.0.300']}])], 'clusters[0].lb_ips[0]'),
    ([dict(INFRA, cilium_values='routingMode: native')], 'clusters[0].cilium_values'),
])
def test_bad_shapes_name_the_field(clusters, field):
    with pytest.raises(ValidationError) as error:
        _multicluster.check(clusters)
    assert error.value.field == field


def test_manifests(tmp_path):
    (tmp_path / 'pool.yaml').write_text(
        '---\napiVersion: cilium.io/v2\nkind: CiliumLoadBalancerIPPool\nmetadata: {name: legacy}\nspec:\n  cidrs: [{cidr: 10.30.0.0/28}]\n')
    (tmp_path / 'svc.yaml').write_text(
        '---\napiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: n}\nspec: {type: LoadBalancer, loadBalancerIP: 10.30.0.99}\n')
    (tmp_path / 'chart-template.yaml').write_text('{{ if .Values.x }}\nkind: [\n')
    pools, requests = _multicluster.from_manifests([str(tmp_path)])
    assert [(pool['name'], pool['blocks']) for pool in pools] == [('legacy', [{'cidr': '10.30.0.0/28'}])]
    assert [(request['service'], request['ips']) for request in requests] == [('n/s', '10.30.0.99')]
    problems = problems_of(dict(APPS, lb_pools=[], manifest_paths=[str(tmp_path)]))
    assert problems[0]['value'] == '10.30.0.99' and str(tmp_path / 'svc.yaml') in problems[0]['message']
    with pytest.raises(ValidationError):
        _multicluster.from_manifests([str(tmp_path / 'missing')])
