"""Machine-config rendering for v1.12/v1.13: layout, defaults, patches, validity, determinism."""
import base64
import copy

import pytest

from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ValidationError
from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import config, pki, secrets, talosyaml

CLUSTER = {
    'name': 'lab',
    'endpoint': 'https://127.0.10.10:6443',
    'pod_subnets': ['10.244.0.0/16'],
    'service_subnets': ['10.96.0.0/12'],
    'cert_sans': ['api.lab.example', '127.0.10.10'],
    'vip': '127.0.10.10',
    'inline_manifests': [{'name': 'cilium', 'contents': 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cilium\n'}],
    'extra_manifests': ['https://example.com/crds.yaml'],
    'allow_scheduling_on_control_planes': True,
}
CP_NODE = {'hostname': 'cp-1', 'ip': '127.0.10.11', 'prefix': 24, 'gateway': '127.0.10.1', 'install_disk': '/dev/vda'}
WORKER_NODE = {'hostname': 'worker-1', 'ip': '127.0.10.21', 'prefix': 24}
VERSIONS = [('v1.13.9', '1.13'), ('v1.12.11', '1.12')]
PATCHES = {
    'cluster': [{'machine': {'sysctls': {'net.core.somaxconn': '65535'}}}],
    'group': [[{'op': 'add', 'path': '/machine/certSANs/-', 'value': 'group.example'}]],
    'host': ['apiVersion: v1alpha1\nkind: ResolverConfig\nnameservers:\n  - address: 1.1.1.1\n'
             '---\nmachine:\n  nodeAnnotations:\n    host: "yes"\n'],
}


def render(bundle, machine_type='controlplane', cluster=None, node=None, patches=None, talos_version='v1.13.9', **kwargs):
    return config.render_machine_config(bundle, machine_type, CLUSTER if cluster is None else cluster,
                                        CP_NODE if node is None else node, patches=patches,
                                        talos_version=talos_version, **kwargs)


def documents(text):
    return talosyaml.load_all(text, 'config')


def v1(text):
    return documents(text)[0]


def kinds(text):
    return [doc.get('kind', 'v1alpha1') for doc in documents(text)]


# --- layout and defaults -------------------------------------------------------------------------

def test_controlplane_layout_follows_gen_config(bundle):
    doc = v1(render(bundle))
    assert list(doc) == ['version', 'debug', 'persist', 'machine', 'cluster']
    assert list(doc['machine']) == ['type', 'token', 'ca', 'certSANs', 'kubelet', 'install', 'features', 'nodeLabels']
    assert list(doc['cluster']) == [
        'id', 'secret', 'controlPlane', 'clusterName', 'network', 'token', 'secretboxEncryptionSecret', 'ca',
        'aggregatorCA', 'serviceAccount', 'apiServer', 'controllerManager', 'proxy', 'scheduler', 'discovery', 'etcd',
        'extraManifests', 'inlineManifests', 'allowSchedulingOnControlPlanes']
    assert doc['version'] == 'v1alpha1' and doc['debug'] is False and doc['persist'] is True


def test_controlplane_values(bundle):
    doc = v1(render(bundle))
    machine, cluster = doc['machine'], doc['cluster']
    assert machine['type'] == 'controlplane'
    assert machine['token'] == bundle.trustd_token
    assert base64.b64decode(machine['ca']['crt']) == bundle.certs['os']['crt']
    assert base64.b64decode(machine['ca']['key']) == bundle.certs['os']['key']
    assert machine['certSANs'] == ['api.lab.example', '127.0.10.10']
    assert machine['kubelet'] == {'image': 'ghcr.io/siderolabs/kubelet:v1.36.3', 'defaultRuntimeSeccompProfileEnabled': True,
                                  'disableManifestsDirectory': True}
    assert machine['install'] == {'disk': '/dev/vda', 'image': 'ghcr.io/siderolabs/installer:v1.13.9', 'wipe': False,
                                  'grubUseUKICmdline': True}
    assert machine['features'] == {'diskQuotaSupport': True, 'kubePrism': {'enabled': True, 'port': 7445},
                                   'hostDNS': {'enabled': True, 'forwardKubeDNSToHost': True}}
    assert machine['nodeLabels'] == {'node.kubernetes.io/exclude-from-external-load-balancers': ''}
    assert cluster['id'] == bundle.cluster_id and cluster['secret'] == bundle.cluster_secret
    assert cluster['controlPlane'] == {'endpoint': 'https://127.0.10.10:6443'}
    assert cluster['clusterName'] == 'lab'
    assert cluster['network'] == {'cni': {'name': 'none'}, 'dnsDomain': 'cluster.local',
                                  'podSubnets': ['10.244.0.0/16'], 'serviceSubnets': ['10.96.0.0/12']}
    assert cluster['token'] == bundle.bootstrap_token
    assert cluster['secretboxEncryptionSecret'] == bundle.secretbox_secret
    assert base64.b64decode(cluster['ca']['key']) == bundle.certs['k8s']['key']
    assert base64.b64decode(cluster['aggregatorCA']['crt']) == bundle.certs['k8saggregator']['crt']
    assert base64.b64decode(cluster['serviceAccount']['key']) == bundle.certs['k8sserviceaccount']['key']
    assert base64.b64decode(cluster['etcd']['ca']['key']) == bundle.certs['etcd']['key']
    assert cluster['apiServer']['image'] == 'registry.k8s.io/kube-apiserver:v1.36.3'
    assert cluster['apiServer']['certSANs'] == ['127.0.10.10', 'api.lab.example']
    assert cluster['apiServer']['admissionControl'][0]['name'] == 'PodSecurity'
    assert cluster['apiServer']['auditPolicy'] == {'apiVersion': 'audit.k8s.io/v1', 'kind': 'Policy', 'rules': [{'level': 'Metadata'}]}
    assert cluster['proxy'] == {'disabled': True, 'image': 'registry.k8s.io/kube-proxy:v1.36.3'}
    assert cluster['controllerManager'] == {'image': 'registry.k8s.io/kube-controller-manager:v1.36.3'}
    assert cluster['scheduler'] == {'image': 'registry.k8s.io/kube-scheduler:v1.36.3'}
    assert cluster['discovery'] == {'enabled': True, 'registries': {'kubernetes': {'disabled': True}, 'service': {}}}
    assert cluster['inlineManifests'] == CLUSTER['inline_manifests']
    assert cluster['extraManifests'] == ['https://example.com/crds.yaml']
    assert cluster['allowSchedulingOnControlPlanes'] is True


def test_extra_documents_for_hostname_address_and_vip(bundle):
    docs = documents(render(bundle))
    assert docs[1:] == [
        {'apiVersion': 'v1alpha1', 'kind': 'HostnameConfig', 'hostname': 'cp-1'},
        {'apiVersion': 'v1alpha1', 'kind': 'LinkConfig', 'name': 'ens18',
         'addresses': [{'address': '127.0.10.11/24'}], 'routes': [{'gateway': '127.0.10.1'}]},
        {'apiVersion': 'v1alpha1', 'kind': 'Layer2VIPConfig', 'name': '127.0.10.10', 'link': 'ens18'},
    ]


def test_minimal_node_gets_stable_hostname_and_default_disk(bundle):
    text = render(bundle, cluster={'name': 'c1', 'endpoint': '10.0.0.5'}, node={})
    docs = documents(text)
    assert docs[1:] == [{'apiVersion': 'v1alpha1', 'kind': 'HostnameConfig', 'auto': 'stable'}]
    doc = docs[0]
    assert doc['machine']['install']['disk'] == '/dev/sda'
    assert doc['cluster']['controlPlane']['endpoint'] == 'https://10.0.0.5:6443'
    assert doc['machine']['certSANs'] == [] and doc['cluster']['apiServer']['certSANs'] == ['10.0.0.5']
    for key in ('inlineManifests', 'extraManifests', 'allowSchedulingOnControlPlanes'):
        assert key not in doc['cluster']


def test_worker_has_no_ca_keys_no_etcd_no_vip(bundle):
    text = render(bundle, 'worker', node=WORKER_NODE)
    doc = v1(text)
    machine, cluster = doc['machine'], doc['cluster']
    assert machine['type'] == 'worker'
    assert machine['ca']['key'] == '' and base64.b64decode(machine['ca']['crt']) == bundle.certs['os']['crt']
    assert cluster['ca']['key'] == ''
    assert 'nodeLabels' not in machine
    assert list(cluster) == ['id', 'secret', 'controlPlane', 'clusterName', 'network', 'token', 'ca', 'discovery']
    assert kinds(text) == ['v1alpha1', 'HostnameConfig', 'LinkConfig']
    for name in ('os', 'k8s', 'k8saggregator', 'etcd', 'k8sserviceaccount'):
        key = bundle.certs[name]['key']
        assert pki.b64encode_pem(key) not in text
    assert bundle.secretbox_secret not in text


def test_inline_manifests_identical_on_all_control_planes(bundle):
    first = v1(render(bundle, node=CP_NODE))
    second = v1(render(bundle, node={'hostname': 'cp-2', 'ip': '127.0.10.12', 'prefix': 24}))
    assert first['cluster']['inlineManifests'] == second['cluster']['inlineManifests']
    worker = v1(render(bundle, 'worker', node=WORKER_NODE))
    assert 'inlineManifests' not in worker['cluster'] and 'extraManifests' not in worker['cluster']


@pytest.mark.parametrize('talos_version, contract', VERSIONS)
def test_contract_differences(bundle, talos_version, contract):
    doc = v1(render(bundle, talos_version=talos_version))
    if contract == '1.12':
        assert doc['machine']['network'] == {}
        assert list(doc['machine'])[4:6] == ['kubelet', 'network']
        assert doc['machine']['kubelet']['image'].endswith(':v1.35.4')
        assert doc['machine']['install']['image'] == 'ghcr.io/siderolabs/installer:v1.12.11'
    else:
        assert 'network' not in doc['machine']
        assert doc['machine']['kubelet']['image'].endswith(':v1.36.3')


def test_kubernetes_version_and_installer_options(bundle):
    doc = v1(render(bundle, kubernetes_version='v1.34.2'))
    assert doc['cluster']['apiServer']['image'] == 'registry.k8s.io/kube-apiserver:v1.34.2'
    schematic = 'a' * 64
    doc = v1(render(bundle, cluster=dict(CLUSTER, installer_schematic=schematic)))
    assert doc['machine']['install']['image'] == 'factory.talos.dev/installer/%s:v1.13.9' % schematic
    doc = v1(render(bundle, cluster=dict(CLUSTER, installer_image='registry.local/talos/installer:v1.13.9')))
    assert doc['machine']['install']['image'] == 'registry.local/talos/installer:v1.13.9'


def test_flannel_and_kube_proxy_can_be_kept(bundle):
    doc = v1(render(bundle, cluster=dict(CLUSTER, cni='flannel', proxy_disabled=False, forward_kube_dns_to_host=False)))
    assert doc['cluster']['network']['cni'] == {'name': 'flannel'}
    assert doc['cluster']['proxy'] == {'image': 'registry.k8s.io/kube-proxy:v1.36.3'}
    assert doc['machine']['features']['hostDNS']['forwardKubeDNSToHost'] is False
    doc = v1(render(bundle, cluster=dict(CLUSTER, cni='custom', cni_urls=['https://example.com/cni.yaml'])))
    assert doc['cluster']['network']['cni'] == {'name': 'custom', 'urls': ['https://example.com/cni.yaml']}


def test_aescbc_bundle_renders_aescbc_secret(bundle):
    data = bundle.to_dict()
    del data['secrets']['secretboxencryptionsecret']
    data['secrets']['aescbcencryptionsecret'] = base64.b64encode(b'k' * 32).decode()
    old = secrets.validate_bundle_dict(data)
    cluster = v1(render(old))['cluster']
    assert cluster['aescbcEncryptionSecret'] == data['secrets']['aescbcencryptionsecret']
    assert 'secretboxEncryptionSecret' not in cluster


# --- validity ------------------------------------------------------------------------------------

@pytest.mark.parametrize('talos_version, contract', VERSIONS)
@pytest.mark.parametrize('machine_type, node', [
    ('controlplane', CP_NODE), ('worker', WORKER_NODE), ('controlplane', {}), ('worker', {})])
@pytest.mark.parametrize('with_patches', [False, True])
def test_rendered_configs_are_valid(bundle, schemas, talos_version, contract, machine_type, node, with_patches):
    text = render(bundle, machine_type, node=node, patches=PATCHES if with_patches else None, talos_version=talos_version)
    assert config.schema_problems(text, schemas[contract], contract) == []
    assert config.config_problems(text, contract) == []
    assert config.validate_machine_config(text, contract) == documents(text)


def test_rendering_for_1_13_also_fits_the_1_12_schema(bundle, schemas):
    # The 1.13 output only uses what 1.12 knows too, so a 1.12 node could read it.
    assert config.schema_problems(render(bundle), schemas['1.12'], '1.12') == []


def test_schema_check_catches_bad_documents(bundle, schemas):
    docs = documents(render(bundle))
    docs[0]['machine']['kubelet']['imagee'] = 'typo'
    docs[0]['machine']['features']['kubePrism']['port'] = 'seven'
    docs.append({'apiVersion': 'v1alpha1', 'kind': 'NoSuchConfig'})
    problems = config.schema_problems(docs, schemas['1.13'], '1.13')
    assert ('v1alpha1', 'machine.kubelet', "Additional properties are not allowed ('imagee' was unexpected)") in problems
    assert any(p[1] == 'machine.features.kubePrism.port' for p in problems)
    assert ('NoSuchConfig', '', "no schema definition for kind 'NoSuchConfig'") in problems


def test_nodoc_keys_are_stripped_only_for_their_contract(bundle, schemas):
    docs = documents(render(bundle, talos_version='v1.12.11'))
    assert config.schema_problems(docs, schemas['1.12'], '1.12') == []
    # machine.network is documented in the 1.12 schema but nodoc (absent) in 1.13's.
    assert config.schema_problems(docs, schemas['1.13'], '1.13') == []
    strict = config.strip_nodoc(docs[0], '1.12')
    assert strict['machine']['network'] == {} and 'persist' not in strict


# --- patches through the renderer ----------------------------------------------------------------

def test_each_patch_level_and_kind(bundle):
    text = render(bundle, patches=PATCHES)
    docs = documents(text)
    machine = docs[0]['machine']
    assert machine['sysctls'] == {'net.core.somaxconn': '65535'}
    assert machine['certSANs'] == ['api.lab.example', '127.0.10.10', 'group.example']
    assert machine['nodeAnnotations'] == {'host': 'yes'}
    assert docs[-1] == {'apiVersion': 'v1alpha1', 'kind': 'ResolverConfig', 'nameservers': [{'address': '1.1.1.1'}]}


def test_worker_patches(bundle):
    text = render(bundle, 'worker', node=WORKER_NODE, patches={
        'group': ['machine:\n  nodeLabels:\n    node-role.kubernetes.io/worker: ""\n'],
        'host': [[{'op': 'replace', 'path': '/machine/install/disk', 'value': '/dev/nvme0n1'}]]})
    doc = v1(text)
    assert doc['machine']['nodeLabels'] == {'node-role.kubernetes.io/worker': ''}
    assert doc['machine']['install']['disk'] == '/dev/nvme0n1'


def test_host_patch_wins_over_group_and_cluster(bundle):
    patches = {'cluster': [{'cluster': {'network': {'podSubnets': ['10.1.0.0/16']}}}],
               'group': [{'cluster': {'network': {'podSubnets': ['10.2.0.0/16']}}}],
               'host': [{'cluster': {'network': {'podSubnets': ['10.3.0.0/16']}}}]}
    assert v1(render(bundle, patches=patches))['cluster']['network']['podSubnets'] == ['10.3.0.0/16']


def test_patch_that_breaks_the_config_is_refused(bundle):
    with pytest.raises(ValidationError) as err:
        render(bundle, 'worker', node=WORKER_NODE, patches={'group': [{'cluster': {'etcd': {'advertisedSubnets': ['10.0.0.0/8']}}}]})
    assert str(err.value) == 'machine_config.cluster.etcd: not allowed on a worker'
    with pytest.raises(ValidationError) as err:
        render(bundle, 'worker', node=WORKER_NODE,
               patches={'host': ['apiVersion: v1alpha1\nkind: Layer2VIPConfig\nname: 10.0.0.9\nlink: ens18\n']})
    assert str(err.value) == 'machine_config.Layer2VIPConfig(10.0.0.9).kind: a worker cannot have a VIP'
    with pytest.raises(ValidationError) as err:
        render(bundle, patches={'host': ['apiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n']})
    assert str(err.value) == "machine_config.HostnameConfig.hostname: 'auto' and 'hostname' cannot be set at the same time"


def test_unknown_patch_level(bundle):
    with pytest.raises(ValidationError) as err:
        render(bundle, patches={'node': []})
    assert err.value.field == 'patches.node'


# --- determinism ---------------------------------------------------------------------------------

@pytest.mark.parametrize('machine_type, node', [('controlplane', CP_NODE), ('worker', WORKER_NODE)])
def test_render_is_byte_stable(bundle, machine_type, node):
    first = render(bundle, machine_type, node=node, patches=PATCHES)
    second = render(bundle, machine_type, node=node, patches=copy.deepcopy(PATCHES))
    assert first == second
    reloaded = secrets.parse_bundle(bundle.to_yaml())
    assert render(reloaded, machine_type, node=node, patches=PATCHES) == first


def test_inputs_are_not_modified(bundle):
    cluster, node, patches = copy.deepcopy(CLUSTER), copy.deepcopy(CP_NODE), copy.deepcopy(PATCHES)
    render(bundle, cluster=cluster, node=node, patches=patches)
    assert (cluster, node, patches) == (CLUSTER, CP_NODE, PATCHES)


# --- input errors --------------------------------------------------------------------------------

@pytest.mark.parametrize('change, field, reason', [
    ({'name': None}, 'cluster.name', 'missing'),
    ({'name': 'Lab_1'}, 'cluster.name', 'must be a DNS label'),
    ({'endpoint': 'http://10.0.0.1:6443'}, 'cluster.endpoint', 'must be an https:// URL'),
    ({'endpoint': 'https://10.0.0.1:99999'}, 'cluster.endpoint', 'invalid port'),
    ({'endpoint': 'https://10.0.0.1:6443/api'}, 'cluster.endpoint', 'without path'),
    ({'pod_subnets': ['10.244.0.1/16']}, 'cluster.pod_subnets[0]', 'not a CIDR subnet'),
    ({'pod_subnets': []}, 'cluster.pod_subnets', 'at least one subnet'),
    ({'service_subnets': '10.96.0.0/12'}, 'cluster.service_subnets', 'must be a list'),
    ({'cert_sans': ['bad name']}, 'cluster.cert_sans[0]', 'not an IP address or DNS name'),
    ({'cni': 'cilium'}, 'cluster.cni', 'must be one of none, flannel, custom'),
    ({'cni': 'custom'}, 'cluster.cni_urls', 'required when cni is custom'),
    ({'proxy_disabled': 'yes'}, 'cluster.proxy_disabled', 'must be true or false'),
    ({'inline_manifests': [{'name': 'a', 'contents': 'x'}, {'name': 'a', 'contents': 'y'}]},
     'cluster.inline_manifests[1].name', 'duplicate inline manifest name'),
    ({'inline_manifests': [{'name': 'a'}]}, 'cluster.inline_manifests[0].contents', 'must be text'),
    ({'extra_manifests': ['ftp://x/y']}, 'cluster.extra_manifests[0]', 'must be an http(s) URL'),
    ({'vip': '10.0.0'}, 'cluster.vip', 'must be an IP address'),
    ({'installer_schematic': 'abc'}, 'cluster.installer_schematic', '64 hex digits'),
    ({'installer_schematic': 'a' * 64, 'installer_image': 'x/y:z'}, 'cluster.installer_schematic', 'not both'),
    ({'kubeprism_port': 0}, 'cluster.kubeprism_port', 'TCP port'),
    ({'podSubnets': ['10.0.0.0/8']}, 'cluster.podSubnets', 'unknown key'),
])
def test_bad_cluster_values_name_the_field(bundle, change, field, reason):
    cluster = dict(CLUSTER)
    for key, value in change.items():
        if value is None:
            cluster.pop(key)
        else:
            cluster[key] = value
    with pytest.raises(ValidationError) as err:
        render(bundle, cluster=cluster)
    assert err.value.field == field
    assert reason in str(err.value)


@pytest.mark.parametrize('node, field, reason', [
    ({'hostname': 'CP_1'}, 'node.hostname', 'lower-case DNS labels'),
    ({'ip': '10.0.0.300', 'prefix': 24}, 'node.ip', 'must be an IP address'),
    ({'ip': '10.0.0.3'}, 'node.prefix', 'required with ip'),
    ({'ip': '10.0.0.3', 'prefix': 33}, 'node.prefix', 'prefix length 1-32'),
    ({'ip': '10.0.0.3', 'prefix': 24, 'gateway': '10.0.1.1'}, 'node.gateway', 'is not inside 10.0.0.3/24'),
    ({'gateway': '10.0.0.1'}, 'node.ip', 'required when prefix or gateway'),
    ({'install_disk': 'sda'}, 'node.install_disk', 'under /dev/'),
    ({'mac': 'x'}, 'node.mac', 'unknown key'),
])
def test_bad_node_values_name_the_field(bundle, node, field, reason):
    with pytest.raises(ValidationError) as err:
        render(bundle, node=node)
    assert err.value.field == field
    assert reason in str(err.value)


@pytest.mark.parametrize('kwargs, field, reason', [
    ({'talos_version': 'v1.11.5'}, 'talos_version', 'Talos 1.11 is not supported'),
    ({'talos_version': '1.13.9'}, 'talos_version', 'must be a Talos tag'),
    ({'kubernetes_version': 'latest'}, 'kubernetes_version', 'must be a Kubernetes version'),
    ({'machine_type': 'init'}, 'machine_type', 'must be controlplane or worker'),
])
def test_bad_render_options(bundle, kwargs, field, reason):
    machine_type = kwargs.pop('machine_type', 'controlplane')
    with pytest.raises(ValidationError) as err:
        render(bundle, machine_type, **kwargs)
    assert err.value.field == field and reason in str(err.value)


# --- validate_machine_config: Talos's rules ------------------------------------------------------

def _problems_after(bundle, machine_type, mutate, contract='1.13', node=None):
    docs = documents(render(bundle, machine_type, node=node or (CP_NODE if machine_type == 'controlplane' else WORKER_NODE)))
    mutate(docs)
    return config.config_problems(docs, contract)


@pytest.mark.parametrize('machine_type, mutate, expected', [
    ('controlplane', lambda d: d[0].pop('machine'), ('machine', 'missing')),
    ('controlplane', lambda d: d[0]['machine'].update(type='master'), ('machine.type', 'must be controlplane, worker or init')),
    ('controlplane', lambda d: d[0].pop('cluster'), ('cluster', 'missing')),
    ('controlplane', lambda d: d[0]['cluster']['controlPlane'].update(endpoint='not a url'),
     ('cluster.controlPlane.endpoint', 'must be a valid http(s) URL')),
    ('controlplane', lambda d: d[0]['machine'].pop('ca'), ('machine.ca', 'machine.ca or machine.acceptedCAs is required')),
    ('controlplane', lambda d: d[0]['machine']['ca'].update(key=''), ('machine.ca', 'a control plane needs both crt and key')),
    ('controlplane', lambda d: d[0]['machine']['ca'].update(key='bm90IGEga2V5'), ('machine.ca.key', 'not base64 of a PEM block')),
    ('controlplane', lambda d: d[0].update(persist=False), ('persist', 'must not be false')),
    ('controlplane', lambda d: d[0]['cluster']['network'].update(dnsDomain='bad_domain'),
     ('cluster.network.dnsDomain', 'not a valid DNS name')),
    ('controlplane', lambda d: d[0]['cluster']['network'].update(cni={'name': 'calico'}),
     ('cluster.network.cni.name', 'must be one of none, flannel, custom')),
    ('controlplane', lambda d: d[0]['cluster']['network'].update(cni={'name': 'custom'}),
     ('cluster.network.cni.urls', 'required for the custom CNI')),
    ('controlplane', lambda d: d[0]['cluster']['network'].update(cni={'name': 'none', 'urls': ['https://x/y']}),
     ('cluster.network.cni.urls', 'must be empty for the none CNI')),
    ('controlplane', lambda d: d[0]['cluster']['inlineManifests'].append({'name': 'cilium', 'contents': ''}),
     ('cluster.inlineManifests[1].name', "duplicate name 'cilium'")),
    ('controlplane', lambda d: d[0]['cluster']['inlineManifests'].append({'name': '', 'contents': ''}),
     ('cluster.inlineManifests[1].name', 'must not be empty')),
    ('controlplane', lambda d: d[0]['cluster'].pop('secret'), ('cluster.secret', 'required when discovery is enabled')),
    ('controlplane', lambda d: d[0]['machine'].update(install={}), ('machine.install', 'disk or diskSelector is required to install')),
    ('worker', lambda d: d[0]['machine']['ca'].update(key='eA=='), ('machine.ca.key', 'must be empty on a worker')),
    ('worker', lambda d: d[0]['cluster']['ca'].update(key='eA=='), ('cluster.ca.key', 'must be empty on a worker')),
    ('worker', lambda d: d[0]['machine'].update(network={'interfaces': [{'interface': 'eth0', 'vip': {'ip': '10.0.0.9'}}]}),
     ('machine.network.interfaces', 'a worker cannot have a VIP')),
    ('controlplane', lambda d: d.append(copy.deepcopy(d[1])), ('HostnameConfig', 'duplicate document')),
    ('controlplane', lambda d: d[1].update(hostname=''), ('HostnameConfig.auto', "either 'auto' or 'hostname' must be set")),
    ('controlplane', lambda d: d[1].update(auto='talos-addr'), ('HostnameConfig.auto', 'must be stable or off')),
    ('controlplane', lambda d: d[3].update(name='vip'), ('Layer2VIPConfig(vip).name', 'must be an IP address')),
    ('controlplane', lambda d: d[3].pop('link'), ('Layer2VIPConfig(127.0.10.10).link', 'required')),
    ('controlplane', lambda d: d[2]['addresses'].append({'address': '10.0.0.1'}),
     ('LinkConfig(ens18).addresses[1].address', 'must be an address with prefix, like 10.0.0.2/24')),
    ('controlplane', lambda d: d.append({'kind': 'X'}), ('document 4', 'a typed document needs apiVersion and kind')),
    ('controlplane', lambda d: d.append(copy.deepcopy(d[0])), ('v1alpha1', 'exactly one v1alpha1 document is required, found 2')),
])
def test_talos_rules(bundle, machine_type, mutate, expected):
    problems = _problems_after(bundle, machine_type, mutate)
    assert expected in problems


def test_validate_machine_config_raises_with_all_problems(bundle):
    docs = documents(render(bundle, 'worker', node=WORKER_NODE))
    docs[0]['cluster']['etcd'] = {'ca': {'crt': 'x'}}
    docs[0]['machine']['install'] = {}
    text = talosyaml.dump_all(docs)
    with pytest.raises(ValidationError) as err:
        config.validate_machine_config(text, '1.13')
    assert str(err.value) == 'machine_config.cluster.etcd: not allowed on a worker (and 1 more problems)'
    assert err.value.details['problems'] == ['cluster.etcd: not allowed on a worker',
                                             'machine.install: disk or diskSelector is required to install']
    # Without the install requirement (an installed node), only the etcd problem is left.
    assert config.config_problems(text, '1.13', requires_install=False) == [('cluster.etcd', 'not allowed on a worker')]


def test_validation_errors_never_quote_secrets(bundle):
    docs = documents(render(bundle))
    docs[0]['machine']['ca']['key'] = docs[0]['machine']['ca']['key'][:-8]
    docs[0]['cluster']['etcd']['ca']['key'] = 'garbage' + docs[0]['cluster']['etcd']['ca']['key']
    docs[0]['cluster']['network']['cni'] = {'name': bundle.bootstrap_token}
    with pytest.raises(ValidationError) as err:
        config.validate_machine_config(talosyaml.dump_all(docs), '1.13')
    text = str(err.value) + repr(err.value.details)
    for value in bundle.secret_values():
        assert value not in text
    for name in secrets.CERT_NAMES:
        for line in bundle.certs[name]['key'].decode().splitlines()[1:-1]:
            assert line not in text


def test_input_errors_never_quote_secrets(bundle):
    cases = [
        dict(patches={'host': [[{'op': 'test', 'path': '/machine/token', 'value': 'guess'}]]}),
        dict(patches={'host': [{'machine': {'token': ['not', 'text']}}]}),
        dict(patches={'host': ['machine: [\n']}),
    ]
    for kwargs in cases:
        with pytest.raises(ValidationError) as err:
            render(bundle, **kwargs)
        for value in bundle.secret_values():
            assert value not in str(err.value)


def test_contract_argument_is_checked():
    with pytest.raises(ValidationError) as err:
        config.config_problems([], '1.11')
    assert err.value.field == 'contract'


def test_parse_machine_config_rejects_non_mappings():
    with pytest.raises(ValidationError) as err:
        config.parse_machine_config('version: v1alpha1\n---\n- a\n')
    assert str(err.value) == 'machine_config: document 1 is not a mapping'


def test_odd_types_from_patches_are_problems_not_crashes(bundle):
    docs = documents(render(bundle))
    docs[1] = {'apiVersion': 'v1alpha1', 'kind': 'HostnameConfig', 'hostname': 42}
    docs.append(['not', 'a', 'mapping'])
    problems = config.config_problems(docs, '1.13')
    assert ('HostnameConfig.hostname', 'not a valid host name') in problems
    assert ('document 4', 'must be a mapping') in problems


def test_secret_paths_hide_every_secret_of_a_rendered_config(bundle):
    from ansible_collections.proxtalos.cluster.plugins.module_utils import _diff
    text = render(bundle)
    hidden = talosyaml.dump(_diff.hide(v1(text), config.CONFIG_SECRET_PATHS))
    for value in bundle.secret_values():
        assert value not in hidden
    assert 'kind: Namespace' in text and 'kind: Namespace' not in hidden
    # Certificates and names stay visible for the diff.
    assert pki.b64encode_pem(bundle.certs['os']['crt']) in hidden and 'clusterName: lab' in hidden


def test_a_private_registrys_credentials_and_client_key_are_hidden_and_masked():
    from ansible_collections.proxtalos.cluster.plugins.module_utils._talos import redact
    document = {'version': 'v1alpha1', 'machine': {'type': 'worker', 'registries': {'config': {
        'registry.example.com': {'auth': {'username': 'puller', 'password': 'pw-registry-one',
                                          'auth': 'YXV0aC10b2tlbg==', 'identityToken': 'id-token-two'},
                                 'tls': {'clientIdentity': {'crt': 'Y3J0', 'key': 'client-key-three'}}},
        'mirror.example.org': {'auth': {'password': 'pw-mirror-four'}}}}}, 'cluster': {}}
    secrets_of_it = ('pw-registry-one', 'YXV0aC10b2tlbg==', 'id-token-two', 'client-key-three', 'pw-mirror-four')
    shown = redact.config_documents_text([document])
    for value in secrets_of_it:
        assert value not in shown
    # the user name and the client certificate stay visible for the diff
    assert 'puller' in shown and 'Y3J0' in shown
    assert sorted(redact.config_secret_values([document])) == sorted(secrets_of_it)
