"""The GitOps repository skeleton (docs/gitops-skeleton) states what the stages check, and the lab's GitOps tree
(lab/gitops, cluster `lab`) follows it.

- every Flux Kustomization of the skeleton's clusters/CLUSTER is in the lab's clusters/lab with the same spec, and the
  lab inventory's gitops_kustomizations names each one (so a missing one fails the gitops gate by name);
- what the gates look for, with the roles' defaults (data the gates read, no code of the collection): the
  sealed-secrets controller's Deployment and Service, its first port `http`, key renewal off; the CSI controller
  Deployment and a node DaemonSet with the node selector's labels; the folders flux_sealed_secrets writes into, built
  by Flux without a kustomization.yaml;
- the skeleton's README states those defaults as the roles have them.
"""
import os

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKELETON = os.path.join(ROOT, 'docs', 'gitops-skeleton')
LAB_TREE = os.path.join(ROOT, 'lab', 'gitops')
FLUX_KUSTOMIZATION = ('kustomize.toolkit.fluxcd.io/v1', 'Kustomization')


def _load(path):
    with open(path, encoding='utf-8') as handle:
        return yaml.safe_load(handle)


def _documents(folder):
    """Every YAML document of the folder's .yaml files (not recursive)."""
    out = []
    for name in sorted(os.listdir(folder)):
        if name.endswith('.yaml'):
            with open(os.path.join(folder, name), encoding='utf-8') as handle:
                out.extend(doc for doc in yaml.safe_load_all(handle) if doc)
    return out


def _flux_kustomizations(folder):
    return dict((doc['metadata']['name'], doc) for doc in _documents(folder)
                if (doc.get('apiVersion'), doc.get('kind')) == FLUX_KUSTOMIZATION)


def _defaults(role):
    return _load(os.path.join(ROOT, 'roles', role, 'defaults', 'main.yml'))


def _lab_vars():
    values = {}
    folder = os.path.join(ROOT, 'inventories', 'lab', 'group_vars', 'all')
    for name in sorted(os.listdir(folder)):
        values.update(_load(os.path.join(folder, name)) or {})
    return values


def _find(documents, kind, namespace, name):
    found = [doc for doc in documents if doc.get('kind') == kind and doc['metadata'].get('name') == name
             and doc['metadata'].get('namespace') == namespace]
    assert len(found) == 1, '%s %s/%s: %d found' % (kind, namespace, name, len(found))
    return found[0]


def test_every_kustomization_of_the_skeleton_is_in_the_lab_tree_with_the_same_spec():
    skeleton = _flux_kustomizations(os.path.join(SKELETON, 'clusters', 'CLUSTER'))
    lab = _flux_kustomizations(os.path.join(LAB_TREE, 'clusters', 'lab'))
    assert skeleton, 'the skeleton has no Flux Kustomization'
    for name, doc in skeleton.items():
        assert name in lab, 'lab/gitops/clusters/lab has no Kustomization %s' % name
        assert lab[name]['metadata'] == doc['metadata'], name
        assert lab[name]['spec'] == doc['spec'], name
        # the path it names exists in both trees
        assert os.path.isdir(os.path.join(SKELETON, doc['spec']['path'])), doc['spec']['path']
        assert os.path.isdir(os.path.join(LAB_TREE, doc['spec']['path'])), doc['spec']['path']
    root = _load(os.path.join(SKELETON, 'clusters', 'CLUSTER', 'kustomization.yaml'))['resources']
    lab_root = _load(os.path.join(LAB_TREE, 'clusters', 'lab', 'kustomization.yaml'))['resources']
    assert sorted('%s.yaml' % name for name in skeleton) == sorted(root)
    assert set(root) <= set(lab_root), (root, lab_root)
    listed = _lab_vars()['gitops_kustomizations']
    assert set(skeleton) | {'flux-system'} <= set(listed), listed


def test_the_lab_sealed_secrets_controller_is_what_the_gate_reads():
    defaults = _defaults('sealed_secrets')
    namespace, name = defaults['sealed_secrets_namespace'], defaults['sealed_secrets_controller_name']
    documents = _documents(os.path.join(LAB_TREE, 'infrastructure', 'sealed-secrets'))
    service = _find(documents, 'Service', namespace, name)
    assert service['spec']['ports'][0]['name'] == 'http'
    deployment = _find(documents, 'Deployment', namespace, name)
    args = deployment['spec']['template']['spec']['containers'][0]['args']
    renew = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == '--key-renew-period'] + \
        [arg.split('=', 1)[1] for arg in args if arg.startswith('--key-renew-period=')]
    assert renew == ['0'], args


def test_the_lab_csi_is_what_the_gates_read():
    defaults = _defaults('gitops')
    documents = _documents(os.path.join(LAB_TREE, 'infrastructure', 'proxmox-csi'))
    _find(documents, 'Deployment', defaults['gitops_csi_namespace'], defaults['gitops_csi_controller'])
    node_plugins = [doc for doc in documents if doc['kind'] == 'DaemonSet' and doc['metadata']['namespace'] == defaults['gitops_csi_namespace']
                    and doc['metadata']['name'] == defaults['gitops_csi_node_daemonset']]
    assert len(node_plugins) == 1, [doc['metadata']['name'] for doc in documents if doc['kind'] == 'DaemonSet']
    checks = _flux_kustomizations(os.path.join(SKELETON, 'clusters', 'CLUSTER'))['proxmox-csi']['spec']['healthChecks']
    assert {'kind': 'Deployment', 'name': defaults['gitops_csi_controller'], 'namespace': defaults['gitops_csi_namespace'],
            'apiVersion': 'apps/v1'} in checks
    assert {'kind': 'DaemonSet', 'name': node_plugins[0]['metadata']['name'], 'namespace': defaults['gitops_csi_namespace'],
            'apiVersion': 'apps/v1'} in checks


def test_the_folders_flux_seals_into_are_in_the_skeleton_and_built_without_a_kustomization():
    for entry in _lab_vars()['flux_sealed_secrets']:
        folder = os.path.dirname(entry['path'])
        for tree in (SKELETON, LAB_TREE):
            assert os.path.isdir(os.path.join(tree, folder)), (tree, folder)
            assert not os.path.exists(os.path.join(tree, folder, 'kustomization.yaml')), (tree, folder)


def test_the_skeleton_readme_states_the_defaults_the_roles_have():
    with open(os.path.join(SKELETON, 'README.md'), encoding='utf-8') as handle:
        text = handle.read()
    stated = {}
    for role in ('gitops', 'sealed_secrets'):
        stated.update(_defaults(role))
    for name in ('gitops_namespace', 'gitops_csi_namespace', 'gitops_csi_controller', 'sealed_secrets_namespace',
                 'sealed_secrets_controller_name'):
        assert '`%s` (`%s`)' % (name, stated[name]) in text, name
    assert '`gitops_kustomizations` (`[%s]`)' % ', '.join(stated['gitops_kustomizations']) in text
    assert '`gitops_csi_node_daemonset` (`%s`)' % stated['gitops_csi_node_daemonset'] in text
    assert '`gitops_csi_driver` (`%s`)' % stated['gitops_csi_driver'] in text
