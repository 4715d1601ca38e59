"""The lab's apid speaks the Talos API compiled from the upstream .proto files (lab/talos/proto.py), not the
collection's api.py; and the collection's api.py agrees with those upstream files on the wire (paths, streaming,
field numbers and types) - the check the audit ran by hand, now a test with upstream as the oracle."""
import pathlib

from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import api
from lab.talos import proto

LAB = pathlib.Path(__file__).resolve().parents[2] / 'lab'


def test_no_lab_module_uses_the_collections_talos_api():
    users = [str(path) for path in LAB.rglob('*.py') if '_talos import api' in path.read_text(encoding='utf-8')
             or '_talos.api' in path.read_text(encoding='utf-8')]
    assert users == []


def test_the_collections_methods_are_upstreams():
    for service, ours in (('machine.MachineService', api.MachineService.METHODS), ('storage.StorageService', api.StorageService.METHODS)):
        upstream = dict((method.path, method) for method in proto.methods(service))
        for method in ours:
            assert method.path in upstream, method.path
            theirs = upstream[method.path]
            assert method.request.DESCRIPTOR.full_name == theirs.request.DESCRIPTOR.full_name, method.path
            assert method.reply.DESCRIPTOR.full_name == theirs.reply.DESCRIPTOR.full_name, method.path
            assert method.reply_stream == theirs.reply_stream and not method.request_stream, method.path


def _fields(descriptor):
    return dict((field.number, (field.name, field.type, field.is_repeated if hasattr(field, 'is_repeated') else field.label,
                                field.message_type.full_name if field.message_type else None,
                                field.enum_type.full_name if field.enum_type else None))
                for field in descriptor.fields)


def test_every_message_of_the_collection_has_upstreams_fields():
    checked = 0
    seen = set()
    pending = [method.request.DESCRIPTOR for method in api.MachineService.METHODS + api.StorageService.METHODS]
    pending += [method.reply.DESCRIPTOR for method in api.MachineService.METHODS + api.StorageService.METHODS]
    while pending:
        ours = pending.pop()
        if ours.full_name in seen or ours.full_name.startswith('google.'):
            continue
        seen.add(ours.full_name)
        theirs = proto.POOL.FindMessageTypeByName(ours.full_name)
        upstream_fields = _fields(theirs)
        for number, field in _fields(ours).items():
            assert upstream_fields.get(number) == field, '%s field %d' % (ours.full_name, number)
        for enum in ours.enum_types:
            upstream_enum = theirs.enum_types_by_name[enum.name]
            assert dict((value.name, value.number) for value in enum.values) == dict(
                (value.name, value.number) for value in upstream_enum.values), enum.full_name
        pending += [field.message_type for field in ours.fields if field.message_type is not None]
        checked += 1
    assert checked >= 20
