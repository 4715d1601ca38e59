"""proxmox_image as Ansible runs it, against an in-process fakepve (PVE's download-url, a real task)."""

import pytest


from ansible_collections.proxtalos.cluster.plugins.module_utils import _errors
from ansible_collections.proxtalos.cluster.plugins.modules import proxmox_image
from ansible_collections.proxtalos.cluster.tests.helpers import run_main

SECRET = '0ddba11-5ec2-e7a1-b0b0-image'
URL = 'https://factory.talos.dev/image/ce4c98/v1.13.9/nocloud-amd64.iso'


@pytest.fixture
def pve(fakepve):
    fakepve.apitokens['root@pam!proxtalos'] = SECRET
    return fakepve


def args(pve, cafile, **overrides):
    values = dict(api_host=pve.host, api_port=pve.port, api_user='root@pam', api_token_id='proxtalos',
                  api_token_secret=SECRET, ca_path=cafile, node='pve1', storage='local', filename='talos.iso',
                  url=URL, wait_timeout=20, wait_sleep=0.1)
    values.update(overrides)
    return values


def run(values, capsys, check_mode=False):
    code, result, out = run_main(proxmox_image, values, capsys, check_mode=check_mode)
    assert SECRET not in out
    return code, result


def downloads(pve):
    return [r for r in pve.requests if r[0] == 'POST' and r[1].endswith('/download-url')]


def test_check_mode_predicts_the_download_and_does_nothing(pve, fakepve_cafile, capsys):
    code, result = run(args(pve, fakepve_cafile), capsys, check_mode=True)
    assert code == 0 and result['changed'] is True and result['present'] is False
    assert downloads(pve) == []


def test_download_then_unchanged(pve, fakepve_cafile, capsys):
    code, result = run(args(pve, fakepve_cafile), capsys)
    assert code == 0 and result['changed'] is True and result['present'] is True
    assert result['volid'] == 'local:iso/talos.iso' and result['upid'].startswith('UPID:pve1:')
    body = downloads(pve)[0][2].decode()
    assert 'filename=talos.iso' in body and 'content=iso' in body and 'verify-certificates=1' in body
    code, result = run(args(pve, fakepve_cafile), capsys)
    assert code == 0 and result['changed'] is False and len(downloads(pve)) == 1


def test_a_checksum_is_passed_to_pve(pve, fakepve_cafile, capsys):
    code, _result = run(args(pve, fakepve_cafile, checksum='ab' * 32), capsys)
    assert code == 0
    body = downloads(pve)[0][2].decode()
    assert 'checksum=' + 'ab' * 32 in body and 'checksum-algorithm=sha256' in body


def test_a_failed_download_names_file_node_and_pve_message(pve, fakepve_cafile, capsys):
    pve.fail('POST', '/nodes/pve1/storage/local/download-url', 500, 'download failed: 404 Not Found')
    code, result = run(args(pve, fakepve_cafile), capsys)
    assert code == 1
    assert result['msg'].startswith('local:iso/talos.iso on node pve1: download from %s failed' % URL)
    assert '404 Not Found' in result['msg']


def test_a_storage_without_iso_content_fails_clearly(pve, fakepve_cafile, capsys):
    code, result = run(args(pve, fakepve_cafile, storage='local-lvm'), capsys)
    assert code == 1 and 'local-lvm' in result['msg']


def test_absent_deletes_the_file(pve, fakepve_cafile, capsys):
    run(args(pve, fakepve_cafile), capsys)
    code, result = run(args(pve, fakepve_cafile, state='absent'), capsys)
    assert code == 0 and result['changed'] is True and result['present'] is False
    code, result = run(args(pve, fakepve_cafile, state='absent'), capsys)
    assert result['changed'] is False


@pytest.mark.parametrize('overrides, field', [(dict(filename='iso/talos.iso'), 'filename'),
                                              (dict(filename='talos.qcow2'), 'filename'),
                                              (dict(filename='talos v1.13+x.iso'), 'filename'),
                                              (dict(filename='talos.iso', content='import'), 'filename'),
                                              (dict(url='ftp://x/talos.iso'), 'url')])
def test_bad_options_name_the_field(overrides, field):
    values = dict(filename='talos.iso', content='iso', state='present', url=URL)
    values.update(overrides)
    with pytest.raises(_errors.ValidationError) as caught:
        proxmox_image.validate(values)
    assert caught.value.field == field


def test_a_name_pve_would_change_names_what_pve_would_store():
    # PVE would store 'talos v1.iso' as 'talos_v1.iso' and the module would never find it (audit finding 9).
    with pytest.raises(_errors.ValidationError) as caught:
        proxmox_image.validate(dict(filename='talos v1.iso', content='iso', state='present', url=URL))
    assert "it would store the file as 'talos_v1.iso'" in str(caught.value)


def test_a_failure_names_who_needs_the_file_there(pve, fakepve_cafile, capsys):
    pve.fail('POST', '/nodes/pve1/storage/local/download-url', 500, 'download failed: 404 Not Found')
    needed = ['lab-cp-1 (VM 1011)', 'lab-w-1 (VM 1021)']
    code, result = run(args(pve, fakepve_cafile, needed_by=needed), capsys)
    assert code == 1 and result['needed_by'] == needed
    assert result['msg'].startswith('local:iso/talos.iso on node pve1: download from %s failed' % URL)
    assert result['msg'].endswith('; needed on pve1 by lab-cp-1 (VM 1011), lab-w-1 (VM 1021)')
    code, result = run(args(pve, fakepve_cafile, needed_by=needed), capsys, check_mode=True)
    assert code == 0 and result['needed_by'] == needed and 'msg' not in result
