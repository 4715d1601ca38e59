# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Order releases by helmfile-style `needs`: toposort (a flat list) and toposort_tiers (groups).

A release is a dict with `name`, optional `namespace` and `kubeContext`, and optional `needs`:
a list of `[KUBECONTEXT/]NAMESPACE/NAME` (or `NAME` for a release without a namespace), as in
helmfile. Releases whose needs are all met form a tier; tiers come in dependency order, and
inside a tier the input order is kept, so the result is deterministic. A need that names no
release, a release listed twice, or a cycle is an error that names the releases involved.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.proxtalos.cluster.plugins.module_utils._graph import cycle_through, cyclic_components
from ansible_collections.proxtalos.cluster.plugins.module_utils._graph import tiers as graph_tiers


def release_id(release):
    """[kubeContext/]namespace/name, or name when the release has no namespace."""
    parts = [release.get('kubeContext'), release.get('namespace'), release.get('name')]
    return '/'.join(str(part) for part in parts if part)


def _suggest(need, ids):
    short = need.rsplit('/', 1)[-1]
    matches = [rid for rid in ids if rid.rsplit('/', 1)[-1] == short]
    return ' (did you mean %s?)' % ' or '.join(matches) if matches else ''


def _check(releases, needs_key):
    if not isinstance(releases, (list, tuple)):
        raise AnsibleFilterError('toposort: expected a list of releases, got %s' % type(releases).__name__)
    ids = []
    positions = {}
    for index, release in enumerate(releases):
        if not isinstance(release, dict) or not release.get('name'):
            raise AnsibleFilterError('toposort: release #%d has no name' % (index + 1))
        rid = release_id(release)
        if rid in positions:
            raise AnsibleFilterError('toposort: release %s is listed twice (items %d and %d)'
                                     % (rid, positions[rid] + 1, index + 1))
        positions[rid] = index
        ids.append(rid)
    needs = {}
    unknown = []
    for release, rid in zip(releases, ids):
        wanted = release.get(needs_key) or []
        if isinstance(wanted, str):
            wanted = [wanted]
        if not isinstance(wanted, (list, tuple)):
            raise AnsibleFilterError('toposort: %s of release %s must be a list' % (needs_key, rid))
        needs[rid] = []
        for need in wanted:
            need = str(need)
            if need not in positions:
                unknown.append('%s needs %s, which is not a release%s' % (rid, need, _suggest(need, ids)))
            elif need not in needs[rid]:
                needs[rid].append(need)
    if unknown:
        raise AnsibleFilterError('toposort: unknown needs: %s' % '; '.join(unknown))
    return ids, needs


def _cycle_text(graph, component):
    """'a -> b -> a': a shortest loop through the component's first release, plus the other members if any."""
    loop = cycle_through(graph, component)
    text = ' -> '.join(loop)
    if len(component) > len(loop) - 1:
        text += ' (all caught in it: %s)' % ', '.join(component)
    return text


def tiers(releases, needs_key='needs'):
    """Lists of releases; each needs only releases of earlier lists."""
    ids, needs = _check(releases, needs_key)
    by_id = dict(zip(ids, releases))
    ordered, waiting = graph_tiers(needs)
    if waiting:
        stuck = dict((rid, needs[rid]) for rid in waiting)
        loops = cyclic_components(stuck)
        caught = set(member for component in loops for member in component)
        text = 'toposort: needs form a cycle: %s' % '; '.join(_cycle_text(stuck, component) for component in loops)
        blocked = [rid for rid in waiting if rid not in caught]
        if blocked:
            text += '; waiting behind it: %s' % ', '.join(blocked)
        raise AnsibleFilterError(text)
    return [[by_id[rid] for rid in tier] for tier in ordered]


def toposort(releases, needs_key='needs'):
    """Releases in an order where each comes after everything it needs."""
    return [release for tier in tiers(releases, needs_key) for release in tier]


def toposort_tiers(releases, needs_key='needs'):
    return tiers(releases, needs_key)


class FilterModule(object):
    def filters(self):
        return {'toposort': toposort, 'toposort_tiers': toposort_tiers}
