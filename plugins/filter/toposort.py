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


def _cycles(remaining, needs):
    """(path 'a -> b -> a', members) for each strongly connected component that loops (Tarjan)."""
    index_of, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def connect(node):
        index_of[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for need in needs[node]:
            if need not in remaining:
                continue
            if need not in index_of:
                connect(need)
                low[node] = min(low[node], low[need])
            elif need in on_stack:
                low[node] = min(low[node], index_of[need])
        if low[node] == index_of[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in needs[node]:
                component = sorted(component, key=remaining.index)
                found.append((_cycle_path(component, needs), component))

    for node in remaining:
        if node not in index_of:
            connect(node)
    return found


def _cycle_path(component, needs):
    """One loop inside a looping component, 'a -> b -> a', plus the other members if any."""
    members = set(component)
    path = [component[0]]
    while True:
        # every member of a looping component needs at least one other member (or itself)
        following = [need for need in needs[path[-1]] if need in members][0]
        if following in path:
            loop = path[path.index(following):] + [following]
            text = ' -> '.join(loop)
            if len(members) > len(loop) - 1:
                text += ' (all caught in it: %s)' % ', '.join(component)
            return text
        path.append(following)


def tiers(releases, needs_key='needs'):
    """Lists of releases; each needs only releases of earlier lists."""
    ids, needs = _check(releases, needs_key)
    by_id = dict(zip(ids, releases))
    placed = set()
    result = []
    remaining = list(ids)
    while remaining:
        tier = [rid for rid in remaining if all(need in placed for need in needs[rid])]
        if not tier:
            loops = _cycles(remaining, needs)
            caught = set(member for path, component in loops for member in component)
            text = 'toposort: needs form a cycle: %s' % '; '.join(path for path, component in loops)
            blocked = [rid for rid in remaining if rid not in caught]
            if blocked:
                text += '; waiting behind it: %s' % ', '.join(blocked)
            raise AnsibleFilterError(text)
        result.append([by_id[rid] for rid in tier])
        placed.update(tier)
        remaining = [rid for rid in remaining if rid not in placed]
    return result


def toposort(releases, needs_key='needs'):
    """Releases in an order where each comes after everything it needs."""
    return [release for tier in tiers(releases, needs_key) for release in tier]


def toposort_tiers(releases, needs_key='needs'):
    return tiers(releases, needs_key)


class FilterModule(object):
    def filters(self):
        return {'toposort': toposort, 'toposort_tiers': toposort_tiers}
