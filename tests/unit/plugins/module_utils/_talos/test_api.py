"""The generated Talos API module: up to date, wire-compatible with upstream, importable without protobuf."""
import os
import subprocess
import sys
import textwrap

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import api

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..', '..', '..'))
sys.path.insert(0, os.path.join(ROOT, 'scripts'))
import gen_talos_api  # noqa: E402  pylint: disable=wrong-import-position


def fields(message_class):
    return dict((field.name, field.number) for field in message_class.DESCRIPTOR.fields)


def test_committed_api_py_is_what_the_generator_writes():
    text = gen_talos_api.render(gen_talos_api.compile_descriptor_set(gen_talos_api.PROTO_ROOT, gen_talos_api.PROTO_FILES))
    with open(gen_talos_api.OUTPUT, encoding='utf-8') as handle:
        assert handle.read() == text, 'api.py is stale: run make protos'


def test_generated_module_keeps_lines_short():
    with open(gen_talos_api.OUTPUT, encoding='utf-8') as handle:
        longest = max(len(line.rstrip('\n')) for line in handle)
    assert longest <= 160


@pytest.mark.parametrize('message_class, expected', [
    (api.machine.ApplyConfigurationRequest, {'data': 1, 'mode': 4, 'dry_run': 5, 'try_mode_timeout': 6}),
    (api.machine.ApplyConfiguration, {'metadata': 1, 'warnings': 2, 'mode': 3, 'mode_details': 4}),
    (api.machine.BootstrapRequest, {'recover_etcd': 1, 'recover_skip_hash_check': 2}),
    (api.machine.UpgradeRequest, {'image': 1, 'preserve': 2, 'stage': 3, 'force': 4, 'reboot_mode': 5}),
    (api.machine.Upgrade, {'metadata': 1, 'ack': 2, 'actor_id': 3}),
    (api.machine.EtcdRemoveMemberByIDRequest, {'member_id': 1}),
    (api.machine.EtcdMember, {'id': 2, 'hostname': 3, 'peer_urls': 4, 'client_urls': 5, 'is_learner': 6}),
    (api.machine.EtcdMembers, {'metadata': 1, 'legacy_members': 2, 'members': 3}),
    (api.machine.EtcdMemberStatus, {'protocol_version': 1, 'db_size': 2, 'db_size_in_use': 3, 'leader': 4, 'raft_index': 5,
                                    'raft_term': 6, 'raft_applied_index': 7, 'errors': 8, 'is_learner': 9,
                                    'member_id': 10, 'storage_version': 11}),
    (api.machine.ServiceInfo, {'id': 1, 'state': 2, 'events': 3, 'health': 4}),
    (api.machine.ServiceEvent, {'msg': 1, 'state': 2, 'ts': 3}),
    (api.machine.ServiceHealth, {'unknown': 1, 'healthy': 2, 'last_message': 3, 'last_change': 4}),
    (api.machine.Version, {'metadata': 1, 'version': 2, 'platform': 3, 'features': 4}),
    (api.machine.VersionInfo, {'tag': 1, 'sha': 2, 'built': 3, 'go_version': 4, 'os': 5, 'arch': 6}),
    (api.machine.ResetRequest, {'graceful': 1, 'reboot': 2, 'system_partitions_to_wipe': 3, 'user_disks_to_wipe': 4,
                                'mode': 5}),
    (api.machine.Reboot, {'metadata': 1, 'actor_id': 2}),
    (api.machine.ShutdownRequest, {'force': 1}),
    (api.machine.Hostname, {'metadata': 1, 'hostname': 2}),
    (api.common.Metadata, {'hostname': 1, 'error': 2, 'status': 3}),
    (api.common.Data, {'metadata': 1, 'bytes': 2}),
    (api.google_rpc.Status, {'code': 1, 'message': 2, 'details': 3}),
    # cosi-project/runtime v1.14.1 api/v1alpha1/resource.pb.go:110-122, 235-240, 290-293; state.pb.go:308-312, 420-422
    (api.cosi_resource.Metadata, {'namespace': 1, 'type': 2, 'id': 3, 'version': 4, 'owner': 5, 'phase': 6, 'created': 7,
                                  'updated': 8, 'finalizers': 9, 'labels': 10, 'annotations': 11}),
    (api.cosi_resource.Spec, {'proto_spec': 1, 'yaml_spec': 2}),
    (api.cosi_resource.Resource, {'metadata': 1, 'spec': 2}),
    (api.cosi_resource.ListRequest, {'namespace': 1, 'type': 2, 'options': 3}),
    (api.cosi_resource.ListResponse, {'resource': 1}),
    (api.storage.Disk, {'size': 1, 'model': 2, 'device_name': 3, 'name': 4, 'serial': 5, 'modalias': 6, 'uuid': 7,
                        'wwid': 8, 'type': 9, 'bus_path': 10, 'system_disk': 11, 'subsystem': 12, 'readonly': 13}),
])
def test_field_numbers_follow_upstream(message_class, expected):
    assert fields(message_class) == expected


def test_enum_values_follow_upstream():
    mode = api.machine.ApplyConfigurationRequest.Mode
    assert [(name, mode.Value(name)) for name in ('REBOOT', 'AUTO', 'NO_REBOOT', 'STAGED', 'TRY')] == [
        ('REBOOT', 0), ('AUTO', 1), ('NO_REBOOT', 2), ('STAGED', 3), ('TRY', 4)]
    assert dict(api.machine.RebootRequest.Mode.items()) == {'DEFAULT': 0, 'POWERCYCLE': 1, 'FORCE': 2}
    assert dict(api.machine.ResetRequest.WipeMode.items()) == {'ALL': 0, 'SYSTEM_DISK': 1, 'USER_DISKS': 2}
    assert api.storage.Disk.DiskType.Value('CD') == 5


def test_apply_request_bytes_on_the_wire():
    request = api.machine.ApplyConfigurationRequest(data=b'x', mode=api.machine.ApplyConfigurationRequest.AUTO, dry_run=True)
    request.try_mode_timeout.FromSeconds(60)
    # field 1 bytes "x", field 4 varint 1, field 5 varint 1, field 6 message {seconds: 60}
    assert request.SerializeToString() == b'\x0a\x01x' b'\x20\x01' b'\x28\x01' b'\x32\x02\x08\x3c'


def test_etcd_member_id_is_field_2_on_the_wire():
    assert api.machine.EtcdMember(id=5).SerializeToString() == b'\x10\x05'


def test_method_table():
    paths = dict((method.name, method) for method in api.MachineService.METHODS)
    assert set(paths) == {'ApplyConfiguration', 'Bootstrap', 'EtcdLeaveCluster', 'EtcdMemberList', 'EtcdRemoveMemberByID',
                          'EtcdSnapshot', 'EtcdStatus', 'Hostname', 'Kubeconfig', 'Reboot', 'Reset', 'ServiceList',
                          'Shutdown', 'Upgrade', 'Version'}
    assert api.MachineService.EtcdSnapshot.reply is api.common.Data and api.MachineService.EtcdSnapshot.reply_stream
    assert not api.MachineService.Upgrade.reply_stream
    assert api.MachineService.Version.path == '/machine.MachineService/Version'
    assert api.MachineService.Version.request is api.protobuf.Empty
    assert api.MachineService.Kubeconfig.reply is api.common.Data
    assert api.MachineService.Kubeconfig.reply_stream and not api.MachineService.Version.reply_stream
    assert api.StorageService.Disks.path == '/storage.StorageService/Disks'
    assert api.StorageService.Disks.reply is api.storage.DisksResponse
    assert api.State.List.path == '/cosi.resource.State/List' and api.State.List.reply_stream
    assert api.State.List.request is api.cosi_resource.ListRequest and api.State.List.reply is api.cosi_resource.ListResponse
    assert api.SERVICES == (api.StorageService, api.MachineService, api.State)


def test_private_pool_does_not_touch_the_default_pool():
    from google.protobuf import descriptor_pool
    with pytest.raises(KeyError):
        descriptor_pool.Default().FindMessageTypeByName('machine.ApplyConfigurationRequest')


def test_well_known_types_keep_their_helpers():
    event = api.machine.ServiceEvent()
    event.ts.FromSeconds(1700000000)
    assert event.ts.ToDatetime().year == 2023


def test_imports_without_protobuf(tmp_path):
    """The sanity import test loads module_utils without third-party packages: api.py must still import."""
    script = textwrap.dedent('''
        import sys
        class Block(object):
            def find_spec(self, name, path=None, target=None):
                if name == 'google' or name.startswith('google.'):
                    raise ImportError('blocked ' + name)
                return None
        sys.meta_path.insert(0, Block())
        sys.path.insert(0, %r)
        from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import api
        assert api.HAS_PROTOBUF is False and 'blocked' in api.PROTOBUF_IMPORT_ERROR
        assert api.machine.Version is None and api.MachineService.Version.request is None
        print('ok')
    ''') % os.path.join(ROOT, '.collections')
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'ok'
