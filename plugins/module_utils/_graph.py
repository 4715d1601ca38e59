# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Dependency graphs: tiers (topological levels) and cycles. PRIVATE to the collection.

One set of graph algorithms for the three places that order things by what they depend on: the toposort filter
(helmfile `needs` of the bootstrap releases), _flux (the live Kustomization tree the gitops gate judges) and
_flux_graph (the Kustomization tree of a repository).

A graph is a dict {vertex: [the vertices it depends on]}. A dependency that is not a key of the graph is ignored
(the callers report those themselves, in their own words). Every result follows the order of the graph: its keys
for the vertices, each list for the dependencies. A caller that wants sorted output passes a sorted graph
(sorted_graph); one that wants its input order passes the graph in that order.

- levels: each vertex's tier, the length of its longest dependency chain (0: depends on nothing in the graph);
  None for a vertex in a cycle or behind one.
- tiers: the same as lists, tier by tier, plus the vertices no tier holds.
- strongly_connected: Tarjan's strongly connected components, iterative (no recursion limit on deep chains).
- cyclic_components: the components that loop (more than one vertex, or one that depends on itself).
- cycle_through: one shortest cycle through a component's first vertex, to name the loop in a message.
"""

from __future__ import annotations


def sorted_graph(graph):
    """The graph with its vertices and each vertex's dependencies sorted."""
    return dict((vertex, sorted(graph[vertex])) for vertex in sorted(graph))


def _inside(graph):
    """{vertex: its dependencies that are vertices of the graph, each once, in order}."""
    inside = {}
    for vertex, dependencies in graph.items():
        inside[vertex] = []
        for dependency in dependencies:
            if dependency in graph and dependency not in inside[vertex]:
                inside[vertex].append(dependency)
    return inside


def levels(graph):
    """{vertex: tier or None}, in the graph's order: tier 0 depends on nothing in the graph, tier n on tiers below n
    with at least one in tier n - 1; None for a vertex in a cycle or depending on one, however indirectly."""
    dependencies = _inside(graph)
    waiting = dict((vertex, set(needed)) for vertex, needed in dependencies.items())
    dependants = {}
    for vertex, needed in dependencies.items():
        for dependency in needed:
            dependants.setdefault(dependency, []).append(vertex)
    level = dict((vertex, 0) for vertex in graph if not waiting[vertex])
    ready = list(level)
    while ready:
        following = []
        for vertex in ready:
            for dependant in dependants.get(vertex, ()):
                waiting[dependant].discard(vertex)
                if not waiting[dependant]:
                    level[dependant] = 1 + max(level[dependency] for dependency in dependencies[dependant])
                    following.append(dependant)
        ready = following
    return dict((vertex, level.get(vertex)) for vertex in graph)


def tiers(graph):
    """(tiers, untiered): tiers[n] lists the vertices of tier n, untiered those in or behind a cycle; both in the
    graph's order."""
    result = []
    untiered = []
    for vertex, level in levels(graph).items():
        if level is None:
            untiered.append(vertex)
            continue
        while len(result) <= level:
            result.append([])
        result[level].append(vertex)
    return result, untiered


def strongly_connected(graph):
    """Tarjan's strongly connected components, in the order Tarjan completes them; the vertices of each in the
    graph's order. Vertices are visited in the graph's order, dependencies in each list's order."""
    dependencies = _inside(graph)
    position = dict((vertex, number) for number, vertex in enumerate(graph))
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def enter(vertex):
        index[vertex] = low[vertex] = len(index)
        stack.append(vertex)
        on_stack.add(vertex)
        return (vertex, iter(dependencies[vertex]))

    for start in graph:
        if start in index:
            continue
        work = [enter(start)]
        while work:
            vertex, following = work[-1]
            descended = False
            for dependency in following:
                if dependency not in index:
                    work.append(enter(dependency))
                    descended = True
                    break
                if dependency in on_stack:
                    low[vertex] = min(low[vertex], index[dependency])
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[vertex])
            if low[vertex] == index[vertex]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == vertex:
                        break
                components.append(sorted(component, key=position.get))
    return components


def cyclic_components(graph):
    """The strongly connected components that loop: more than one vertex, or one vertex that depends on itself."""
    return [component for component in strongly_connected(graph)
            if len(component) > 1 or component[0] in graph[component[0]]]


def cycle_through(graph, component):
    """[first, ..., first]: a shortest cycle from the component's first vertex back to it, inside the component
    (breadth first, dependencies in each list's order). component: a list from cyclic_components."""
    members = set(component)
    start = component[0]
    parents = {}
    frontier = [start]
    while frontier:
        following = []
        for vertex in frontier:
            for dependency in graph[vertex]:
                if dependency not in members:
                    continue
                if dependency == start:
                    path = [vertex]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return list(reversed(path)) + [start]
                if dependency not in parents:
                    parents[dependency] = vertex
                    following.append(dependency)
        frontier = following
    raise ValueError('%s is not a cyclic component of the graph' % (component,))
