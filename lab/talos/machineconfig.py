"""How a simulated Talos node reads a machine config: with Talos's own code.

Decoding and validation are Talos's: the node runs tools/talos-machinery (pkg/machinery at the pinned
version, built by `make setup`), which does what a node's ApplyConfiguration does with the bytes
(siderolabs/talos v1.13.9 internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:207-226):
configloader.NewFromBytes (strict decoding: unknown keys, types, and the keys Talos accepts but leaves
out of its schema, such as the legacy machine.registries), then Container.Validate in the metal mode
with the node's installed state (the modeWrapper of v1alpha1_server.go:165-173). A refusal is that
error text, answered with InvalidArgument (v1alpha1_server.go:209, 226). RuntimeValidate (checks
against the node's live resources) is not run.

A dry run's diff is Talos's too: configdiff.DiffConfigs of the running and the new config
(v1alpha1_server.go:351-362), with no redaction, as Talos sends it.

After the config is accepted the lab reads the YAML itself, only to know what the node is (its type,
CAs, hostname, install disk ...).
"""

import copy
import json
import subprocess

import yaml

from lab import upstream

MACHINERY = 'talos-machinery'
# Talos' default Kubernetes version (siderolabs/talos v1.13.9 pkg/machinery/constants/constants.go:366, DefaultKubernetesVersion):
# the images of a config that names none.
DEFAULT_KUBERNETES = '1.36.3'
# The cluster key of each control-plane component's config (its image: cluster.<key>.image).
COMPONENT_KEYS = {'kube-apiserver': 'apiServer', 'kube-controller-manager': 'controllerManager',
                  'kube-scheduler': 'scheduler', 'kube-proxy': 'proxy'}


class ConfigError(Exception):
    """The config was refused; the message is what Talos would say. stage: 'decode' (configloader.NewFromBytes
    refused it) or 'validate' (Validate did), as talos-machinery says; None for the lab's own refusal."""

    def __init__(self, message, stage=None):
        super().__init__(message)
        self.stage = stage


def _machinery(command, text):
    """Run tools/talos-machinery with text on stdin; its JSON answer."""
    done = subprocess.run([upstream.binary(MACHINERY)] + command, input=text, capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError('talos-machinery %s failed: %s' % (' '.join(command), done.stderr.decode('utf-8', 'replace')))
    return json.loads(done.stdout)


def _get(tree, *path):
    for key in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree


class MachineConfig(object):
    """A parsed, validated config: its documents and the values the simulated node uses."""

    def __init__(self, documents, data=''):
        self.documents = documents
        self.data = data
        self.v1alpha1 = next((doc for doc in documents if 'kind' not in doc), None)

    @property
    def machine(self):
        return self.v1alpha1.get('machine') or {}

    @property
    def cluster(self):
        return self.v1alpha1.get('cluster') or {}

    @property
    def machine_type(self):
        return 'controlplane' if self.machine.get('type') == 'init' else self.machine.get('type')

    @property
    def control_plane(self):
        return self.machine_type == 'controlplane'

    @property
    def cluster_id(self):
        return self.cluster.get('id') or ''

    @property
    def cluster_name(self):
        return self.cluster.get('clusterName') or ''

    @property
    def endpoint(self):
        return _get(self.cluster, 'controlPlane', 'endpoint') or ''

    @property
    def os_ca(self):
        """(crt PEM, key PEM or None) of machine.ca, base64-decoded."""
        return _b64_pem(_get(self.machine, 'ca', 'crt')), _b64_pem(_get(self.machine, 'ca', 'key'))

    @property
    def accepted_cas(self):
        return [_b64_pem(entry.get('crt')) for entry in self.machine.get('acceptedCAs') or [] if entry.get('crt')]

    @property
    def k8s_accepted_cas(self):
        """cluster.acceptedCAs: the Kubernetes CA certificates trusted besides the issuing one."""
        return [_b64_pem(entry.get('crt')) for entry in self.cluster.get('acceptedCAs') or [] if entry.get('crt')]

    @property
    def k8s_ca(self):
        return _b64_pem(_get(self.cluster, 'ca', 'crt')), _b64_pem(_get(self.cluster, 'ca', 'key'))

    @property
    def cert_sans(self):
        return list(self.machine.get('certSANs') or [])

    @property
    def install_disk(self):
        return _get(self.machine, 'install', 'disk') or ''

    @property
    def install_image(self):
        """machine.install.image: the installer the install (and an upgrade) runs."""
        return _get(self.machine, 'install', 'image') or ''

    @property
    def kubelet_image(self):
        """machine.kubelet.image: Talos' KubeletSpec takes it as is (siderolabs/talos v1.13.9
        internal/app/machined/pkg/controllers/k8s/kubelet_spec.go:221); a config without it gets Talos' default."""
        return _get(self.machine, 'kubelet', 'image') or 'ghcr.io/siderolabs/kubelet:v%s' % DEFAULT_KUBERNETES

    def component_image(self, component):
        """cluster.apiServer/controllerManager/scheduler/proxy.image (control_plane_static_pod.go:485, :670, :865
        put it into the static pod as is), else Talos' default for the component."""
        key = COMPONENT_KEYS[component]
        return _get(self.cluster, key, 'image') or 'registry.k8s.io/%s:v%s' % (component, DEFAULT_KUBERNETES)

    @property
    def hostname(self):
        """An explicit hostname (HostnameConfig.hostname or legacy machine.network.hostname), or None."""
        for doc in self.documents:
            if doc.get('kind') == 'HostnameConfig' and doc.get('hostname'):
                return doc['hostname']
        return _get(self.machine, 'network', 'hostname') or None

    def text(self):
        """The config as the node stores it (the bytes it was applied with)."""
        return self.data


def image_version(image):
    """The version of an image reference's tag, as compatibility.VersionFromImageRef reads it (the tag after the last
    ':' of the name, digest dropped): 'v1.36.3' for registry.k8s.io/kube-apiserver:v1.36.3, '' without a tag."""
    name = (image or '').split('@', 1)[0]
    tag = name.rsplit(':', 1)[1] if ':' in name.rsplit('/', 1)[-1] else ''
    return tag if tag.startswith('v') or not tag else 'v' + tag


def _b64_pem(value):
    import base64  # pylint: disable=import-outside-toplevel
    if not value:
        return None
    try:
        return base64.b64decode(value)
    except (ValueError, TypeError):
        return None


def parse(data, installed):
    """Decode and validate a config as Talos does: (MachineConfig, warnings), or ConfigError with Talos's text.

    installed: the node already has Talos on its disk (then machine.install is not required).
    """
    if isinstance(data, str):
        data = data.encode('utf-8')
    answer = _machinery(['check', '--installed'] if installed else ['check'], bytes(data))
    if answer.get('error'):
        raise ConfigError(answer['error'], stage=answer.get('stage'))
    if not answer['v1alpha1']:
        # v1alpha1_server.go:213-217 refuses this outside maintenance mode only; the lab refuses it in maintenance mode
        # too (a known difference: its nodes need the document to know what they are)
        raise ConfigError("the applied machine configuration doesn't contain v1alpha1 config, "
                          "did you mean to patch the machine config instead?")
    documents = [doc for doc in yaml.safe_load_all(data.decode('utf-8')) if isinstance(doc, dict)]
    return MachineConfig(documents, data.decode('utf-8')), list(answer['warnings'])


# What a running node can take without a reboot: CanApplyImmediate (siderolabs/talos v1.13.9
# internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_runtime.go:130-217) copies these parts of the running v1alpha1
# document into the new one (:175-204) and refuses the change when the two still differ (:207-213). Everything else
# (machine.type, token, env, files, udev, disks, other features, persist...) needs a reboot; documents other than
# v1alpha1 are not compared.
IMMEDIATE_TOP = ('debug', 'cluster')
IMMEDIATE_MACHINE = ('ca', 'acceptedCAs', 'time', 'certSANs', 'install', 'network', 'sysfs', 'sysctls', 'logging',
                     'controlPlane', 'kubelet', 'kernel', 'registries', 'pods', 'seccompProfiles', 'nodeAnnotations',
                     'nodeLabels', 'nodeTaints')
# Copied only when both configs have machine.features (:198).
IMMEDIATE_FEATURES = ('kubernetesTalosAPIAccess', 'kubePrism', 'hostDNS', 'imageCache', 'nodeAddressSortAlgorithm')


def _take(source, target, key):
    if key in source:
        target[key] = copy.deepcopy(source[key])
    else:
        target.pop(key, None)


def _immediate_view(current, new):
    """The new v1alpha1 document with the live-changeable parts of the current one (the DeepCopy at :147)."""
    new = copy.deepcopy(new)
    for key in IMMEDIATE_TOP:
        _take(current, new, key)
    machine, running = new.get('machine'), current.get('machine')
    if isinstance(machine, dict) and isinstance(running, dict):
        for key in IMMEDIATE_MACHINE:
            _take(running, machine, key)
        if isinstance(machine.get('features'), dict) and isinstance(running.get('features'), dict):
            for key in IMMEDIATE_FEATURES:
                _take(running['features'], machine['features'], key)
    return new


def immediate_refusal(old, new):
    """None when CanApplyImmediate lets `new` apply to a node running `old`, else its error text (with the diff)."""
    if old is None:
        return None
    current = old.v1alpha1
    masked = _immediate_view(current, new.v1alpha1)
    if current == masked:
        return None
    # :208-213: configdiff.DiffConfigs of the two v1alpha1 documents (Talos's own code, unredacted)
    texts = {'old': yaml.safe_dump(current, sort_keys=False), 'new': yaml.safe_dump(masked, sort_keys=False)}
    text = _machinery(['diff'], json.dumps(texts).encode('utf-8'))['diff']
    return "this config change can't be applied in immediate mode\ndiff:\n%s" % text


def diff(old, new):
    """The config diff of a dry run, Talos's own text (configdiff.DiffConfigs), or "No changes."."""
    texts = {'old': old.text() if old is not None else '', 'new': new.text()}
    text = _machinery(['diff'], json.dumps(texts).encode('utf-8'))['diff']
    return text.rstrip('\n') if text else 'No changes.'
