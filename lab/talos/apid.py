"""A simulated node's apid: the grpclib server on <node address>:50000 and its RPC handlers.

grpclib serves over Python's ssl, so the node presents Ed25519 certificates exactly like Talos
(a grpcio client fails the handshake here as it fails against a real node). Authorization
follows Talos v1.13:

- maintenance mode: TLS without client certificates; every caller is os:reader;
- configured mode: mTLS against the OS CA (machine.ca.crt + machine.acceptedCAs); the roles are
  the client certificate's Organization values; a client certificate whose ExtKeyUsage is not
  exactly [clientAuth] is refused (apid's verifyExtKeyUsage): the connection is closed before
  HTTP/2 starts, as close to Go's failed handshake as Python's ssl lets a server get;
- the roles each RPC allows are machined's `rules` (facts part 1.1); anything else is
  PermissionDenied "not authorized". ApplyConfiguration also admits os:reader, but only in
  maintenance mode.

Replies carry no `metadata` (a direct call, no `nodes` proxying), as apid sends them.
"""

import asyncio
import asyncio.sslproto
import inspect
import logging
import ssl

from grpclib import GRPCError
from grpclib.const import Cardinality, Handler, Status
from grpclib.server import Server
import yaml

from lab.talos import pki, proto
from lab.talos.node import RpcError

LOG = logging.getLogger('lab.talos.apid')

ADMIN = 'os:admin'
OPERATOR = 'os:operator'
READER = 'os:reader'
ETCD_BACKUP = 'os:etcd:backup'

# machined's rules for the RPCs the lab serves; an RPC without an entry is os:admin only.
RULES = {
    '/machine.MachineService/ApplyConfiguration': {ADMIN, READER},
    '/machine.MachineService/Bootstrap': {ADMIN},
    '/machine.MachineService/EtcdLeaveCluster': {ADMIN},
    '/machine.MachineService/EtcdMemberList': {ADMIN, OPERATOR, READER, ETCD_BACKUP},
    '/machine.MachineService/EtcdRemoveMemberByID': {ADMIN},
    '/machine.MachineService/EtcdSnapshot': {ADMIN, OPERATOR, ETCD_BACKUP},
    '/machine.MachineService/EtcdStatus': {ADMIN, OPERATOR, READER, ETCD_BACKUP},
    '/machine.MachineService/Hostname': {ADMIN, OPERATOR, READER},
    '/machine.MachineService/Kubeconfig': {ADMIN},
    '/machine.MachineService/Reboot': {ADMIN, OPERATOR},
    '/machine.MachineService/Reset': {ADMIN},
    '/machine.MachineService/ServiceList': {ADMIN, OPERATOR, READER},
    '/machine.MachineService/Shutdown': {ADMIN, OPERATOR},
    '/machine.MachineService/Upgrade': {ADMIN},
    '/machine.MachineService/Version': {ADMIN, OPERATOR, READER},
    '/storage.StorageService/Disks': {ADMIN, OPERATOR, READER},
    '/cosi.resource.State/List': {ADMIN, OPERATOR, READER},   # machined.go:119
}

NOT_AUTHORIZED = 'not authorized'


def install_tls_alerts():
    """Make asyncio send the TLS alert of a failed handshake before it drops the connection.

    Go's TLS server (apid) tells a client why the handshake failed: `certificate required`
    when no client certificate came, `unknown certificate authority` for one from another CA.
    asyncio (3.11-3.13) closes the socket without flushing that alert, so a client would only see
    EOF. This wraps SSLProtocol._do_handshake to write the pending alert first; it changes nothing
    for successful handshakes. Applied once per process; skipped if asyncio's internals differ.
    """
    protocol_class = getattr(asyncio.sslproto, 'SSLProtocol', None)
    original = getattr(protocol_class, '_do_handshake', None)
    if original is None or getattr(original, 'lab_sends_alerts', False):
        return
    if not hasattr(protocol_class, '_process_outgoing') or not hasattr(protocol_class, '_on_handshake_complete'):
        LOG.warning('asyncio SSLProtocol has no _process_outgoing: TLS alerts are not sent by the lab')
        return

    again_errors = getattr(asyncio.sslproto, 'SSLAgainErrors', (ssl.SSLWantReadError, ssl.SSLSyscallError))

    def _do_handshake(self):
        # asyncio's own body (3.11-3.13), plus _process_outgoing() before reporting a failure.
        try:
            self._sslobj.do_handshake()
        except again_errors:
            self._process_outgoing()
        except ssl.SSLError as exc:
            try:
                self._process_outgoing()
            except Exception:  # pylint: disable=broad-except
                pass
            self._on_handshake_complete(exc)
        else:
            self._on_handshake_complete(None)

    _do_handshake.lab_sends_alerts = True
    protocol_class._do_handshake = _do_handshake


class _ConnectionTrackingServer(Server):
    """grpclib's Server, remembering its connections so that they can be cut.

    With `check_peer` set, each new TLS connection is shown to check_peer(transport) before
    HTTP/2 starts; a False answer closes it (apid's ExtKeyUsage check fails the handshake).
    """

    def __init__(self, handlers, check_peer=None):
        super().__init__(handlers)
        self.lab_protocols = []
        self.check_peer = check_peer

    def _protocol_factory(self):
        protocol = super()._protocol_factory()
        self.lab_protocols = [p for p in self.lab_protocols if not _closed(p)] + [protocol]
        if self.check_peer is not None:
            check = self.check_peer
            connection_made = protocol.connection_made

            def checked_connection_made(transport):
                if check(transport):
                    connection_made(transport)
                else:
                    transport.close()
            protocol.connection_made = checked_connection_made
        return protocol


def _transport(protocol):
    connection = getattr(protocol, 'connection', None)
    return getattr(connection, '_transport', None)


def _closed(protocol):
    transport = _transport(protocol)
    return transport is not None and transport.is_closing()


def _ssl_object(stream):
    return stream.peer._transport.get_extra_info('ssl_object')


class ApidServer(object):
    """The listener of one node's apid."""

    def __init__(self, node, fleet):
        install_tls_alerts()
        self.node = node
        self.fleet = fleet
        self._server = _ConnectionTrackingServer([MachineService(node, fleet), StorageService(node, fleet),
                                                  StateService(node, fleet)],
                                                 check_peer=self._client_certificate_acceptable)

    def _client_certificate_acceptable(self, transport):
        """apid's verifyExtKeyUsage: a client certificate must have ExtKeyUsage exactly [clientAuth]."""
        if self.node.phase == 'maintenance':
            return True
        ssl_object = transport.get_extra_info('ssl_object')
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if der is not None and pki.client_roles(der)[1]:
            return True
        self.fleet.record_request(self.node, '(TLS handshake)', 'BAD_CERTIFICATE', [])
        return False

    async def start(self, host, port, ssl):
        await self._server.start(host, port, ssl=ssl, reuse_address=True)

    async def stop(self, graceful=False):
        """Stop listening and end every connection: flush and close (graceful), or drop (power cut)."""
        self._server.close()
        for protocol in self._server.lab_protocols:
            transport = _transport(protocol)
            if transport is not None and not transport.is_closing():
                if graceful:
                    transport.close()
                else:
                    transport.abort()
        await self._server.wait_closed()


class BlackholeServer(object):
    """The `talos-unreachable` fault: the port accepts TCP but never answers (TLS hangs until the deadline)."""

    def __init__(self):
        self._server = None
        self._writers = set()

    async def _hold(self, reader, writer):
        self._writers.add(writer)
        try:
            while await reader.read(65536):
                pass
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    async def start(self, host, port, ssl=None):
        self._server = await asyncio.start_server(self._hold, host, port, reuse_address=True)

    async def stop(self, graceful=False):
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await self._server.wait_closed()


class _Base(object):
    """RPC plumbing shared by the services: authorization, errors, request log, after-reply actions."""

    SERVICE = ''

    def __init__(self, node, fleet):
        self.node = node
        self.fleet = fleet

    def __mapping__(self):
        mapping = {}
        # the service's methods as Talos's .proto declares them (lab/talos/proto.py), those the lab implements
        for method in proto.methods(self.SERVICE):
            if not hasattr(self, 'rpc_' + method.name):
                continue
            cardinality = Cardinality.UNARY_STREAM if method.reply_stream else Cardinality.UNARY_UNARY
            mapping[method.path] = Handler(self._handler(method), cardinality, method.request, method.reply)
        return mapping

    def _roles(self, stream):
        """The caller's roles: os:reader for everyone in maintenance, else the certificate's Organizations."""
        if self.node.phase == 'maintenance':
            return {READER}
        ssl_object = _ssl_object(stream)
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if der is None:
            return set()
        return set(pki.client_roles(der)[0])

    def _handler(self, method):
        name = method.name
        implementation = getattr(self, 'rpc_' + name)

        async def handle(stream):
            request = await stream.recv_message()
            roles = self._roles(stream)
            code = 'OK'
            deferred = []
            try:
                if self.node.maintenance_server:
                    _v112_maintenance_check(method, roles)
                elif not roles & RULES.get(method.path, {ADMIN}):
                    raise RpcError('PERMISSION_DENIED', NOT_AUTHORIZED)
                replies = implementation(request, roles, lambda function, label: deferred.append((function, label)))
                if inspect.isawaitable(replies):
                    replies = await replies
                for reply in replies:
                    await stream.send_message(reply)
            except asyncio.CancelledError:
                # grpclib's server cancels the handler at the caller's deadline and answers DEADLINE_EXCEEDED
                # (or the caller went away): logged as such.
                self.fleet.record_request(self.node, method.path, 'DEADLINE_EXCEEDED', sorted(roles))
                raise
            except RpcError as exc:
                code = exc.code
                self.fleet.record_request(self.node, method.path, code, sorted(roles))
                raise GRPCError(Status[exc.code], exc.message)
            self.fleet.record_request(self.node, method.path, code, sorted(roles))
            await stream.send_trailing_metadata()
            for function, label in deferred:
                self.node.after_reply(function, label)

        handle.__name__ = name
        return handle


# v1.12's maintenance server (siderolabs/talos v1.12.11 internal/app/maintenance/server.go): it registers
# MachineService, StorageService and COSI State (:67-82) with no authorizer, only the role injector
# (controllers/runtime/maintenance_service.go:129-132, 283-295: os:reader, admin over SideroLink only). Of
# MachineService it implements these (:85-380); Version asks for os:admin and answers a reader Unimplemented (:162-165,
# :384-388); every other method is grpc-go's generated Unimplemented answer
# (pkg/machinery/api/machine/machine_grpc.pb.go:1022, 1070: "method <Name> not implemented").
V112_MAINTENANCE_METHODS = ('ApplyConfiguration', 'GenerateConfiguration', 'GenerateClientConfiguration', 'Version',
                            'Upgrade', 'Reset', 'MetaWrite', 'MetaDelete')


def _v112_maintenance_check(method, roles):
    service = method.path.strip('/').split('/', 1)[0]
    if service == 'machine.MachineService' and method.name not in V112_MAINTENANCE_METHODS:
        raise RpcError('UNIMPLEMENTED', 'method %s not implemented' % method.name)
    if method.name == 'Version' and service == 'machine.MachineService' and ADMIN not in roles:
        raise RpcError('UNIMPLEMENTED', 'API is not implemented in maintenance mode')


class MachineService(_Base):
    """machine.MachineService: the RPCs of Talos's api/machine/machine.proto that the lab serves."""

    SERVICE = 'machine.MachineService'

    def rpc_ApplyConfiguration(self, request, roles, defer):
        if ADMIN not in roles and self.node.phase != 'maintenance':
            raise RpcError('PERMISSION_DENIED', NOT_AUTHORIZED)
        mode_enum = proto.machine.ApplyConfigurationRequest.Mode
        mode = mode_enum.Name(request.mode)
        try_timeout = request.try_mode_timeout.ToTimedelta().total_seconds() if request.HasField('try_mode_timeout') else 60.0
        resolved, details, warnings = self.node.apply_configuration(request.data, mode, request.dry_run, try_timeout, defer)
        reply = proto.machine.ApplyConfigurationResponse()
        reply.messages.add(mode=mode_enum.Value(resolved), mode_details=details, warnings=warnings)
        return [reply]

    def rpc_Bootstrap(self, request, roles, defer):
        self.node.bootstrap()
        reply = proto.machine.BootstrapResponse()
        reply.messages.add()
        return [reply]

    async def rpc_EtcdMemberList(self, request, roles, defer):
        members = await self.node.etcd_members()
        reply = proto.machine.EtcdMemberListResponse()
        entry = reply.messages.add()
        for member in members:
            entry.members.add(id=member.id, hostname=member.hostname, peer_urls=member.peer_urls,
                              client_urls=member.client_urls, is_learner=member.is_learner)
        return [reply]

    async def rpc_EtcdLeaveCluster(self, request, roles, defer):
        await self.node.etcd_leave_cluster()
        reply = proto.machine.EtcdLeaveClusterResponse()
        reply.messages.add()
        return [reply]

    async def rpc_EtcdRemoveMemberByID(self, request, roles, defer):
        await self.node.etcd_remove_member_by_id(request.member_id)
        reply = proto.machine.EtcdRemoveMemberByIDResponse()
        reply.messages.add()
        return [reply]

    async def rpc_EtcdSnapshot(self, request, roles, defer):
        return [proto.common.Data(bytes=chunk) for chunk in await self.node.etcd_snapshot()]

    def rpc_EtcdStatus(self, request, roles, defer):
        status = self.node.etcd_status()
        reply = proto.machine.EtcdStatusResponse()
        reply.messages.add().member_status.CopyFrom(proto.machine.EtcdMemberStatus(**status))
        return [reply]

    def rpc_Hostname(self, request, roles, defer):
        reply = proto.machine.HostnameResponse()
        reply.messages.add(hostname=self.node.hostname)
        return [reply]

    def rpc_Kubeconfig(self, request, roles, defer):
        return [proto.common.Data(bytes=self.node.kubeconfig_archive())]

    def rpc_Reboot(self, request, roles, defer):
        mode = proto.machine.RebootRequest.Mode.Name(request.mode)
        reply = proto.machine.RebootResponse()
        reply.messages.add(actor_id=self.node.reboot(mode, defer))
        return [reply]

    def rpc_Reset(self, request, roles, defer):
        partitions = [(spec.label, spec.wipe) for spec in request.system_partitions_to_wipe]
        wipe_mode = proto.machine.ResetRequest.WipeMode.Name(request.mode)
        actor = self.node.reset(request.graceful, request.reboot, partitions, list(request.user_disks_to_wipe), wipe_mode,
                                defer)
        reply = proto.machine.ResetResponse()
        reply.messages.add(actor_id=actor)
        return [reply]

    def rpc_ServiceList(self, request, roles, defer):
        reply = proto.machine.ServiceListResponse()
        entry = reply.messages.add()
        for service in self.node.service_list():
            entry.services.append(service.to_proto(proto.machine.ServiceInfo))
        return [reply]

    def rpc_Shutdown(self, request, roles, defer):
        reply = proto.machine.ShutdownResponse()
        reply.messages.add(actor_id=self.node.shutdown(defer))
        return [reply]

    def rpc_Upgrade(self, request, roles, defer):
        reboot_mode = proto.machine.UpgradeRequest.RebootMode.Name(request.reboot_mode)
        actor = self.node.upgrade(request.image, request.preserve, request.stage, request.force, reboot_mode, defer)
        reply = proto.machine.UpgradeResponse()
        # v1alpha1_server.go:604-611
        reply.messages.add(ack='Upgrade request received', actor_id=actor)
        return [reply]

    def rpc_Version(self, request, roles, defer):
        info = self.node.version()
        reply = proto.machine.VersionResponse()
        entry = reply.messages.add()
        entry.version.tag = info['tag']
        entry.version.sha = info['sha']
        entry.version.built = info['built']
        entry.version.go_version = info['go_version']
        entry.version.os = info['os']
        entry.version.arch = info['arch']
        entry.platform.name = info['platform']
        entry.platform.mode = info['platform_mode']
        entry.features.rbac = info['rbac']
        return [reply]


class StorageService(_Base):
    """storage.StorageService: Disks."""

    SERVICE = 'storage.StorageService'

    def rpc_Disks(self, request, roles, defer):
        reply = proto.storage.DisksResponse()
        entry = reply.messages.add()
        disk_type = proto.storage.Disk.DiskType
        for disk in self.node.disks():
            values = dict(disk)
            values['type'] = disk_type.Value(values['type'])
            entry.disks.add(**values)
        return [reply]


# Talos' bootstrap manifests as COSI resources (siderolabs/talos v1.13.9 pkg/machinery/resources/k8s/manifest.go:16-17,
# 25-39, 53-58: type Manifests.kubernetes.talos.dev, namespace controlplane, the spec's YAML the list of the objects).
MANIFEST_TYPE = 'Manifests.kubernetes.talos.dev'
MANIFEST_NAMESPACE = 'controlplane'


class StateService(_Base):
    """cosi.resource.State: List of the bootstrap manifests, which `talosctl upgrade-k8s` reads (talos_managed.go:483-498,
    go-kubernetes v0.2.38 kubernetes/manifests/get.go:18-39).

    Each resource as cosi-project/runtime v1.14.1 marshals it (pkg/resource/protobuf/resource.go:83-102, 141-195):
    metadata namespace, type, id, version, owner, phase; the spec as YAML (yaml_spec). Lab differences: proto_spec is
    left empty (talosctl decodes it; the lab's readers take the YAML), version is 1 and owner is
    k8s.ManifestController (Talos counts the resource's updates); List of any other resource type answers
    Unimplemented, as the lab keeps no other COSI resources.
    """

    SERVICE = 'cosi.resource.State'

    async def rpc_List(self, request, roles, defer):
        if request.type != MANIFEST_TYPE:
            raise RpcError('UNIMPLEMENTED', 'the lab serves COSI resources of type %s only' % MANIFEST_TYPE)
        config = self.node.disk.config
        render = self.fleet.manifests
        # the ManifestController runs on control planes only, with the config the node runs (manifest.go)
        if request.namespace != MANIFEST_NAMESPACE or render is None or config is None or not config.control_plane \
                or self.node.phase == 'maintenance':
            return []
        try:
            rendered = await asyncio.get_running_loop().run_in_executor(None, render, config)
        except Exception as exc:  # pylint: disable=broad-except
            # the lab's renderer failed (tools/talos-manifests missing, say): said as such, not as a Talos answer
            raise RpcError('INTERNAL', 'lab: the bootstrap manifests could not be rendered: %s' % exc)
        replies = []
        for manifest_id, objects in sorted(rendered, key=lambda item: item[0]):
            reply = proto.cosi.ListResponse()
            metadata = reply.resource.metadata
            metadata.namespace, metadata.type, metadata.id = MANIFEST_NAMESPACE, MANIFEST_TYPE, manifest_id
            metadata.version, metadata.owner, metadata.phase = '1', 'k8s.ManifestController', 'running'
            reply.resource.spec.yaml_spec = yaml.safe_dump(list(objects), sort_keys=False)
            replies.append(reply)
        return replies
