"""The etcd cluster of one Talos cluster (nodes sharing cluster.id), as the lab keeps it.

One EtcdCluster per cluster id. It is bootstrapped once (Bootstrap RPC on one control plane);
then every other configured control plane of the same cluster joins: added as a learner with an
empty name (the name comes when its etcd starts), promoted once it caught up; peer URL
https://<ip>:2380, client URL https://<ip>:2379. Members stay members across node
reboots; a Reset of a control plane removes its member (graceful leave) and its data.
"""

import hashlib
import json
import random

# The lab's etcd snapshot: not etcd's format (a bbolt database; the lab keeps no key space), a file of its own.
SNAPSHOT_MAGIC = b'proxtalos-lab-etcd-snapshot/1\n'
SNAPSHOT_HASH_SIZE = 32

# etcd v3.6.12's texts for a refused member removal (go.etcd.io/etcd/server/v3 etcdserver/errors/errors.go:32,
# go.etcd.io/etcd/api/v3 v3rpc/rpctypes/error.go:46, 86)
NOT_ENOUGH_STARTED = 'etcdserver: re-configuration failed due to not enough started members'
UNHEALTHY_CLUSTER = 'etcdserver: unhealthy cluster'
MEMBER_NOT_FOUND = 'etcdserver: member not found'


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

    def member_by_id(self, member_id):
        return next((member for member in self.members if member.id == member_id), None)

    def removal_refusal(self, member_id, running_keys, local_key):
        """None if etcd lets the member go, else etcd's error text (MEMBER_NOT_FOUND for an unknown id).

        etcd v3.6.12 EtcdServer.mayRemoveMember (go.etcd.io/etcd/server/v3 etcdserver/server.go:1613-1655), with
        strict reconfiguration checks on (etcd's default): a learner always goes (:1621); the voting members
        left must have quorum among those ever started, a started member being one with a name
        (api/membership/cluster.go:749-777, member.go:114); a member that is down may go (:1636); else the
        members up after the removal must keep quorum (:1640-1652). `running_keys`: the nodes whose etcd runs now,
        `local_key`: the node whose etcd serves the request.
        """
        member = self.member_by_id(member_id)
        if member is None:
            return MEMBER_NOT_FOUND
        if member.is_learner:
            return None
        others = [other for other in self.members if not other.is_learner and other.id != member_id]
        started = [other for other in others if other.hostname]
        if len(started) < len(others) // 2 + 1:
            return NOT_ENOUGH_STARTED
        if member.node_key not in running_keys and member.node_key != local_key:
            return None
        voting = [other for other in self.members if not other.is_learner]
        active = len([other for other in voting if other.node_key in running_keys])
        if active - 1 < 1 + (len(voting) - 1) // 2:
            return UNHEALTHY_CLUSTER
        return None

    def remove_by_id(self, member_id):
        member = self.member_by_id(member_id)
        if member is not None:
            self.remove(member.node_key)
        return member

    def snapshot(self, node_hostname):
        """The lab's snapshot of this etcd: SNAPSHOT_MAGIC, a JSON document of the cluster's state, then the SHA-256 of
        everything before it (as etcd ends its snapshot stream with the SHA-256 of the database,
        go.etcd.io/etcd/server/v3 v3.6.12 etcdserver/api/v3rpc/maintenance.go:151-153, 198-206)."""
        document = {'cluster_id': self.cluster_id, 'taken_on': node_hostname, 'raft_index': self.raft_index,
                    'raft_term': self.raft_term, 'leader': '%x' % self.leader if self.leader else None,
                    'members': [member.as_dict() for member in self.members]}
        body = SNAPSHOT_MAGIC + json.dumps(document, sort_keys=True).encode('utf-8') + b'\n'
        # padded with zero bytes to the database size EtcdStatus reports, so that sizes agree
        body += b'\0' * max(0, self.db_size() - len(body) - SNAPSHOT_HASH_SIZE)
        return body + hashlib.sha256(body).digest()

    def db_size(self):
        """The lab's etcd database size in bytes (grows with the raft index)."""
        return 20480 + 4096 * self.raft_index

    def tick(self):
        """Some writes happened (every status read moves the index a little, as a live etcd does)."""
        self.raft_index += 1


def read_snapshot(data):
    """The document of a lab snapshot; ValueError if it is not one or its SHA-256 does not match."""
    if not data.startswith(SNAPSHOT_MAGIC) or len(data) <= len(SNAPSHOT_MAGIC) + SNAPSHOT_HASH_SIZE:
        raise ValueError('not a lab etcd snapshot')
    body, digest = data[:-SNAPSHOT_HASH_SIZE], data[-SNAPSHOT_HASH_SIZE:]
    if hashlib.sha256(body).digest() != digest:
        raise ValueError('the snapshot SHA-256 does not match its content')
    return json.loads(body[len(SNAPSHOT_MAGIC):].split(b'\n', 1)[0].decode('utf-8'))
