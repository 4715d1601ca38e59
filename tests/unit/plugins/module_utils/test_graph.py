"""_graph: tiers (longest-path levels) and cycles (Tarjan) of {vertex: [dependencies]}, in the graph's order."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils import _graph


def test_tiers_are_longest_path_levels():
    graph = {'a': [], 'b': ['a'], 'c': ['a', 'b'], 'd': ['c'], 'e': []}
    assert _graph.levels(graph) == {'a': 0, 'b': 1, 'c': 2, 'd': 3, 'e': 0}


def test_a_vertex_in_or_behind_a_cycle_has_no_level_and_missing_dependencies_are_ignored():
    graph = {'a': ['b'], 'b': ['a'], 'c': ['b'], 'd': ['gone'], 'e': ['d', 'gone'], 'f': ['f']}
    assert _graph.levels(graph) == {'a': None, 'b': None, 'c': None, 'd': 0, 'e': 1, 'f': None}


def test_tiers_keep_the_graph_order():
    graph = {'z': [], 'y': ['z'], 'a': [], 'b': ['a', 'z'], 'loop': ['loop'], 'after': ['loop']}
    assert _graph.tiers(graph) == ([['z', 'a'], ['y', 'b']], ['loop', 'after'])
    assert _graph.tiers(_graph.sorted_graph(graph)) == ([['a', 'z'], ['b', 'y']], ['after', 'loop'])
    assert _graph.tiers({}) == ([], [])


def test_sorted_graph_sorts_vertices_and_dependencies():
    graph = {'b': ['z', 'a'], 'a': []}
    assert list(_graph.sorted_graph(graph).items()) == [('a', []), ('b', ['a', 'z'])]
    assert graph == {'b': ['z', 'a'], 'a': []}


def test_strongly_connected_components():
    graph = {'a': ['b'], 'b': ['c'], 'c': ['a'], 'd': ['a'], 'e': ['e']}
    components = sorted(_graph.strongly_connected(graph))
    assert components == [['a', 'b', 'c'], ['d'], ['e']]


def test_components_come_in_tarjan_order_with_members_in_graph_order():
    # Tarjan completes a component once everything it depends on is done: dependencies first.
    graph = {'top': ['y'], 'y': ['x'], 'x': ['y', 'base'], 'base': []}
    assert _graph.strongly_connected(graph) == [['base'], ['y', 'x'], ['top']]


def test_a_deep_chain_needs_no_recursion():
    graph = dict(('v%05d' % number, ['v%05d' % (number + 1)] if number < 5000 else []) for number in range(5001))
    graph['v05000'] = ['v00000']
    components = _graph.strongly_connected(graph)
    assert len(components) == 1 and len(components[0]) == 5001
    assert _graph.levels(graph)['v00000'] is None


def test_only_looping_components_are_cyclic():
    graph = {'a': ['b'], 'b': ['a'], 'c': ['a'], 'd': ['d'], 'e': []}
    assert _graph.cyclic_components(graph) == [['a', 'b'], ['d']]


def test_the_cycle_named_is_a_shortest_one_through_the_first_vertex():
    # a -> b -> c -> b also loops, but the cycle named starts and ends at a
    graph = {'a': ['b'], 'b': ['c'], 'c': ['b', 'a']}
    [component] = _graph.cyclic_components(graph)
    assert _graph.cycle_through(graph, component) == ['a', 'b', 'c', 'a']
    # the shorter way back wins over the first dependency listed
    graph = {'a': ['b', 'c'], 'b': ['c'], 'c': ['a']}
    assert _graph.cycle_through(graph, ['a', 'b', 'c']) == ['a', 'c', 'a']
    # among equally short ones, the first dependency listed
    graph = {'a': ['c', 'b'], 'b': ['a'], 'c': ['a']}
    assert _graph.cycle_through(graph, ['a', 'b', 'c']) == ['a', 'c', 'a']
    assert _graph.cycle_through({'a': ['a']}, ['a']) == ['a', 'a']


def test_cycle_through_refuses_a_component_without_a_cycle():
    with pytest.raises(ValueError, match="'a'"):
        _graph.cycle_through({'a': [], 'b': ['a']}, ['a', 'b'])
