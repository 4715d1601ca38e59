"""The etcd cluster of one Talos cluster (nodes sharing cluster.id), as the lab keeps it.

One EtcdCluster per cluster id. It is bootstrapped once (Bootstrap RPC on one control plane);
then every other configured control plane of the same cluster joins: added as a learner with an
empty name (the name comes when its etcd starts), promoted once it caught up; peer URL
https://<ip>:2380, client URL https://<ip>:2379. Members stay members across node
reboots; a Reset of a control plane removes its member (graceful leave) and its data.
"""

import random


class EtcdMember(object):
    def __init__(self, member_id, node_key, hostname, address, learner=False):
        self.id = member_id
        self.node_key = node_key
        self.hostname = hostname
        self.address = address
        self.is_learner = learner

    @property
    def peer_urls(self):
        return ['https://%s:2380' % self.address]

    @property
    def client_urls(self):
        return ['https://%s:2379' % self.address]

    def as_dict(self):
        return {'id': '%x' % self.id, 'hostname': self.hostname, 'peer_urls': self.peer_urls,
                'client_urls': self.client_urls, 'is_learner': self.is_learner}


class EtcdCluster(object):
    """Members, leader and raft counters of one cluster's etcd."""

    def __init__(self, cluster_id, rng=None):
        self.cluster_id = cluster_id
        self.rng = rng or random.Random()
        self.members = []
        self.bootstrapped = False
        self.bootstrapping = False   # a Bootstrap RPC was accepted; etcd is forming
        self.leader = None
        self.raft_term = 0
        self.raft_index = 0

    def _new_id(self):
        existing = set(member.id for member in self.members)
        while True:
            member_id = self.rng.getrandbits(64) or 1
            if member_id not in existing:
                return member_id

    def member_for(self, node_key):
        return next((member for member in self.members if member.node_key == node_key), None)

    def bootstrap(self, node_key, hostname, address):
        self.bootstrapped = True
        self.bootstrapping = False
        self.raft_term = 2
        self.raft_index = 4
        member = self.add(node_key, hostname, address)
        self.leader = member.id
        return member

    def add(self, node_key, hostname, address, learner=False):
        """A member for the node (a new one, or the node's own updated); `learner` only for a new one."""
        member = self.member_for(node_key)
        if member is None:
            member = EtcdMember(self._new_id(), node_key, hostname, address, learner=learner)
            self.members.append(member)
            self.raft_index += 3
        else:
            member.hostname = hostname
            member.address = address
        return member

    def promote(self, node_key):
        member = self.member_for(node_key)
        if member is not None and member.is_learner:
            member.is_learner = False
            self.raft_index += 1

    def remove(self, node_key):
        member = self.member_for(node_key)
        if member is None:
            return
        self.members.remove(member)
        self.raft_index += 1
        if self.leader == member.id:
            self.leader = self.members[0].id if self.members else None
            self.raft_term += 1
        if not self.members:
            self.bootstrapped = False
            self.bootstrapping = False

    def tick(self):
        """Some writes happened (every status read moves the index a little, as a live etcd does)."""
        self.raft_index += 1
