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


def _build():
    pool = descriptor_pool.DescriptorPool()
    names = set()
    for file_proto in descriptor_set().file:
        if file_proto.name not in names:
            pool.Add(file_proto)
            names.add(file_proto.name)
    if 'google/rpc/status.proto' not in names:
        pool.Add(_status_file())
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


def methods(service_name):
    """The methods of a service ('machine.MachineService') as the upstream file declares them."""
    service = POOL.FindServiceByName(service_name)
    return [Method('/%s/%s' % (service.full_name, method.name), method.name,
                   message_factory.GetMessageClass(method.input_type), message_factory.GetMessageClass(method.output_type),
                   bool(method.server_streaming))
            for method in service.methods]
