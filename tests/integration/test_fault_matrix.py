"""The fault matrix (tests/integration/fault_matrix.py: ROWS) against the lab, one test per row.

Each row starts from the lab state it needs (`empty`: the session lab reset; `vms`: the session lab with every VM
running and every Talos node in maintenance mode, made once and reused while it lasts; `converged`: the session's
converged_cluster; `scaled`: a 1-node lab of its own at time scale 0.05), injects its fault, runs the stages it
names, and checks the outcome:

- recovered: the run ends without a failure, and the evidence shows the fault did bite (retries that met it in the
  task results, the lab's own record of the answers it gave, the remediation steps the run logged);
- failed: a task of the row's stage failed, and what the output shows for it (host, task, message) names the node
  or object and the cause.

Afterwards the fault is cleared and the lab brought back (a converged cluster: until the lab reports every node,
workload and Flux object ready again). Every result goes to docs/reliability-results.json and docs/reliability.md is
re-rendered from the table and those results at the end of the module.
"""

import datetime
import os
import re
import sys

import pytest

from ansible_collections.proxtalos.cluster.tests import helpers
from lab.world import flux_world, kubernetes_world

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fault_matrix as matrix  # noqa: E402  pylint: disable=wrong-import-position,import-error
from reliability_lab import PLAYBOOK_BIN, SITE, Workspace, wait_until  # noqa: E402  pylint: disable=wrong-import-position,import-error

pytestmark = [pytest.mark.lab, pytest.mark.slow,
              pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')]

HOST_VMID = {'lab-cp-1': 1011, 'lab-cp-2': 1012, 'lab-cp-3': 1013, 'lab-w-1': 1021, 'lab-w-2': 1022, 'lab-w-3': 1023}
RESTORE_TIMEOUT = 60
# a flux_reason step: a new revision through the dependency chain above proxmox-csi (two tiers, each up to
# kustomize-controller's 30 s --requeue-dependency), then the health check's progress deadline (10 s)
FLUX_REASON_TIMEOUT = 150
ADDRESS = re.compile(r'\{addr:([^}]+)\}')
# On the upstream Flux world a Kustomization whose dependency is not Ready is looked at again only after
# kustomize-controller's --requeue-dependency (30 s by default: github.com/fluxcd/kustomize-controller@v1.9.5, the
# lab's build, main.go:116); the restore reconciles proxmox-ccm, proxmox-csi and apps, a chain of two such waits.
UPSTREAM_RESTORE_TIMEOUT = RESTORE_TIMEOUT + 2 * 30 + 30


def current_world():
    """The world this run's labs start on (their `python -m lab up` reads the same environment), as
    fault_matrix.WORLDS names it."""
    kubernetes = kubernetes_world()
    if kubernetes == 'lab':
        return 'lab'
    return 'upstream' if flux_world(kubernetes=kubernetes) == 'upstream' else 'upstream-kubernetes'


def restore_timeout():
    return UPSTREAM_RESTORE_TIMEOUT if kubernetes_world() == 'upstream' else RESTORE_TIMEOUT


# ------------------------------------------------------------------------------ lab states

@pytest.fixture(scope='module')
def session_workspace(lab, tmp_path_factory):
    """The session lab with an inventory/artifacts folder of this module's own."""
    return Workspace(lab, str(tmp_path_factory.mktemp('fault-matrix')))


def vms_ready(status):
    """Every planned VM running with its agent, and every Talos node in maintenance mode (nothing applied yet)."""
    vms = status['pve']['vms']
    nodes = status.get('talos', {}).get('nodes', [])
    running = sorted(vm['name'] for vm in vms if vm['status'] == 'running' and vm['agent'] == 'running')
    maintenance = sorted(n['name'] for n in nodes if n['mode'] == 'maintenance' and n['phase'] == 'maintenance')
    return running == sorted(HOST_VMID) and maintenance == sorted(HOST_VMID), {'running': running, 'maintenance': maintenance}


def cluster_healthy(status, workspace=None):
    """(healthy, what is not) from the lab's status: nodes Ready, workloads ready, Flux objects Ready, no fault left.
    On the upstream worlds, whose status has no such sections, the nodes, workloads and Flux objects are read through
    the API (workspace's kubeconfig) instead."""
    problems = upstream_problems(workspace) if workspace is not None and kubernetes_world() == 'upstream' else []
    for cluster in (status.get('k8s') or {}).values():
        problems += ['node %s %s' % (n['name'], n['reason']) for n in cluster.get('nodes', []) if n['ready'] != 'True']
        for workload in cluster.get('workloads', []):
            ready, _sep, desired = workload['ready'].partition('/')
            if ready != desired:
                problems.append('%s %s/%s %s' % (workload['kind'], workload['namespace'], workload['name'], workload['ready']))
    for cluster in ((status.get('flux') or {}).get('clusters') or {}).values():
        problems += ['%s %s/%s %s' % (o['kind'], o['namespace'], o['name'], o['reason'])
                     for o in cluster.get('objects', []) if o.get('ready') != 'True']
    problems += ['fault %s' % (f,) for f in status['lab'].get('faults') or []]
    return not problems, problems


def upstream_problems(workspace):
    """What is not healthy, read from the cluster: Nodes not Ready, Deployments and DaemonSets with fewer ready pods
    than wanted, Flux Kustomizations and HelmReleases not Ready."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    api = workspace.k8s()
    problems = []
    for node in client.CoreV1Api(api).list_node().items:
        ready = next((c for c in node.status.conditions or () if c.type == 'Ready'), None)
        if ready is None or ready.status != 'True':
            problems.append('node %s %s' % (node.metadata.name, ready.reason if ready else 'no Ready condition'))
    apps = client.AppsV1Api(api)
    for deployment in apps.list_deployment_for_all_namespaces().items:
        wanted, ready = deployment.spec.replicas or 0, deployment.status.ready_replicas or 0
        if ready < wanted:
            problems.append('Deployment %s/%s %d/%d' % (deployment.metadata.namespace, deployment.metadata.name, ready, wanted))
    for daemonset in apps.list_daemon_set_for_all_namespaces().items:
        wanted, ready = daemonset.status.desired_number_scheduled or 0, daemonset.status.number_ready or 0
        if ready < wanted:
            problems.append('DaemonSet %s/%s %d/%d' % (daemonset.metadata.namespace, daemonset.metadata.name, ready, wanted))
    custom = client.CustomObjectsApi(api)
    for group, version, plural, kind in (('kustomize.toolkit.fluxcd.io', 'v1', 'kustomizations', 'Kustomization'),
                                         ('helm.toolkit.fluxcd.io', 'v2', 'helmreleases', 'HelmRelease')):
        try:
            items = custom.list_cluster_custom_object(group, version, plural)['items']
        except client.exceptions.ApiException as exc:
            if exc.status == 404:
                continue   # no such CRD in this cluster
            raise
        for item in items:
            ready = next((c for c in (item.get('status') or {}).get('conditions') or () if c.get('type') == 'Ready'), {})
            if ready.get('status') != 'True':
                problems.append('%s %s/%s %s' % (kind, item['metadata']['namespace'], item['metadata']['name'], ready.get('reason')))
    return problems


def workspace_for(row, request, session_workspace, lab_factory, tmp_path):  # pylint: disable=redefined-outer-name
    if row.start == 'converged':
        workspace = request.getfixturevalue('converged_cluster')
        assert workspace.first.rc == 0, 'the converged cluster did not converge: %s' % workspace.first.stdout_path
        wait_until(lambda: cluster_healthy(workspace.lab.status(), workspace), 'the converged cluster being healthy',
                   timeout=restore_timeout())
        return workspace
    if row.start == 'scaled':
        lab = lab_factory(control_planes=1, workers=0, time_scale=0.05)
        return Workspace(lab, str(tmp_path))
    workspace = session_workspace
    if row.start == 'empty':
        workspace.lab.reset()
    elif row.start == 'vms' and not vms_ready(workspace.lab.status())[0]:
        workspace.lab.reset()
        setup = workspace.run('--tags', 'vms', label='setup-vms')
        assert setup.ok, setup.explain()
        wait_until(lambda: vms_ready(workspace.lab.status()), 'every VM running with Talos in maintenance mode', timeout=30)
    return workspace


# ------------------------------------------------------------------------------ steps

def pve_vm(workspace, host):
    return workspace.lab.proxmox().nodes('pve1').qemu(HOST_VMID[host])


def step(workspace, action):
    lab = workspace.lab
    name, args = action[0], action[1:]
    if name == 'stop_vm':
        pve_vm(workspace, args[0]).status.stop.post()
        wait_until(lambda: (pve_vm(workspace, args[0]).status.current.get()['status'] == 'stopped', None),
                   'VM of %s stopped' % args[0], timeout=30)
    elif name == 'power_cycle':
        # Someone stops and starts the VM: the node boots again (a PVE reset would clear a kubelet volume fault).
        since = lab.last_seq('events')
        pve_vm(workspace, args[0]).status.stop.post()
        pve_vm(workspace, args[0]).status.start.post()
        wait_until(lambda: ([e['event'] for e in lab.events(since=since) if e['name'] == args[0]][-1:] == ['started'],
                            lab.events(since=since)), 'VM of %s stopped and started' % args[0], timeout=30)
    elif name == 'fault':
        lab.fault(args[0], args[1], **args[2])
    elif name == 'delete_pods':
        from kubernetes import client  # pylint: disable=import-outside-toplevel
        core = client.CoreV1Api(workspace.k8s())
        core.delete_collection_namespaced_pod(args[0], label_selector=args[1])
    elif name == 'reconcile':
        from kubernetes import client  # pylint: disable=import-outside-toplevel
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat()
        client.CustomObjectsApi(workspace.k8s()).patch_namespaced_custom_object(
            'kustomize.toolkit.fluxcd.io', 'v1', 'flux-system', 'kustomizations', args[0],
            {'metadata': {'annotations': {'reconcile.fluxcd.io/requestedAt': stamp}}})
    elif name == 'flux_reason':
        from kubernetes import client  # pylint: disable=import-outside-toplevel
        objects = client.CustomObjectsApi(workspace.k8s())

        def reached():
            item = objects.get_namespaced_custom_object('kustomize.toolkit.fluxcd.io', 'v1', 'flux-system', 'kustomizations', args[0])
            ready = [c for c in (item.get('status') or {}).get('conditions') or [] if c.get('type') == 'Ready']
            return bool(ready) and ready[0].get('reason') == args[1], ready
        wait_until(reached, 'Kustomization flux-system/%s Ready with reason %s' % tuple(args), timeout=FLUX_REASON_TIMEOUT)
    else:
        raise AssertionError('unknown step %r' % (action,))


def clear_after(row, lab, since, running):
    """Clear the row's fault once the lab has answered `count` requests whose path ends with the given one."""
    _kind, source, path_end, count = row.during

    def met():
        seen = [r for r in lab.requests(since=since, source=source) if r['path'].endswith(path_end)]
        return len(seen) >= count or not running.running(), seen[-1:] or 'the run ended first'
    try:
        helpers.wait_until(met, '%d %s requests to ...%s' % (count, source, path_end), timeout=120, interval=0.1, backoff=1.5)
    finally:
        lab.clear(row.fault, row.target)


def restore(row, workspace):
    lab = workspace.lab
    lab.clear()
    if row.start == 'converged':
        for name in ('proxmox-ccm', 'proxmox-csi', 'apps'):
            step(workspace, ('reconcile', name))
        wait_until(lambda: cluster_healthy(lab.status(), workspace), 'the cluster healthy again after %s' % row.id,
                   timeout=restore_timeout())


# ------------------------------------------------------------------------------ evidence

def retries_seen(run):
    """Every retried error the modules reported (their `retries` results)."""
    errors = []
    for _stage, _task, _host, result, _event in run.results():
        for item in [result] + list(result.get('results') or []):
            errors += [str(r.get('error', r)) for r in item.get('retries') or [] if isinstance(r, dict)]
    return errors


def remediation_steps(run):
    return [result['remediation']['summary'] for _s, _t, _h, result, _e in run.results(task='Remediation step - log')
            if isinstance(result.get('remediation'), dict)]


def evidence(row, run, workspace, since, faults_at_end):
    """(bit, summary): did the fault meet the run, and what shows it."""
    kind = row.names[0]
    if kind == 'retries':
        errors = [e for e in retries_seen(run) if row.names[1].lower() in e.lower()]
        return bool(errors), 'retried, e.g. %s' % (min(errors) if errors else '-')
    if kind == 'k8s 503':
        answers = [r for r in workspace.lab.requests(since=since, source='k8s') if r['status'] == 503]
        return bool(answers), 'the API answered 503 to requests of the run (%s), which went on' % (answers[0]['path'] if answers else '-')
    if kind == 'fault active':
        active = [f for f in faults_at_end if f.get('name') == row.fault]
        return bool(active), 'fault active for the whole run: %s %s' % (row.fault, active[0].get('params') if active else '-')
    steps = remediation_steps(run)
    missing = [name for name in row.names if not any(name in s for s in steps)]
    return not missing, 'remediation: %s' % ('; '.join(steps) or 'none')


def playbook_of(row):
    """The playbook a row's run uses: site.yml, or playbooks/<row.playbook>.yml."""
    if row.playbook is None:
        return SITE
    return os.path.join(os.path.dirname(SITE), 'playbooks', '%s.yml' % row.playbook)


def failure_text(failure):
    stage, task, host, message = failure
    return '[%s] %s / %s: %s' % (host, stage, task, message)


def resolve_names(names, status):
    """The row's names with `{addr:HOST}` replaced by the address of HOST's Talos node in the lab now."""
    addresses = dict((n['name'], n['address']) for n in (status.get('talos') or {}).get('nodes') or [] if n.get('address'))

    def address(match):
        if match.group(1) not in addresses:
            raise AssertionError('the lab has no Talos node %s with an address (nodes: %s)' % (match.group(1), sorted(addresses)))
        return addresses[match.group(1)]
    return [ADDRESS.sub(address, name) for name in names]


def naming_failure(failures, names):
    """(failure whose message names every one of names, or None, [(failure, missing names)] of the others)."""
    misses = []
    for failure in failures:
        missing = [name for name in names if name not in failure[3]]
        if not missing:
            return failure, misses
        misses.append((failure, missing))
    return None, misses


# ------------------------------------------------------------------------------ the matrix

@pytest.fixture(scope='module')
def matrix_results():
    """Row id -> what the row saw; merged into docs/reliability-results.json and rendered at the end of the module."""
    seen = {}
    yield seen
    if seen:
        results = matrix.load_results()
        results.update(seen)
        matrix.save_results(results)
        matrix.write_document(results)


@pytest.mark.parametrize('row', matrix.ROWS, ids=[r.id for r in matrix.ROWS])
def test_fault(row, request, session_workspace, lab_factory, tmp_path, matrix_results):  # pylint: disable=redefined-outer-name
    world = current_world()
    row = matrix.for_world(row, world)
    record = {'outcome': 'error', 'passed': False, 'message': '', 'world': world}
    workspace = workspace_for(row, request, session_workspace, lab_factory, tmp_path)
    lab = workspace.lab
    try:
        for action in row.before:
            step(workspace, action)
        lab.fault(row.fault, row.target, **row.params)
        for action in row.after:
            step(workspace, action)
        names = resolve_names(row.names, lab.status()) if row.expect == 'failed' else list(row.names)
        for attempt in range(1, row.attempts + 1):
            since = lab.last_seq('requests')
            running = workspace.start('--tags', row.run, extra_vars=row.extra_vars, env=row.env, playbook=playbook_of(row),
                                      label=row.id if attempt == 1 else '%s-%d' % (row.id, attempt))
            if row.during:
                clear_after(row, lab, since, running)
            run = running.wait()
            faults_at_end = lab.status()['lab'].get('faults') or []
            if not run.ok:
                break
            bit, summary = evidence(row, run, workspace, since, faults_at_end)
            if bit:
                break   # a flapping fault met (or a fault that is always met): no further run
        record['outcome'] = 'recovered' if run.ok else 'failed'
        if run.ok:
            record['message'] = matrix.normalize(summary)
            assert row.expect == 'recovered', 'expected a failure, the run converged: %s' % summary
            assert bit, 'the run converged but shows no sign of the fault (%s): %s' % (summary, run.explain())
        else:
            failures = run.failures()
            assert failures, run.explain()
            in_stage = [f for f in failures if f[0] == row.stage]
            # The message itself must name the object and the cause: the host Ansible prefixes does not count.
            named, misses = naming_failure(in_stage, names)
            # the document shows the stage in a column of its own; the host of a run_once task varies from run to run
            record['message'] = matrix.normalize((named or (in_stage or failures)[0])[3])
            assert row.expect == 'failed', 'expected recovery: %s' % run.explain()
            assert in_stage, 'the failure came from another stage than %s: %s' % (row.stage, run.explain())
            assert named, 'no failure message of stage %s names all of %s:\n%s' % (
                row.stage, names, '\n'.join('%s\n  (missing %s)' % (failure_text(f), missing) for f, missing in misses))
        record['passed'] = True
    finally:
        matrix_results[row.id] = record
        restore(row, workspace)


def test_the_matrix_covers_every_fault_the_lab_offers(lab):
    offered = set(f['name'] for f in lab.control('faults'))
    covered = set(r.fault for r in matrix.ROWS)
    assert offered - covered == set(), 'faults the lab offers without a row: %s' % sorted(offered - covered)
    assert covered - offered == set(), 'rows for faults the lab does not offer: %s' % sorted(covered - offered)
    assert len(covered) >= 20, 'the matrix reaches %d distinct lab faults, the issue asks for at least 20' % len(covered)
    assert len(set(r.id for r in matrix.ROWS)) == len(matrix.ROWS)
    assert set(r.layer for r in matrix.ROWS) == {'PVE', 'Talos', 'Kubernetes', 'Flux'}


def test_every_failing_row_checks_the_object_and_the_cause():
    """A failing row names at least two things the message must show (what failed, and why), none of them empty."""
    variants = [matrix.for_world(r, world) for r in matrix.ROWS for world in [None] + sorted(r.worlds)]
    thin = sorted(set(r.id for r in variants if r.expect == 'failed' and (len(r.names) < 2 or not all(n.strip() for n in r.names))))
    assert not thin, 'failing rows that do not check both the object and the cause: %s' % thin
    assert set(r.expect for r in matrix.ROWS) == {'recovered', 'failed'}


def test_names_resolve_talos_addresses_from_the_lab_status():
    status = {'talos': {'nodes': [{'name': 'lab-w-1', 'address': '127.0.71.100'}, {'name': 'lab-cp-1', 'address': None}]}}
    assert resolve_names(['{addr:lab-w-1}:50000', 'gave up'], status) == ['127.0.71.100:50000', 'gave up']
    with pytest.raises(AssertionError, match='no Talos node lab-cp-1'):
        resolve_names(['{addr:lab-cp-1}'], status)
    failures = [('vms', 'gate', 'lab-w-1', 'talos node 127.0.71.100:50000: gave up'), ('vms', 'gate', 'lab-w-2', 'other')]
    assert naming_failure(failures, ['gave up'])[0] == failures[0]
    named, misses = naming_failure(failures[1:], ['gave up'])
    assert named is None and misses == [(failures[1], ['gave up'])]


def test_the_document_shows_this_table_and_the_latest_results():
    with open(matrix.DOC, encoding='utf-8') as handle:
        text = handle.read()
    expected = matrix.render_document(text, matrix.render_table())
    assert text == expected, ('docs/reliability.md differs from the table and docs/reliability-results.json; '
                              'run .venv/bin/python tests/integration/fault_matrix.py')


def test_a_row_expects_per_world_what_the_world_changes():
    source = next(r for r in matrix.ROWS if r.id == 'flux-source-not-ready')
    assert matrix.for_world(source, 'lab').names == source.names
    upstream = matrix.for_world(source, 'upstream')
    assert upstream.names != source.names and 'The requested URL returned error: 503' in upstream.names
    assert upstream.note != source.note and upstream.worlds == {} and (source.stage, upstream.stage) == ('flux', 'flux_install')
    with pytest.raises(ValueError, match="worlds: unknown world 'k3s'"):
        matrix.row('x', 'Flux', 'f', 'flux', 'converged', 'flux', 'failed', ['a', 'b'], 'n', worlds={'k3s': {'names': ['c']}})
    with pytest.raises(ValueError, match=r"only stage, names, note may differ, got \['fault'\]"):
        matrix.row('x', 'Flux', 'f', 'flux', 'converged', 'flux', 'failed', ['a', 'b'], 'n', worlds={'lab': {'fault': 'g'}})
    assert current_world() in matrix.WORLDS


def test_the_table_says_which_world_each_result_was_measured_on():
    rows = [matrix.row('one', 'Flux', 'f', 'flux', 'converged', 'flux', 'failed', ['a', 'b'], 'on lab',
                       worlds={'upstream': {'note': 'on upstream'}}),
            matrix.row('two', 'Flux', 'g', 'flux', 'converged', 'flux', 'failed', ['a', 'b'], 'everywhere'),
            matrix.row('three', 'Flux', 'h', 'flux', 'converged', 'flux', 'failed', ['a', 'b'], 'everywhere')]
    results = {'one': {'outcome': 'failed', 'passed': True, 'message': 'm1', 'world': 'upstream'},
               'two': {'outcome': 'failed', 'passed': True, 'message': 'm2', 'world': 'upstream'},
               'three': {'outcome': 'failed', 'passed': True, 'message': 'm3', 'world': 'lab'}}
    table = matrix.render_table(rows, results).splitlines()
    assert 'failed: on upstream' in table[2] and '| failed, as expected |' in table[2]
    assert '| failed, as expected (on lab) |' in table[4]
    assert table[-2] == '2 results were measured on %s.' % matrix.WORLDS['upstream']
    assert table[-1] == '1 measured on %s: three.' % matrix.WORLDS['lab']
    del results['three']
    table = matrix.render_table(rows, results).splitlines()
    assert table[-1] == 'Every result was measured on %s.' % matrix.WORLDS['upstream'] and 'not run yet' in table[4]
