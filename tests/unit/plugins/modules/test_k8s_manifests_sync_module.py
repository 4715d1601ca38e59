"""k8s_manifests_sync's main(): the Manifest resources read, every object synced in order with check mode passed on,
changed from the actions, the result without the objects' content, a node without manifests and a refusal failing
with the node or the object named."""

import os
import sys

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import manifests_sync
from ansible_collections.proxtalos.cluster.plugins.modules import k8s_manifests_sync as mod

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ansible_collections.proxtalos.cluster.tests.helpers import run_main  # noqa: E402  pylint: disable=wrong-import-position

ARGS = {'kubeconfig': '/dev/null', 'talosconfig': '/dev/null', 'node': '10.0.0.11'}
SECRET = ('- apiVersion: v1\n  kind: Secret\n  metadata: {name: token, namespace: kube-system}\n'
          '  stringData: {token-secret: s3cr3t-value}\n')
RESOURCES = ({'id': '99-extra', 'yaml_spec': '- {apiVersion: v1, kind: Namespace, metadata: {name: extra}}\n'},
             {'id': '10-kube-proxy', 'yaml_spec': SECRET})


def setup(monkeypatch, actions, resources=RESOURCES):
    calls = []
    monkeypatch.setattr(mod, 'read_manifests', lambda params, module=None: list(resources))
    monkeypatch.setattr(mod.k8s_client, 'build_client', lambda params, module=None, warn=None: object())

    def sync_one(kube, obj, check_mode=False):
        calls.append((obj['kind'], check_mode))
        action = actions.pop(0)
        if isinstance(action, Exception):
            raise action
        return {'kind': obj['kind'], 'namespace': '', 'name': obj['metadata']['name'], 'action': action}
    monkeypatch.setattr(manifests_sync, 'sync_one', sync_one)
    return calls


def test_every_object_synced_in_order_and_changed_from_the_actions(capsys, monkeypatch):
    calls = setup(monkeypatch, ['unchanged', 'configured'])
    code, result, out = run_main(mod, ARGS, capsys, check_mode=True)
    assert code == 0 and result['changed'] is True and result['manifests'] == ['10-kube-proxy', '99-extra']
    assert calls == [('Namespace', True), ('Secret', True)]   # cluster definitions first
    assert [(o['kind'], o['action']) for o in result['objects']] == [('Namespace', 'unchanged'), ('Secret', 'configured')]
    assert 's3cr3t-value' not in out
    setup(monkeypatch, ['unchanged', 'unchanged'])
    code, result, _out = run_main(mod, ARGS, capsys)
    assert code == 0 and result['changed'] is False


def test_a_node_without_manifests_fails_naming_it(capsys, monkeypatch):
    setup(monkeypatch, [], resources=())
    code, result, _out = run_main(mod, ARGS, capsys)
    assert code == 1 and result['msg'].startswith('talos node 10.0.0.11 lists no bootstrap manifests')


def test_a_refusal_fails_naming_the_object_and_keeps_what_was_done(capsys, monkeypatch):
    refusal = _errors.ApiError('Secret kube-system/token: the API refused the apply: 422 ...', status=422,
                               object='Secret kube-system/token')
    setup(monkeypatch, ['created', refusal])
    code, result, out = run_main(mod, ARGS, capsys)
    assert code == 1 and result['object'] == 'Secret kube-system/token' and result['changed'] is True
    assert result['msg'].startswith('Secret kube-system/token: the API refused the apply')
    assert [o['action'] for o in result['objects']] == ['created'] and 's3cr3t-value' not in out
