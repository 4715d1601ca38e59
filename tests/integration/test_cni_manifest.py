"""The lab's inline Cilium manifest is what the cni role's render_manifest entry point makes of the lab's chart and the
lab inventory's values: re-rendering gives the same bytes, so the shipped file cannot drift from the role's values.
No lab is needed: rendering reads only the inventory and the chart."""
import os
import subprocess

import pytest
import yaml

from k8s_stages_lab import PLAYBOOK_BIN, ROOT, TOOLS, Run, environment

pytestmark = [
    pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)'),
    pytest.mark.skipif(not os.access(os.path.join(TOOLS, 'helm'), os.X_OK), reason='no helm in .tools/bin (make setup)'),
]

SHIPPED = os.path.join(ROOT, 'inventories', 'lab', 'files', 'cilium-manifest.txt')


@pytest.fixture
def inventory(tmp_path):
    folder = tmp_path / 'inventory'
    folder.mkdir()
    (folder / 'hosts.yml').write_text(yaml.safe_dump({'cluster': {'children': {
        'controlplane': {'hosts': {'lab-cp-1': {'node_ip': '127.0.0.11'}}}, 'worker': {'hosts': {}}},
        'vars': {'lab_net': '127.0.0', 'cluster_endpoint_host': '127.0.0.10'}}}))
    for name in ('group_vars', 'files'):
        (folder / name).symlink_to(os.path.join(ROOT, 'inventories', 'lab', name))
    book = tmp_path / 'render.yml'
    book.write_text(yaml.safe_dump([{'name': 'Render the lab Cilium manifest', 'hosts': 'controlplane[0]', 'gather_facts': False,
                                     'tasks': [{'name': 'Render', 'ansible.builtin.import_role': {
                                         'name': 'proxtalos.cluster.cni', 'tasks_from': 'render_manifest'}}]}]))
    return folder, book


def render(tmp_path, inventory, *args):
    folder, book = inventory
    command = [PLAYBOOK_BIN, str(book), '-i', str(folder), '-e', 'proxtalos_artifacts_dir=%s' % (tmp_path / 'artifacts')]
    return Run(subprocess.run(command + list(args), capture_output=True, text=True, env=environment(str(tmp_path)), cwd=ROOT,
                              timeout=300, check=False))


def test_the_shipped_lab_manifest_is_the_render_of_the_lab_chart_with_the_role_values(tmp_path, inventory):
    target = tmp_path / 'cilium.yaml'
    run = render(tmp_path, inventory, '-e', 'cni_cilium_manifest=%s' % target)
    assert run.rc == 0, run.explain()
    assert target.stat().st_mode & 0o777 == 0o600
    with open(SHIPPED, encoding='utf-8') as handle:
        shipped = handle.read()
    assert target.read_text() == shipped, ('inventories/lab/files/cilium-manifest.txt is stale: re-render it with the cni role '
                                           'entry point render_manifest (docs/stages/cni.md)')
    again = render(tmp_path, inventory, '-e', 'cni_cilium_manifest=%s' % target)
    assert again.rc == 0 and set(again.changed().values()) == {0}, again.changed()


def test_the_lab_manifest_has_the_talos_values_and_the_real_chart_shape():
    with open(SHIPPED, encoding='utf-8') as handle:
        documents = [doc for doc in yaml.safe_load_all(handle) if doc]
    kinds = dict(((doc['kind'], doc['metadata']['name'])) for doc in documents)
    assert kinds['DaemonSet'] == 'cilium' and kinds['Deployment'] == 'cilium-operator' and kinds['ConfigMap'] == 'cilium-config'
    agent = next(doc for doc in documents if doc['kind'] == 'DaemonSet')
    spec = agent['spec']['template']['spec']
    assert agent['spec']['selector'] == {'matchLabels': {'k8s-app': 'cilium'}}
    assert spec['hostNetwork'] is True and spec['tolerations'] == [{'operator': 'Exists'}]
    container = spec['containers'][0]
    env = dict((item['name'], item.get('value')) for item in container['env'])
    assert (env['KUBERNETES_SERVICE_HOST'], env['KUBERNETES_SERVICE_PORT']) == ('localhost', '7445')
    assert 'SYS_MODULE' not in container['securityContext']['capabilities']['add']
    assert 'mount-cgroup' not in [init['name'] for init in spec['initContainers']], 'Talos mounts cgroup v2 itself'
    operator = next(doc for doc in documents if doc['kind'] == 'Deployment')
    assert operator['spec']['replicas'] == 2
    assert operator['spec']['selector']['matchLabels'] == {'io.cilium/app': 'operator', 'name': 'cilium-operator'}
    anti = operator['spec']['template']['spec']['affinity']['podAntiAffinity']['requiredDuringSchedulingIgnoredDuringExecution']
    assert anti == [{'topologyKey': 'kubernetes.io/hostname', 'labelSelector': {'matchLabels': {'io.cilium/app': 'operator'}}}]
    config = next(doc for doc in documents if doc['kind'] == 'ConfigMap')['data']
    assert config['ipam'] == 'kubernetes' and config['kube-proxy-replacement'] == 'true'
    assert config['cgroup-root'] == '/sys/fs/cgroup' and config['ipv4-native-routing-cidr'] == '10.244.0.0/16'
    # Talos creates namespaces first; the manifest's own namespace and what lives in it are there
    assert kinds['Namespace'] == 'cilium-secrets'
    assert any(doc['kind'] == 'Role' and doc['metadata']['namespace'] == 'cilium-secrets' for doc in documents)
