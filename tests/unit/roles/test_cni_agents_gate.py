"""cni role: the Cilium agents gate, as roles/cni/tasks/gates.yml defines it, judges the agent DaemonSet's rollout
(kubectl v0.36.3 pkg/polymorphichelpers/rollout_status.go:107-114) plus a Ready agent per node - run (one probe) on a
world where a values change is rolling out: every old agent still Ready, one node on the new template.

The DaemonSet status is shaped as the DaemonSet controller writes it (k8s.io/api v0.36.3 apps/v1 DaemonSetStatus):
observedGeneration caught up, updatedNumberScheduled counting pods of the new template only.
"""
import os
import sys

import yaml
from jinja2 import StrictUndefined
from jinja2.nativetypes import NativeEnvironment

from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import steps

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, 'tests', 'unit', 'plugins', 'module_utils', '_k8s'))
from fake_kube import FakeKube  # noqa: E402  pylint: disable=wrong-import-position,import-error

NODES = ('cp-1', 'w-1', 'w-2')
LABELS = {'k8s-app': 'cilium'}


def agents_gate():
    """The third gate of the cni gates task, rendered with the role's defaults (native types, as Ansible does)."""
    with open(os.path.join(ROOT, 'roles', 'cni', 'defaults', 'main.yml'), encoding='utf-8') as handle:
        variables = yaml.safe_load(handle)
    variables['cni_node_names'] = list(NODES)
    with open(os.path.join(ROOT, 'roles', 'cni', 'tasks', 'gates.yml'), encoding='utf-8') as handle:
        task = yaml.safe_load(handle)[0]
    env = NativeEnvironment(undefined=StrictUndefined)
    gate = next(g for g in task['proxtalos.cluster.k8s_gate']['gates'] if 'Cilium agent' in g['title'])

    def render(value):
        if isinstance(value, str):
            return env.from_string(value).render(**variables)
        if isinstance(value, list):
            return [render(v) for v in value]
        return value
    return dict((key, render(value)) for key, value in gate.items())


def world(updated):
    kube = FakeKube()
    for name in NODES:
        kube.add({'apiVersion': 'v1', 'kind': 'Node', 'metadata': {'name': name, 'labels': {'kubernetes.io/hostname': name}},
                  'spec': {}, 'status': {'conditions': [{'type': 'Ready', 'status': 'True', 'reason': 'KubeletReady'}]}})
        kube.add({'apiVersion': 'v1', 'kind': 'Pod',
                  'metadata': {'name': 'cilium-%s' % name, 'namespace': 'kube-system', 'labels': LABELS,
                               'ownerReferences': [{'kind': 'DaemonSet', 'name': 'cilium', 'uid': 'ds-uid', 'controller': True}]},
                  'spec': {'nodeName': name},
                  'status': {'phase': 'Running', 'conditions': [{'type': 'Ready', 'status': 'True'}],
                             'containerStatuses': [{'name': 'cilium-agent', 'ready': True, 'state': {'running': {}}}]}})
    kube.add({'apiVersion': 'apps/v1', 'kind': 'DaemonSet', 'metadata': {'name': 'cilium', 'namespace': 'kube-system', 'uid': 'ds-uid',
                                                                         'generation': 2},
              'spec': {'selector': {'matchLabels': LABELS}, 'updateStrategy': {'type': 'RollingUpdate', 'rollingUpdate': {'maxUnavailable': 2}},
                       'template': {'metadata': {'labels': LABELS}, 'spec': {'hostNetwork': True, 'tolerations': [{'operator': 'Exists'}]}}},
              'status': {'observedGeneration': 2, 'desiredNumberScheduled': 3, 'currentNumberScheduled': 3, 'updatedNumberScheduled': updated,
                         'numberReady': 3, 'numberAvailable': 3, 'numberUnavailable': 0, 'numberMisscheduled': 0}})
    return kube


def probe(kube):
    built = steps.build_steps([agents_gate()], 600, probe_once=True)
    (outcome,) = steps.run_steps(built, kube, 1)
    return outcome


def test_old_agents_still_ready_during_a_rollout_do_not_pass():
    outcome = probe(world(updated=1))
    assert not outcome.passed
    assert 'rolling out: 1 of 3 pods updated' in outcome.result['summary']


def test_the_rolled_out_agents_pass_naming_every_node():
    outcome = probe(world(updated=3))
    assert outcome.passed, outcome.result['summary']
    assert outcome.result['summary'] == 'DaemonSet kube-system/cilium Ready on 3/3 eligible nodes'
