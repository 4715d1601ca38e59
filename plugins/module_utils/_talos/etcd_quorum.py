# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Would removing one etcd member lose quorum? PRIVATE to the collection.

The rule the collection applies before it removes a control plane (stricter than etcd's own check, which only
looks at the members its leader sees connected): after the removal, the voting members left must number at least
one, and more than half of them must have a healthy etcd now (their node's etcd service Running and healthy).
Learners do not vote and are left out on both sides.
"""

from __future__ import annotations


def quorum(count):
    """Members needed for quorum among `count` voting members."""
    return count // 2 + 1


def removal_verdict(members, leaving, healthy):
    """(ok, text) for removing member `leaving` (an id) from `members` ([{id, hostname, is_learner}]).

    healthy: {member id: True/False or a text saying why not} for the voting members that stay.
    """
    voting = [member for member in members if not member.get('is_learner')]
    staying = [member for member in voting if member['id'] != leaving]
    if not staying:
        return False, 'it is the last voting etcd member: the cluster would have no etcd left'
    up = [member for member in staying if healthy.get(member['id']) is True]
    need = quorum(len(staying))
    lines = []
    for member in staying:
        state = healthy.get(member['id'])
        lines.append('%s %s' % (member.get('hostname') or '%016x' % member['id'],
                                'healthy' if state is True else 'not healthy (%s)' % (state or 'unknown')))
    summary = '%d voting member(s) would stay, %d of them healthy, quorum needs %d: %s' % (
        len(staying), len(up), need, ', '.join(lines))
    if len(up) < need:
        return False, summary
    return True, summary
