"""The collection's quorum rule for removing an etcd member (plugins/module_utils/_talos/etcd_quorum.py)."""
import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import etcd_quorum


def members(*names, learners=()):
    return [{'id': index + 1, 'hostname': name, 'is_learner': name in learners} for index, name in enumerate(names)]


@pytest.mark.parametrize('names, leaving, healthy, ok, words', [
    (('cp-1', 'cp-2', 'cp-3'), 1, {2: True, 3: True}, True, '2 voting member(s) would stay, 2 of them healthy, quorum needs 2'),
    (('cp-1', 'cp-2', 'cp-3'), 1, {2: True, 3: 'etcd Running: context deadline exceeded'}, False,
     'cp-3 not healthy (etcd Running: context deadline exceeded)'),
    (('cp-1', 'cp-2', 'cp-3'), 3, {1: True, 2: True}, True, 'quorum needs 2'),
    (('cp-1', 'cp-2'), 1, {2: True}, True, '1 voting member(s) would stay, 1 of them healthy, quorum needs 1'),
    (('cp-1', 'cp-2'), 1, {2: 'unreachable'}, False, 'cp-2 not healthy (unreachable)'),
    (('cp-1',), 1, {}, False, 'last voting etcd member'),
    (('cp-1', 'cp-2', 'cp-3', 'cp-4', 'cp-5'), 1, {2: True, 3: True, 4: 'down', 5: 'down'}, False, 'quorum needs 3'),
    (('cp-1', 'cp-2', 'cp-3', 'cp-4', 'cp-5'), 1, {2: True, 3: True, 4: True, 5: 'down'}, True, '3 of them healthy'),
])
def test_removal_verdict(names, leaving, healthy, ok, words):
    verdict, text = etcd_quorum.removal_verdict(members(*names), leaving, healthy)
    assert verdict is ok and words in text


def test_learners_neither_vote_nor_count():
    listed = members('cp-1', 'cp-2', 'cp-3', learners=('cp-3',))
    ok, text = etcd_quorum.removal_verdict(listed, 1, {2: True})
    assert ok and text.startswith('1 voting member(s) would stay')
    ok, text = etcd_quorum.removal_verdict(members('cp-1', 'cp-2', learners=('cp-2',)), 1, {})
    assert not ok and 'last voting etcd member' in text
