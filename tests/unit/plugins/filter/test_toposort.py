"""The needs toposort filter: order, tiers, and errors that name the releases."""
import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.proxtalos.cluster.plugins.filter import toposort as topo


def rel(name, namespace=None, needs=None, **extra):
    release = {'name': name}
    if namespace:
        release['namespace'] = namespace
    if needs is not None:
        release['needs'] = needs
    release.update(extra)
    return release


# cluster-template's bootstrap apps, listed out of order on purpose
CLUSTER_TEMPLATE = [
    rel('flux-instance', 'flux-system', ['flux-system/flux-operator']),
    rel('coredns', 'kube-system', ['kube-system/cilium']),
    rel('cert-manager', 'cert-manager', ['kube-system/spegel']),
    rel('cilium', 'kube-system'),
    rel('flux-operator', 'flux-system', ['cert-manager/cert-manager']),
    rel('spegel', 'kube-system', ['kube-system/coredns']),
]


def names(releases):
    return [topo.release_id(r) for r in releases]


def test_order_follows_needs():
    assert names(topo.toposort(CLUSTER_TEMPLATE)) == [
        'kube-system/cilium', 'kube-system/coredns', 'kube-system/spegel', 'cert-manager/cert-manager',
        'flux-system/flux-operator', 'flux-system/flux-instance']


def test_result_items_are_the_input_dicts():
    ordered = topo.toposort(CLUSTER_TEMPLATE)
    assert all(any(item is original for original in CLUSTER_TEMPLATE) for item in ordered)


def test_tiers_group_independent_releases_in_input_order():
    releases = [
        rel('csi', 'csi-proxmox', ['kube-system/cilium']),
        rel('cilium', 'kube-system'),
        rel('ccm', 'kube-system', ['kube-system/cilium']),
        rel('sealed-secrets', 'kube-system'),
        rel('flux', 'flux-system', ['csi-proxmox/csi', 'kube-system/ccm', 'kube-system/sealed-secrets']),
    ]
    assert [names(tier) for tier in topo.toposort_tiers(releases)] == [
        ['kube-system/cilium', 'kube-system/sealed-secrets'],
        ['csi-proxmox/csi', 'kube-system/ccm'],
        ['flux-system/flux']]


def test_releases_without_namespace_and_with_context():
    releases = [rel('b', needs=['a']), rel('a'), rel('c', 'ns', ['prod/ns/d']), rel('d', 'ns', kubeContext='prod')]
    assert names(topo.toposort(releases)) == ['a', 'prod/ns/d', 'b', 'ns/c']


def test_empty_and_single():
    assert topo.toposort([]) == [] and topo.toposort_tiers([]) == []
    assert topo.toposort_tiers([rel('a')]) == [[rel('a')]]


def test_duplicate_needs_are_harmless():
    assert names(topo.toposort([rel('b', needs=['a', 'a']), rel('a')])) == ['a', 'b']


def test_custom_needs_key():
    releases = [rel('b', after=['a']), rel('a')]
    assert names(topo.toposort(releases, needs_key='after')) == ['a', 'b']


def test_unknown_needs_are_all_named_with_a_suggestion():
    releases = [rel('coredns', 'kube-system', ['cilium']), rel('cilium', 'kube-system'),
                rel('flux', 'flux-system', ['flux-system/nope'])]
    with pytest.raises(AnsibleFilterError) as caught:
        topo.toposort(releases)
    assert str(caught.value) == (
        'toposort: unknown needs: kube-system/coredns needs cilium, which is not a release '
        '(did you mean kube-system/cilium?); flux-system/flux needs flux-system/nope, which is not a release')


def test_cycle_names_its_members():
    releases = [rel('cilium', 'kube-system'), rel('a', 'x', ['x/b']), rel('b', 'x', ['x/c']), rel('c', 'x', ['x/a']),
                rel('d', 'x', ['x/a'])]
    with pytest.raises(AnsibleFilterError) as caught:
        topo.toposort(releases)
    assert str(caught.value) == 'toposort: needs form a cycle: x/a -> x/b -> x/c -> x/a; waiting behind it: x/d'


def test_self_need_and_two_separate_cycles():
    releases = [rel('a', needs=['a']), rel('b', needs=['c']), rel('c', needs=['b'])]
    with pytest.raises(AnsibleFilterError) as caught:
        topo.toposort_tiers(releases)
    message = str(caught.value)
    assert message.startswith('toposort: needs form a cycle: ')
    assert 'a -> a' in message and 'b -> c -> b' in message


def test_component_larger_than_the_loop_lists_everyone_caught():
    # b and c loop with a; the walk finds one loop and names all three
    releases = [rel('a', needs=['b']), rel('b', needs=['a', 'c']), rel('c', needs=['b'])]
    with pytest.raises(AnsibleFilterError) as caught:
        topo.toposort(releases)
    assert str(caught.value) == 'toposort: needs form a cycle: a -> b -> a (all caught in it: a, b, c)'


@pytest.mark.parametrize('releases, text', [
    ('cilium', 'expected a list of releases, got str'),
    ([{'namespace': 'x'}], 'release #1 has no name'),
    ([rel('a', 'x'), rel('a', 'x')], 'release x/a is listed twice (items 1 and 2)'),
    ([rel('a', needs={'b': 1})], 'needs of release a must be a list'),
])
def test_bad_input(releases, text):
    with pytest.raises(AnsibleFilterError) as caught:
        topo.toposort(releases)
    assert text in str(caught.value)


def test_filter_plugin_exposes_both_filters():
    filters = topo.FilterModule().filters()
    assert filters['toposort'] is topo.toposort and filters['toposort_tiers'] is topo.toposort_tiers
