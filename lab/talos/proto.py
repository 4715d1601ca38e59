"""The Talos API messages the lab's apid serves, compiled from the upstream .proto files.

The lab must not judge the collection with the collection's own code (plugins/module_utils/_talos/api.py is
the collection's hand-kept subset of the API). So the lab takes `api/common/common.proto`,
`api/machine/machine.proto` and `api/storage/storage.proto` from the Talos module at the pinned version,
fetched through the Go module proxy into the Go module cache (`go mod download`), and compiles them with
protoc (grpcio-tools) into a descriptor set kept in the per-machine cache (lab.upstream.cache_root()).
The messages and the method table (path, request and reply types, streaming) are built from that set, in a
private descriptor pool.

The module's zip leaves out `api/vendor`, which holds googleapis' `google/rpc/status.proto`; common.proto
imports it for `common.Metadata.status`, which the lab never fills. Its one message is declared here from
googleapis' published definition (package google.rpc, message Status: code = 1 int32, message = 2 string,
details = 3 repeated google.protobuf.Any).

COSI's State API (package cosi.resource), which machined serves beside MachineService, comes from another module
(github.com/cosi-project/runtime v1.14.1, the version Talos v1.13.9 pins) whose zip has the generated Go
(api/v1alpha1/resource.pb.go, state.pb.go) but not the .proto files; its messages are declared here from the field
tags of that Go code (see _cosi_files), only the fields the lab reads or sends.

    from lab.talos import proto
    proto.machine.VersionResponse()          # message classes by package
    proto.methods('machine.MachineService')  # [Method(path, name, request, reply, reply_stream)]
"""

import collections
import json
import os
import pathlib
import subprocess
import tempfile

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from lab import upstream

TALOS_MODULE = 'github.com/siderolabs/talos'
TALOS_VERSION = 'v1.13.9'
PROTO_FILES = ('common/common.proto', 'machine/machine.proto', 'storage/storage.proto')

Method = collections.namedtuple('Method', 'path name request reply reply_stream')


class ProtoError(Exception):
    """The upstream .proto files could not be fetched or compiled; says what to run."""


def module_dir():
    """The directory of the Talos module source in the Go module cache (downloaded through the proxy if needed)."""
    spec = '%s@%s' % (TALOS_MODULE, TALOS_VERSION)
    try:
        done = subprocess.run(['go', 'mod', 'download', '-json', spec], capture_output=True, check=False, timeout=600,
                              cwd=tempfile.gettempdir(), env=dict(os.environ, GOFLAGS='-mod=mod'))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProtoError('go mod download %s: %s (Go and the Go module proxy are needed)' % (spec, exc))
    try:
        answer = json.loads(done.stdout or b'{}')
    except ValueError:
        answer = {}
    if done.returncode != 0 or not answer.get('Dir'):
        raise ProtoError('go mod download %s failed: %s' % (spec, answer.get('Error') or done.stderr.decode('utf-8', 'replace')))
    return pathlib.Path(answer['Dir'])


def _status_file():
    """google/rpc/status.proto as a FileDescriptorProto (see the module docstring)."""
    field = descriptor_pb2.FieldDescriptorProto
    status = descriptor_pb2.FileDescriptorProto(name='google/rpc/status.proto', package='google.rpc', syntax='proto3',
                                                dependency=['google/protobuf/any.proto'])
    message = status.message_type.add(name='Status')
    message.field.add(name='code', number=1, type=field.TYPE_INT32, label=field.LABEL_OPTIONAL, json_name='code')
    message.field.add(name='message', number=2, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL, json_name='message')
    message.field.add(name='details', number=3, type=field.TYPE_MESSAGE, label=field.LABEL_REPEATED,
                      type_name='.google.protobuf.Any', json_name='details')
    return status


def _compile(out):
    """protoc over the upstream files into the descriptor set `out` (imports included)."""
    from grpc_tools import protoc  # pylint: disable=import-outside-toplevel
    import grpc_tools  # pylint: disable=import-outside-toplevel
    api_dir = module_dir() / 'api'
    missing = [name for name in PROTO_FILES if not (api_dir / name).is_file()]
    if missing:
        raise ProtoError('%s@%s has no %s' % (TALOS_MODULE, TALOS_VERSION, ', '.join(missing)))
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), '_proto')
    with tempfile.TemporaryDirectory() as scratch:
        status_set = os.path.join(scratch, 'status.binpb')
        any_proto = descriptor_pb2.FileDescriptorProto()
        from google.protobuf import any_pb2  # pylint: disable=import-outside-toplevel
        any_pb2.DESCRIPTOR.CopyToProto(any_proto)
        with open(status_set, 'wb') as handle:
            handle.write(descriptor_pb2.FileDescriptorSet(file=[any_proto, _status_file()]).SerializeToString())
        written = os.path.join(scratch, 'talos.binpb')
        code = protoc.main(['protoc', '--descriptor_set_in=%s' % status_set, '-I%s' % api_dir, '-I%s' % well_known,
                            '--include_imports', '--descriptor_set_out=%s' % written] + list(PROTO_FILES))
        if code != 0:
            raise ProtoError('protoc could not compile %s from %s (exit %d)' % (', '.join(PROTO_FILES), api_dir, code))
        out.parent.mkdir(parents=True, exist_ok=True)
        # written beside the entry and renamed into place: processes compiling at once each rename a whole file
        handle, partial = tempfile.mkstemp(prefix='.building-', dir=str(out.parent))
        with os.fdopen(handle, 'wb') as target, open(written, 'rb') as source:
            target.write(source.read())
        os.replace(partial, str(out))


def descriptor_set():
    """The compiled FileDescriptorSet (compiled once per machine, then read from the cache)."""
    path = upstream.cache_root() / 'proto' / ('talos-api-%s.binpb' % TALOS_VERSION)
    if not path.is_file():
        _compile(path)
    files = descriptor_pb2.FileDescriptorSet()
    files.ParseFromString(path.read_bytes())
    return files


def _cosi_files():
    """cosi.resource's List messages and State service (cosi-project/runtime v1.14.1): Metadata (resource.pb.go:110-119,
    without finalizers, labels and annotations, which the lab never sends), Spec (:235-240), Resource (:290-293),
    ListRequest (state.pb.go:308-311, without options), ListResponse (:420-422), and State.List, a server stream
    (state_grpc.pb.go:25, 351-355)."""
    field = descriptor_pb2.FieldDescriptorProto
    resource = descriptor_pb2.FileDescriptorProto(name='cosi/resource.proto', package='cosi.resource', syntax='proto3',
                                                  dependency=['google/protobuf/timestamp.proto'])

    def add(message, name, number, kind, type_name=None):
        entry = message.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL, json_name=name)
        if type_name:
            entry.type_name = type_name
    metadata = resource.message_type.add(name='Metadata')
    for number, name in enumerate(('namespace', 'type', 'id', 'version', 'owner', 'phase'), 1):
        add(metadata, name, number, field.TYPE_STRING)
    add(metadata, 'created', 7, field.TYPE_MESSAGE, '.google.protobuf.Timestamp')
    add(metadata, 'updated', 8, field.TYPE_MESSAGE, '.google.protobuf.Timestamp')
    spec = resource.message_type.add(name='Spec')
    add(spec, 'proto_spec', 1, field.TYPE_BYTES)
    add(spec, 'yaml_spec', 2, field.TYPE_STRING)
    whole = resource.message_type.add(name='Resource')
    add(whole, 'metadata', 1, field.TYPE_MESSAGE, '.cosi.resource.Metadata')
    add(whole, 'spec', 2, field.TYPE_MESSAGE, '.cosi.resource.Spec')
    state = descriptor_pb2.FileDescriptorProto(name='cosi/state.proto', package='cosi.resource', syntax='proto3',
                                               dependency=['cosi/resource.proto'])
    request = state.message_type.add(name='ListRequest')
    add(request, 'namespace', 1, field.TYPE_STRING)
    add(request, 'type', 2, field.TYPE_STRING)
    reply = state.message_type.add(name='ListResponse')
    add(reply, 'resource', 1, field.TYPE_MESSAGE, '.cosi.resource.Resource')
    service = state.service.add(name='State')
    service.method.add(name='List', input_type='.cosi.resource.ListRequest', output_type='.cosi.resource.ListResponse',
                       server_streaming=True)
    return [resource, state]


def _build():
    pool = descriptor_pool.DescriptorPool()
    names = set()
    for file_proto in descriptor_set().file:
        if file_proto.name not in names:
            pool.Add(file_proto)
            names.add(file_proto.name)
    if 'google/rpc/status.proto' not in names:
        pool.Add(_status_file())
    if 'google/protobuf/timestamp.proto' not in names:
        from google.protobuf import timestamp_pb2  # pylint: disable=import-outside-toplevel
        timestamp = descriptor_pb2.FileDescriptorProto()
        timestamp_pb2.DESCRIPTOR.CopyToProto(timestamp)
        pool.Add(timestamp)
    for file_proto in _cosi_files():
        pool.Add(file_proto)
    return pool


POOL = _build()


class _Package(object):
    """Message classes of one proto package, by name: proto.machine.VersionResponse."""

    def __init__(self, package):
        self._package = package

    def __getattr__(self, name):
        if name.startswith('_'):
            raise AttributeError(name)
        try:
            descriptor = POOL.FindMessageTypeByName('%s.%s' % (self._package, name))
        except KeyError:
            raise AttributeError('%s.%s is not a message of the upstream .proto files' % (self._package, name))
        return message_factory.GetMessageClass(descriptor)


common = _Package('common')
machine = _Package('machine')
storage = _Package('storage')
protobuf = _Package('google.protobuf')
cosi = _Package('cosi.resource')


def methods(service_name):
    """The methods of a service ('machine.MachineService') as the upstream file declares them."""
    service = POOL.FindServiceByName(service_name)
    return [Method('/%s/%s' % (service.full_name, method.name), method.name,
                   message_factory.GetMessageClass(method.input_type), message_factory.GetMessageClass(method.output_type),
                   bool(method.server_streaming))
            for method in service.methods]
