"""k8s_manifests_sync's main(): the config read for the images, changed from the sync's actions, a warning for a
missing object, a refusal failing the module with the object named."""

import os
import sys

import yaml

from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.module_utils._k8s import manifests_sync
from ansible_collections.proxtalos.cluster.plugins.modules import k8s_manifests_sync as mod

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from module_run import run_main  # noqa: E402  pylint: disable=wrong-import-position,import-error

NEW = 'registry.k8s.io/kube-proxy:v1.36.3'


def write_config(tmp_path, proxy):
    path = tmp_path / 'cp-1.yaml'
    path.write_text(yaml.safe_dump_all([{'version': 'v1alpha1', 'machine': {'type': 'controlplane'},
                                         'cluster': {'proxy': proxy}},
                                        {'apiVersion': 'v1alpha1', 'kind': 'HostnameConfig', 'hostname': 'cp-1'}]))
    return str(path)


def fake_sync(actions, calls):
    def sync(kube, wanted, check_mode=False):
        calls.append(([t.image for t in wanted], check_mode))
        if isinstance(actions, Exception):
            raise actions
        return [{'kind': 'DaemonSet', 'namespace': 'kube-system', 'name': 'kube-proxy', 'setting': 'cluster.proxy.image',
                 'image': wanted[0].image, 'image_before': '', 'action': action} for action in actions]
    return sync


def test_changed_follows_the_actions_and_check_mode_is_passed_on(tmp_path, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(mod.k8s_client, 'build_client', lambda params, module=None, warn=None: object())
    monkeypatch.setattr(manifests_sync, 'sync', fake_sync(['configured'], calls))
    code, result, _out = run_main(mod, {'kubeconfig': '/dev/null', 'config_path': write_config(tmp_path, {'image': NEW})},
                                  capsys, check_mode=True)
    assert code == 0 and result['changed'] is True and calls == [([NEW], True)]
    monkeypatch.setattr(manifests_sync, 'sync', fake_sync(['unchanged'], calls))
    code, result, _out = run_main(mod, {'kubeconfig': '/dev/null', 'config_path': write_config(tmp_path, {'image': NEW})},
                                  capsys)
    assert code == 0 and result['changed'] is False


def test_a_missing_object_warns_and_a_disabled_proxy_reads_nothing(tmp_path, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(mod.k8s_client, 'build_client', lambda params, module=None, warn=None: object())
    monkeypatch.setattr(manifests_sync, 'sync', fake_sync(['missing'], calls))
    code, result, _out = run_main(mod, {'kubeconfig': '/dev/null', 'config_path': write_config(tmp_path, {'image': NEW})},
                                  capsys)
    assert code == 0 and result['changed'] is False
    warnings = [w['event']['msg'] if isinstance(w, dict) else w for w in result['warnings']]  # core 2.19+ sends summaries
    assert warnings == ['DaemonSet kube-system/kube-proxy does not exist: not synced (Talos creates it)']
    calls[:] = []
    code, result, _out = run_main(mod, {'kubeconfig': '/dev/null',
                                        'config_path': write_config(tmp_path, {'disabled': True, 'image': NEW})}, capsys)
    assert code == 0 and result == dict(result, changed=False, objects=[]) and calls == []


def test_a_refusal_fails_naming_the_object(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(mod.k8s_client, 'build_client', lambda params, module=None, warn=None: object())
    refusal = _errors.ApiError('DaemonSet kube-system/kube-proxy: the API refused the apply: 422 ...', status=422,
                               object='DaemonSet kube-system/kube-proxy')
    monkeypatch.setattr(manifests_sync, 'sync', fake_sync(refusal, []))
    code, result, _out = run_main(mod, {'kubeconfig': '/dev/null', 'config_path': write_config(tmp_path, {'image': NEW})},
                                  capsys)
    assert code == 1 and result['failed'] and result['object'] == 'DaemonSet kube-system/kube-proxy'
    assert result['msg'].startswith('DaemonSet kube-system/kube-proxy: the API refused the apply')


def test_an_unreadable_config_names_the_option(tmp_path, capsys):
    code, result, _out = run_main(mod, {'kubeconfig': '/dev/null', 'config_path': str(tmp_path / 'none.yaml')}, capsys)
    assert code == 1 and result['msg'].startswith('config_path: cannot read ')
