"""flux_graph reads a tree as Flux reads it: one small tree per rule, written by the test.

Upstream read:
- gopkg.in/yaml.v3 v3.0.1 (under kyaml and sigs.k8s.io/yaml): an anchor defined again replaces the first
  (decode.go:140-145); `=` is a plain string (resolve.go:59 knows `<<` only); a tag it does not know leaves the value
  as written (resolve.go:116-130).
- fluxcd/pkg kustomize v1.18.0 (kustomize-controller v1.6.1's): scanManifests takes a sub-directory with its own
  kustomization file as one resource and does not descend into it (kustomize/kustomize_generator.go:531-539);
  postBuild variables: substituteFrom ConfigMaps/Secrets of the Kustomization's namespace, then substitute over
  them (kustomize/kustomize_varsub.go:111-123, 142-178), non-strict envsubst (:180-194), no substitution without
  variables (:126), opt-out label/annotation (:96-98).
- kustomize: a kustomization's `namespace` is set on every object it builds, its sub-kustomizations' too, so the
  outermost one of the inclusion chain decides; a Flux Kustomization's spec.targetNamespace is that outermost one
  (kustomize-controller generates it into the kustomization it builds).
"""
import base64
import os
import textwrap

from ansible_collections.proxtalos.cluster.plugins.module_utils import _flux_graph

GIT = 'sourceRef: {kind: GitRepository, name: flux-system}'


def tree(tmp_path, files):
    for relpath, text in files.items():
        path = tmp_path / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return str(tmp_path)


def ks(name, path, namespace='flux-system', extra=''):
    """A Flux Kustomization; `extra` is more of its spec (YAML, indented as it will be)."""
    text = textwrap.dedent('''
        apiVersion: kustomize.toolkit.fluxcd.io/v1
        kind: Kustomization
        metadata:
          name: "%s"
          namespace: %s
        spec:
          interval: 10m
          path: "%s"
          prune: true
          %s
        ''') % (name, namespace, path, GIT)
    return text + textwrap.indent(textwrap.dedent(extra).strip('\n'), '  ') + '\n'


def helmrelease(name, namespace=None):
    meta = '{name: %s%s}' % (name, ', namespace: %s' % namespace if namespace else '')
    return textwrap.dedent('''
        apiVersion: helm.toolkit.fluxcd.io/v2
        kind: HelmRelease
        metadata: %s
        spec:
          interval: 1h
          chart: {spec: {chart: %s, sourceRef: {kind: HelmRepository, name: charts}}}
        ''') % (meta, name)


def test_yaml_that_go_reads_is_read(tmp_path):
    root = tree(tmp_path, {
        'clusters/lab/kustomization.yaml': 'resources: [apps.yaml]\n',
        'clusters/lab/apps.yaml': ks('apps', './apps'),
        # a CI file: anchors defined twice, `=` as a key, GitLab's custom tag
        '.ci/pipeline.yml': '',
        'ci.yaml': 'base: &job {image: a}\ntest: *job\nbase2: &job {image: b}\nlint: *job\n=: equals\nscript: !reference [.setup, script]\n',
        'values.yaml': 'password: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n',
    })
    report = _flux_graph.analyze_path(root)
    assert report['parse_errors'] == [], report['parse_errors']
    assert report['files_scanned'] == 4
    docs = _flux_graph._load_documents(os.path.join(root, 'ci.yaml'))  # pylint: disable=protected-access
    assert docs == [{'base': {'image': 'a'}, 'test': {'image': 'a'}, 'base2': {'image': 'b'}, 'lint': {'image': 'b'},
                     '=': 'equals', 'script': ['.setup', 'script']}]


def test_a_sub_directory_with_its_own_kustomization_is_taken_whole(tmp_path):
    root = tree(tmp_path, {
        'clusters/lab/kustomization.yaml': 'resources: [infra.yaml]\n',
        'clusters/lab/infra.yaml': ks('infra', './infrastructure'),
        # no kustomization.yaml in infrastructure/: Flux generates one; controllers/ has its own, which lists one file
        'infrastructure/namespace.yaml': 'apiVersion: v1\nkind: Namespace\nmetadata: {name: infra}\n',
        'infrastructure/controllers/kustomization.yaml': 'resources: [cert-manager.yaml]\n',
        'infrastructure/controllers/cert-manager.yaml': helmrelease('cert-manager', 'cert-manager'),
        'infrastructure/controllers/unused.yaml': helmrelease('not-built', 'cert-manager'),
        'infrastructure/plain/redis.yaml': helmrelease('redis', 'cache'),
    })
    report = _flux_graph.analyze_path(root)
    nodes = dict((node['id'], node) for node in report['nodes'])
    assert nodes['HelmRelease/cert-manager/cert-manager']['applied_by'] == ['Kustomization/flux-system/infra']
    assert nodes['HelmRelease/cache/redis']['applied_by'] == ['Kustomization/flux-system/infra']
    # kustomize builds controllers/ through its kustomization.yaml, which does not list unused.yaml
    assert nodes['HelmRelease/cert-manager/not-built']['applied_by'] == []


def test_postbuild_variables_resolve_names_and_dependencies(tmp_path):
    root = tree(tmp_path, {
        'clusters/lab/kustomization.yaml': 'resources: [tenants.yaml, vars.yaml]\n',
        'clusters/lab/vars.yaml': 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cluster-vars, namespace: flux-system}\n'
                                  'data: {REGION: eu-west}\n',
        'clusters/lab/tenants.yaml': ks('tenants', './tenants', extra='''
            postBuild:
              substitute: {CLUSTER: lab}
              substituteFrom:
                - {kind: ConfigMap, name: cluster-vars}
                - {kind: Secret, name: cluster-secret-vars}
                - {kind: ConfigMap, name: not-in-git, optional: true}
            '''),
        'clusters/lab/secret.yaml': 'apiVersion: v1\nkind: Secret\nmetadata: {name: cluster-secret-vars, namespace: flux-system}\n'
                                    'data: {TEAM: %s}\n' % base64.b64encode(b'blue').decode(),
        'tenants/kustomization.yaml': 'resources: [infra.yaml, apps.yaml]\n',
        'tenants/infra.yaml': ks('${CLUSTER}-infra', './infra/${REGION}'),
        'tenants/apps.yaml': ks('${CLUSTER}-apps-${TEAM}', './apps', extra='''
            dependsOn:
              - name: "${CLUSTER}-infra"
              - name: "${UNKNOWN_TO_GIT:=lab}-infra"
              - name: "${FROM_THE_CLUSTER}"
            '''),
    })
    report = _flux_graph.analyze_path(root)
    ids = sorted(node['id'] for node in report['nodes'])
    assert 'Kustomization/flux-system/lab-infra' in ids and 'Kustomization/flux-system/lab-apps-blue' in ids, ids
    apps = next(node for node in report['nodes'] if node['id'] == 'Kustomization/flux-system/lab-apps-blue')
    assert apps['depends_on'] == ['Kustomization/flux-system/lab-infra']
    assert report['dangling'] == [] and report['failed'] is False
    assert any('${FROM_THE_CLUSTER}' in warning for warning in report['warnings']), report['warnings']


def test_a_dollar_name_is_never_dangling_without_variables(tmp_path):
    root = tree(tmp_path, {
        'kustomization.yaml': 'resources: [a.yaml, b.yaml]\n',
        'a.yaml': ks('a', './a', extra='dependsOn: [{name: "${OTHER}"}]\n'),
        'b.yaml': ks('${NAME}', './b'),
    })
    report = _flux_graph.analyze_path(root)
    assert report['dangling'] == [] and not report['failed']


def test_substitution_can_be_disabled_per_object(tmp_path):
    root = tree(tmp_path, {
        'clusters/lab/kustomization.yaml': 'resources: [parent.yaml]\n',
        'clusters/lab/parent.yaml': ks('parent', './child', extra='postBuild: {substitute: {X: resolved}}\n'),
        'child/kustomization.yaml': 'resources: [k.yaml]\n',
        'child/k.yaml': ks('name-${X}', './x').replace('  namespace: flux-system\n',
                                                       '  namespace: flux-system\n  labels: {kustomize.toolkit.fluxcd.io/substitute: disabled}\n', 1),
    })
    ids = [node['id'] for node in _flux_graph.analyze_path(root)['nodes']]
    assert 'Kustomization/flux-system/name-${X}' in ids, ids


def test_namespaces_come_from_the_inclusion_chain_and_target_namespace(tmp_path):
    root = tree(tmp_path, {
        'clusters/lab/kustomization.yaml': 'resources: [apps.yaml, tenants.yaml]\n',
        'clusters/lab/apps.yaml': ks('apps', './apps/lab'),
        'clusters/lab/tenants.yaml': ks('tenants', './tenants', extra='targetNamespace: tenant-a\n'),
        # apps/kustomization.yaml (namespace shared) is a directory ancestor of base/, but apps/lab includes base/ with
        # its own namespace: kustomize gives base's objects lab-apps
        'apps/kustomization.yaml': 'namespace: shared\nresources: [lab]\n',
        'apps/lab/kustomization.yaml': 'namespace: lab-apps\nresources: [../base]\n',
        'apps/base/kustomization.yaml': 'resources: [podinfo.yaml]\n',
        'apps/base/podinfo.yaml': helmrelease('podinfo'),
        'tenants/kustomization.yaml': 'namespace: ignored\nresources: [redis.yaml]\n',
        'tenants/redis.yaml': helmrelease('redis', 'also-ignored'),
    })
    report = _flux_graph.analyze_path(root)
    nodes = dict((node['id'], node) for node in report['nodes'])
    assert nodes['HelmRelease/lab-apps/podinfo']['applied_by'] == ['Kustomization/flux-system/apps'], sorted(nodes)
    assert nodes['HelmRelease/tenant-a/redis']['applied_by'] == ['Kustomization/flux-system/tenants'], sorted(nodes)


def public_style_tree(tmp_path, clusters=('production', 'staging'), apps=24):
    """A copy, written here, of the layout of Flux's public multi-cluster example (fluxcd/flux2-kustomize-helm-example:
    clusters/<name>/{flux-system,infrastructure.yaml,apps.yaml}, infrastructure/{controllers,configs}, apps/{base,<name>}),
    grown to `apps` applications, with the things real trees do: per-cluster variables, overlays that set the namespace,
    a flux-system directory as `flux bootstrap` writes it, and a CI file Go reads and PyYAML does not."""
    files = {'.gitlab-ci.yml': 'default: &d {image: alpine}\nlint: *d\ndefault2: &d {image: go}\ntest: *d\nrules: !reference [.r, x]\n'}
    for cluster in clusters:
        base = 'clusters/%s' % cluster
        files['%s/flux-system/gotk-components.yaml' % base] = (
            'apiVersion: v1\nkind: Namespace\nmetadata: {name: flux-system}\n---\n'
            'apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: kustomize-controller, namespace: flux-system}\n'
            'spec: {selector: {matchLabels: {app: kc}}, template: {metadata: {labels: {app: kc}}, spec: {containers: [{name: m, image: x}]}}}\n')
        files['%s/flux-system/gotk-sync.yaml' % base] = ks('flux-system', './' + base) + (
            '---\napiVersion: source.toolkit.fluxcd.io/v1\nkind: GitRepository\nmetadata: {name: flux-system, namespace: flux-system}\n'
            'spec: {interval: 1m, url: "https://git.example/fleet", ref: {branch: main}}\n')
        files['%s/flux-system/kustomization.yaml' % base] = 'resources: [gotk-components.yaml, gotk-sync.yaml]\n'
        files['%s/cluster-vars.yaml' % base] = (
            'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cluster-vars, namespace: flux-system}\n'
            'data: {CLUSTER_NAME: %s, DOMAIN: %s.example}\n' % (cluster, cluster))
        post_build = 'postBuild:\n  substituteFrom:\n    - {kind: ConfigMap, name: cluster-vars}\n'
        files['%s/infrastructure.yaml' % base] = (ks('infra-controllers', './infrastructure/controllers', extra='wait: true\n' + post_build)
                                                  + '---\n' + ks('infra-configs', './infrastructure/configs',
                                                                 extra='dependsOn: [{name: infra-controllers}]\n' + post_build))
        files['%s/apps.yaml' % base] = ks('apps', './apps/%s' % cluster, extra='dependsOn: [{name: infra-configs}]\n' + post_build)
        files['apps/%s/kustomization.yaml' % cluster] = 'namespace: apps-%s\nresources:\n%s' % (
            cluster, ''.join('  - ../base/app-%02d\n' % number for number in range(apps)))
    files['infrastructure/controllers/cert-manager.yaml'] = helmrelease('cert-manager', 'cert-manager')
    files['infrastructure/controllers/ingress-nginx.yaml'] = helmrelease('ingress-nginx', 'ingress-nginx')
    files['infrastructure/configs/issuers/kustomization.yaml'] = 'resources: [issuer.yaml]\n'
    files['infrastructure/configs/issuers/issuer.yaml'] = (
        'apiVersion: cert-manager.io/v1\nkind: ClusterIssuer\n'
        'metadata: {name: letsencrypt}\nspec: {acme: {email: "ops@${DOMAIN}"}}\n')
    files['infrastructure/configs/issuers/draft.yaml'] = helmrelease('not-in-the-build', 'nowhere')
    # named with the cluster's variable, which infra-configs substitutes from cluster-vars
    files['infrastructure/configs/db.yaml'] = helmrelease('"db-${CLUSTER_NAME}"', 'databases')
    for number in range(apps):
        app = 'apps/base/app-%02d' % number
        files['%s/kustomization.yaml' % app] = 'resources: [release.yaml]\n'
        files['%s/release.yaml' % app] = helmrelease('app-%02d' % number) + (
            '  dependsOn: [{name: "db-${CLUSTER_NAME}", namespace: databases}]\n' if number == 0 else '')
    return tree(tmp_path, files)


def test_a_larger_public_style_tree_is_read_as_flux_builds_it(tmp_path):
    root = public_style_tree(tmp_path)
    report = _flux_graph.analyze_path(root)
    assert report['parse_errors'] == [] and report['dangling'] == [] and report['cycles'] == [], report['warnings']
    assert report['failed'] is False
    # the two clusters define the same Kustomizations (one repository per cluster path): the first of each is kept
    nodes = dict((node['id'], node) for node in report['nodes'])
    apps = nodes['Kustomization/flux-system/apps']
    assert apps['depends_on'] == ['Kustomization/flux-system/infra-configs']
    assert nodes['Kustomization/flux-system/infra-configs']['depends_on'] == ['Kustomization/flux-system/infra-controllers']
    assert 'Kustomization/flux-system/flux-system' in report['tiers'][0]
    # every application is in its overlay's namespace and applied by apps
    for number in range(24):
        release = nodes.get('HelmRelease/apps-production/app-%02d' % number)
        assert release is not None, sorted(nodes)[:10]
        assert release['applied_by'] == ['Kustomization/flux-system/apps']
    # the directory Flux generates a kustomization for takes issuers/ through its own kustomization.yaml
    assert nodes['HelmRelease/nowhere/not-in-the-build']['applied_by'] == []
    assert nodes['HelmRelease/cert-manager/cert-manager']['applied_by'] == ['Kustomization/flux-system/infra-controllers']
    # variables: the name and the dependsOn resolved with the production cluster's (the first definition of apps)
    assert nodes['HelmRelease/apps-production/app-00']['depends_on'] == ['HelmRelease/databases/db-production']
    assert nodes['HelmRelease/databases/db-production']['applied_by'] == ['Kustomization/flux-system/infra-configs']
