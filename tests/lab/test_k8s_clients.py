"""The real clients against the lab API: kubectl, helm 4 and kubernetes.core through ansible-playbook."""

import json
import os
import shutil
import subprocess
import textwrap

import pytest

from lab.k8s.testing import ClusterThread

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(ROOT, '.tools', 'bin')
KUBECTL = os.path.join(TOOLS, 'kubectl')
HELM = os.path.join(TOOLS, 'helm')

CILIUM = textwrap.dedent('''\
    apiVersion: apps/v1
    kind: DaemonSet
    metadata: {name: cilium, namespace: kube-system}
    spec:
      selector: {matchLabels: {k8s-app: cilium}}
      template:
        metadata: {labels: {k8s-app: cilium}}
        spec:
          hostNetwork: true
          tolerations: [{operator: Exists}]
          containers: [{name: cilium-agent, image: "quay.io/cilium/cilium:v1.17.4"}]
    ''')
APP = textwrap.dedent('''\
    apiVersion: v1
    kind: Namespace
    metadata: {name: demo}
    ---
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: web, namespace: demo}
    spec:
      replicas: 2
      selector: {matchLabels: {app: web}}
      template:
        metadata: {labels: {app: web}}
        spec:
          containers:
          - name: web
            image: nginx:1.27
            ports: [{containerPort: 80}]
    ---
    apiVersion: v1
    kind: ConfigMap
    metadata: {name: settings, namespace: demo}
    data: {level: info}
    ''')

# Fields a real chart uses (Cilium-like DaemonSet, PDB, RBAC, NetworkPolicy, StorageClass, CronJob):
# quantities as numbers, int-or-string ports, projected volumes, probes, securityContext...
REALISTIC = """\
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: cilium
  namespace: kube-system
  labels: {k8s-app: cilium, app.kubernetes.io/part-of: cilium, app.kubernetes.io/name: cilium-agent}
spec:
  selector: {matchLabels: {k8s-app: cilium}}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 2}}
  template:
    metadata:
      annotations: {container.apparmor.security.beta.kubernetes.io/cilium-agent: unconfined}
      labels: {k8s-app: cilium}
    spec:
      hostNetwork: true
      priorityClassName: system-node-critical
      serviceAccountName: cilium
      automountServiceAccountToken: true
      terminationGracePeriodSeconds: 1
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - labelSelector: {matchLabels: {k8s-app: cilium}}
            topologyKey: kubernetes.io/hostname
      nodeSelector: {kubernetes.io/os: linux}
      tolerations: [{operator: Exists}]
      initContainers:
      - name: config
        image: "quay.io/cilium/cilium:v1.17.4@sha256:0000000000000000000000000000000000000000000000000000000000000000"
        imagePullPolicy: IfNotPresent
        command: [cilium-dbg, build-config]
        env:
        - name: K8S_NODE_NAME
          valueFrom: {fieldRef: {apiVersion: v1, fieldPath: spec.nodeName}}
        - name: KUBERNETES_SERVICE_HOST
          value: "127.0.0.1"
        volumeMounts: [{name: tmp, mountPath: /tmp}]
        terminationMessagePolicy: FallbackToLogsOnError
      containers:
      - name: cilium-agent
        image: "quay.io/cilium/cilium:v1.17.4"
        command: [cilium-agent]
        args: ["--config-dir=/tmp/cilium/config-map"]
        startupProbe:
          httpGet: {host: "127.0.0.1", path: /healthz, port: 9879, scheme: HTTP, httpHeaders: [{name: "brief", value: "true"}]}
          failureThreshold: 105
          periodSeconds: 2
          successThreshold: 1
          initialDelaySeconds: 5
        livenessProbe:
          httpGet: {host: "127.0.0.1", path: /healthz, port: health}
          timeoutSeconds: 5
        resources:
          requests: {cpu: 100m, memory: 512Mi}
          limits: {memory: 1Gi, cpu: 1}
        lifecycle:
          preStop:
            exec: {command: [/cni-uninstall.sh]}
        securityContext:
          seLinuxOptions: {level: s0, type: spc_t}
          capabilities:
            add: [CHOWN, KILL, NET_ADMIN, NET_RAW, IPC_LOCK, SYS_ADMIN, SYS_RESOURCE, DAC_OVERRIDE, FOWNER, SETGID, SETUID]
            drop: [ALL]
          privileged: false
        ports:
        - {name: health, containerPort: 9879, hostPort: 9879, protocol: TCP}
        volumeMounts:
        - {name: bpf-maps, mountPath: /sys/fs/bpf, mountPropagation: HostToContainer}
        - {name: clustermesh-secrets, mountPath: /var/lib/cilium/clustermesh, readOnly: true}
      volumes:
      - name: tmp
        emptyDir: {}
      - name: bpf-maps
        hostPath: {path: /sys/fs/bpf, type: DirectoryOrCreate}
      - name: clustermesh-secrets
        projected:
          defaultMode: 0400
          sources:
          - secret:
              name: cilium-clustermesh
              optional: true
              items: [{key: ca.crt, path: common-etcd-client-ca.crt}]
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: ScheduleAnyway
        labelSelector: {matchLabels: {k8s-app: cilium}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: op, namespace: kube-system}
spec:
  maxUnavailable: 1
  selector: {matchLabels: {io.cilium/app: operator}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: cilium}
rules:
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]
- nonResourceURLs: [/metrics]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: cilium}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cilium}
subjects: [{kind: ServiceAccount, name: cilium, namespace: kube-system}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: cilium, namespace: kube-system}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow, namespace: kube-system}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress:
  - from: [{namespaceSelector: {matchLabels: {a: b}}}]
    ports: [{port: 80, protocol: TCP}, {port: http}]
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: proxmox}
provisioner: csi.proxmox.sinextra.dev
parameters: {storage: local-lvm, csi.storage.k8s.io/fstype: ext4}
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
reclaimPolicy: Delete
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: cj, namespace: default}
spec:
  schedule: "*/5 * * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: OnFailure
          containers: [{name: c, image: busybox}]
"""


@pytest.fixture(scope='module')
def lab(tmp_path_factory):
    """A lab API with two nodes whose Cilium agents are Ready, and the clients' environment."""
    with ClusterThread() as api:
        api.call(api.cluster.kubelet_started, 'cp-1', '127.0.0.1', control_plane=True)
        api.call(api.cluster.kubelet_started, 'worker-1', '127.0.0.2')
        home = tmp_path_factory.mktemp('home')
        env = {'KUBECONFIG': api.kubeconfig, 'PATH': '%s:/usr/bin:/bin' % TOOLS, 'HOME': str(home)}
        api.env = env
        api.files = tmp_path_factory.mktemp('files')
        (api.files / 'cilium.yaml').write_text(CILIUM)
        run(api, KUBECTL, 'apply', '--server-side', '-f', str(api.files / 'cilium.yaml'))
        run(api, KUBECTL, 'wait', '--for=condition=Ready', 'node', '--all', '--timeout=20s')
        yield api


def run(api, *args, check=True):
    result = subprocess.run(list(args), capture_output=True, text=True, env=api.env, timeout=120, check=False)
    if check and result.returncode != 0:
        raise AssertionError('%s failed (%d):\n%s\n%s' % (' '.join(args), result.returncode, result.stdout, result.stderr))
    return result


needs_kubectl = pytest.mark.skipif(not os.access(KUBECTL, os.X_OK), reason='kubectl not fetched (make setup)')
needs_helm = pytest.mark.skipif(not os.access(HELM, os.X_OK), reason='helm not fetched (make setup)')


@needs_kubectl
def test_kubectl_get_apply_wait_rollout_delete(lab):
    nodes = run(lab, KUBECTL, 'get', 'nodes').stdout.splitlines()
    assert nodes[0].split() == ['NAME', 'STATUS', 'ROLES', 'AGE', 'VERSION']
    assert nodes[1].split()[:3] == ['cp-1', 'Ready', 'control-plane']
    app = lab.files / 'app.yaml'
    app.write_text(APP)
    out = run(lab, KUBECTL, 'apply', '--server-side', '-f', str(app)).stdout
    assert 'deployment.apps/web serverside-applied' in out
    rollout = run(lab, KUBECTL, 'rollout', 'status', '-n', 'demo', 'deployment/web', '--timeout=30s').stdout
    assert 'deployment "web" successfully rolled out' in rollout
    run(lab, KUBECTL, 'wait', '-n', 'demo', '--for=condition=Available', 'deployment/web', '--timeout=30s')
    pods = run(lab, KUBECTL, 'get', 'pods', '-n', 'demo', '-o', 'wide').stdout.splitlines()
    assert len(pods) == 3 and all(line.split()[1:3] == ['1/1', 'Running'] for line in pods[1:])
    deploy = json.loads(run(lab, KUBECTL, 'get', '-n', 'demo', 'deployment', 'web', '-o', 'json').stdout)
    assert deploy['status']['availableReplicas'] == 2 and deploy['status']['observedGeneration'] == deploy['metadata']['generation']
    # a re-apply of the same manifest writes nothing: same generation, same managed fields (and their times)
    before = json.loads(run(lab, KUBECTL, 'get', '-n', 'demo', 'deployment', 'web', '-o', 'json', '--show-managed-fields').stdout)
    run(lab, KUBECTL, 'apply', '--server-side', '-f', str(app))
    after = json.loads(run(lab, KUBECTL, 'get', '-n', 'demo', 'deployment', 'web', '-o', 'json', '--show-managed-fields').stdout)
    assert after['metadata']['generation'] == before['metadata']['generation']
    assert after['metadata']['managedFields'] == before['metadata']['managedFields']
    assert [m['manager'] for m in after['metadata']['managedFields']] == ['kubectl']
    run(lab, KUBECTL, 'delete', '-n', 'demo', 'configmap', 'settings')
    missing = run(lab, KUBECTL, 'get', '-n', 'demo', 'configmap', 'settings', check=False)
    assert missing.returncode == 1 and 'NotFound' in missing.stderr


@needs_kubectl
def test_kubectl_apply_conflict_and_force(lab):
    manifest = lab.files / 'cm.yaml'
    manifest.write_text('apiVersion: v1\nkind: ConfigMap\nmetadata: {name: shared, namespace: default}\ndata: {owner: first}\n')
    run(lab, KUBECTL, 'apply', '--server-side', '--field-manager=first', '-f', str(manifest))
    manifest.write_text('apiVersion: v1\nkind: ConfigMap\nmetadata: {name: shared, namespace: default}\ndata: {owner: second}\n')
    result = run(lab, KUBECTL, 'apply', '--server-side', '--field-manager=second', '-f', str(manifest), check=False)
    assert result.returncode == 1 and 'conflict with "first"' in result.stderr and '.data.owner' in result.stderr
    run(lab, KUBECTL, 'apply', '--server-side', '--field-manager=second', '--force-conflicts', '-f', str(manifest))
    assert run(lab, KUBECTL, 'get', 'cm', 'shared', '-o', 'jsonpath={.data.owner}').stdout == 'second'


@needs_kubectl
def test_kubectl_applies_realistic_manifests_strictly_and_idempotently(lab):
    manifest = lab.files / 'realistic.yaml'
    manifest.write_text(REALISTIC.replace('name: cilium\n  namespace: kube-system\n  labels', 'name: agent\n  namespace: kube-system\n  labels'))
    first = run(lab, KUBECTL, 'apply', '--server-side', '--validate=strict', '-f', str(manifest))
    assert first.stdout.count('serverside-applied') == 8 and not first.stderr
    generations = run(lab, KUBECTL, 'get', 'ds,cronjob,pdb', '-A', '-o', 'jsonpath={.items[*].metadata.generation}').stdout
    run(lab, KUBECTL, 'apply', '--server-side', '--validate=strict', '-f', str(manifest))
    assert run(lab, KUBECTL, 'get', 'ds,cronjob,pdb', '-A', '-o', 'jsonpath={.items[*].metadata.generation}').stdout == generations
    limits = run(lab, KUBECTL, 'get', 'ds', '-n', 'kube-system', 'agent', '-o', 'jsonpath={.spec.template.spec.containers[0].resources.limits}')
    assert json.loads(limits.stdout) == {'cpu': '1', 'memory': '1Gi'}


@needs_kubectl
def test_kubectl_strict_validation_rejects_unknown_field(lab):
    manifest = lab.files / 'bad.yaml'
    manifest.write_text('apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bad, namespace: default}\ndatta: {a: b}\n')
    result = run(lab, KUBECTL, 'apply', '--server-side', '-f', str(manifest), check=False)
    assert result.returncode == 1 and 'unknown field "datta"' in result.stderr


@needs_helm
def test_helm_install_wait_upgrade_uninstall(lab):
    chart = lab.files / 'chart'
    (chart / 'templates').mkdir(parents=True)
    (chart / 'Chart.yaml').write_text('apiVersion: v2\nname: demo\nversion: 0.1.0\n')
    (chart / 'values.yaml').write_text('replicas: 2\nmessage: hello\n')
    (chart / 'templates' / 'all.yaml').write_text(textwrap.dedent('''\
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: {{ .Release.Name }}-cfg}
        data: {message: {{ .Values.message | quote }}}
        ---
        apiVersion: v1
        kind: Service
        metadata: {name: {{ .Release.Name }}-svc}
        spec:
          selector: {app: {{ .Release.Name }}}
          ports: [{port: 80, targetPort: 8080}]
        ---
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: {{ .Release.Name }}-web}
        spec:
          replicas: {{ .Values.replicas }}
          selector: {matchLabels: {app: {{ .Release.Name }}}}
          template:
            metadata:
              labels: {app: {{ .Release.Name }}}
              annotations: {checksum: {{ .Values.message | sha256sum | quote }}}
            spec:
              containers: [{name: web, image: "nginx:1.27", ports: [{containerPort: 8080}]}]
        '''))
    out = run(lab, HELM, 'install', 'rel', str(chart), '-n', 'apps', '--create-namespace', '--wait', '--timeout', '60s').stdout
    assert 'STATUS: deployed' in out
    ready = json.loads(run(lab, KUBECTL, 'get', '-n', 'apps', 'deployment', 'rel-web', '-o', 'json').stdout)['status']
    assert ready['readyReplicas'] == 2
    run(lab, HELM, 'upgrade', 'rel', str(chart), '-n', 'apps', '--set', 'message=bye', '--set', 'replicas=3', '--wait', '--timeout', '60s')
    assert run(lab, KUBECTL, 'get', '-n', 'apps', 'cm', 'rel-cfg', '-o', 'jsonpath={.data.message}').stdout == 'bye'
    status = json.loads(run(lab, KUBECTL, 'get', '-n', 'apps', 'deployment', 'rel-web', '-o', 'json').stdout)['status']
    assert status['updatedReplicas'] == 3 and status['availableReplicas'] == 3 and status['replicas'] == 3
    listed = json.loads(run(lab, HELM, 'list', '-n', 'apps', '-o', 'json').stdout)
    assert [(r['name'], r['revision'], r['status']) for r in listed] == [('rel', '2', 'deployed')]
    run(lab, HELM, 'uninstall', 'rel', '-n', 'apps', '--wait')
    left = run(lab, KUBECTL, 'get', 'deployment,service,configmap,secret', '-n', 'apps', '-o', 'name').stdout.split()
    assert left == ['configmap/kube-root-ca.crt'], 'only what the namespace controllers put in every namespace is left'


PLAYBOOK = textwrap.dedent('''\
    - name: kubernetes.core against the lab API
      hosts: localhost
      connection: local
      gather_facts: false
      vars:
        ansible_python_interpreter: "{{ ansible_playbook_python }}"
      tasks:
        - name: Namespace
          kubernetes.core.k8s:
            kubeconfig: "{{ kc }}"
            definition: {apiVersion: v1, kind: Namespace, metadata: {name: ans}}
        - name: ConfigMap
          kubernetes.core.k8s:
            kubeconfig: "{{ kc }}"
            definition:
              apiVersion: v1
              kind: ConfigMap
              metadata: {name: c1, namespace: ans, labels: {tier: x}}
              data: {k: v}
        - name: Deployment, waited for
          kubernetes.core.k8s:
            kubeconfig: "{{ kc }}"
            apply: true
            wait: true
            wait_timeout: 60
            definition:
              apiVersion: apps/v1
              kind: Deployment
              metadata: {name: d1, namespace: ans}
              spec:
                replicas: 1
                selector: {matchLabels: {app: d1}}
                template:
                  metadata: {labels: {app: d1}}
                  spec: {containers: [{name: c, image: "busybox:1.36"}]}
        - name: Server-side apply
          kubernetes.core.k8s:
            kubeconfig: "{{ kc }}"
            server_side_apply: {field_manager: ansible}
            definition: {apiVersion: v1, kind: ConfigMap, metadata: {name: c2, namespace: ans}, data: {k: v}}
        - name: Read back by label
          kubernetes.core.k8s_info:
            kubeconfig: "{{ kc }}"
            kind: ConfigMap
            namespace: ans
            label_selectors: [tier=x]
          register: found
        - name: Exactly one labelled ConfigMap
          ansible.builtin.assert:
            that: found.resources | length == 1 and found.resources[0].data.k == 'v'
          when: not ansible_check_mode
    ''')


def _playbook(lab, *extra):
    book = lab.files / 'play.yml'
    book.write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), HOME=lab.env['HOME'])
    result = subprocess.run([os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook'), str(book), '-e', 'kc=%s' % lab.kubeconfig] + list(extra),
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    recap = [line for line in result.stdout.splitlines() if line.startswith('localhost')][-1]
    return {k: int(v) for k, v in (part.split('=') for part in recap.split(':', 1)[1].split())}


@pytest.mark.skipif(shutil.which('ansible-playbook', path=os.path.join(ROOT, '.venv', 'bin')) is None, reason='no ansible-playbook')
def test_kubernetes_core_apply_check_mode_and_idempotence(lab):
    first = _playbook(lab)
    assert first['failed'] == 0 and first['changed'] == 4
    second = _playbook(lab)
    assert second['failed'] == 0 and second['changed'] == 0
    assert _playbook(lab, '--check')['changed'] == 0
    run(lab, KUBECTL, 'delete', '-n', 'ans', 'configmap', 'c1')
    predicted = _playbook(lab, '--check')
    assert predicted['changed'] == 1
    assert run(lab, KUBECTL, 'get', '-n', 'ans', 'configmap', 'c1', check=False).returncode == 1, 'check mode (server dry-run) wrote'
