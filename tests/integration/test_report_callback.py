"""The timeline callback through a real ansible-playbook run (tests/integration/fixtures/report/site.yml).

The run has two clusters (alpha, beta), stages tagged like playbooks/site.yml, every gate and
remediation convention of docs/report.md, a Flux graph from flux_graph, and secrets: a vaulted
variable (used with no_log, and once on purpose without it), and a clear variable named like a
secret. The files it writes must validate against docs/report.schema.json, say what happened, hold
no secret, and report.html must render in headless Chromium with its timeline and tables.
"""
import json
import os
import shutil
import stat
import struct
import subprocess
import zlib

import jsonschema
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, 'tests', 'integration', 'fixtures', 'report')
PLAYBOOK_BIN = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
VAULT_BIN = os.path.join(ROOT, '.venv', 'bin', 'ansible-vault')
SCHEMA = os.path.join(ROOT, 'docs', 'report.schema.json')

VAULTED_SECRET = 'vaulted-token-9d8e7f6a'
NAMED_SECRET = 'clear-named-secret-5f1c2e'   # inventory/group_vars/all.yml, report_api_token_secret
CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser')

pytestmark = pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    """One playbook run with the callback enabled; returns (output dir, completed process)."""
    work = tmp_path_factory.mktemp('report-run')
    password = work / 'vault-password'
    password.write_text('test-vault-password\n')
    vault = work / 'vault.yml'
    vault.write_text('---\nreport_vault_token: %s\n' % VAULTED_SECRET)
    subprocess.run([VAULT_BIN, 'encrypt', '--vault-password-file', str(password), str(vault)], check=True,
                   capture_output=True, cwd=ROOT)
    assert VAULTED_SECRET not in vault.read_text()
    out = work / 'reports'
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'),
               ANSIBLE_CALLBACKS_ENABLED='proxtalos.cluster.timeline', PROXTALOS_REPORT_DIR=str(out),
               ANSIBLE_NOCOLOR='1', ANSIBLE_FORCE_COLOR='0')
    process = subprocess.run(
        [PLAYBOOK_BIN, '-i', os.path.join(FIXTURES, 'inventory'), os.path.join(FIXTURES, 'site.yml'),
         '--vault-password-file', str(password), '-e', '@%s' % vault,
         '-e', 'flux_repo=%s' % os.path.join(FIXTURES, 'gitops')],
        cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stdout + process.stderr
    return out, process


def load(out, cluster):
    with open(os.path.join(str(out), cluster, 'report.json')) as stream:
        return json.load(stream)


def test_one_report_per_cluster_and_valid_against_schema(run):
    out, _process = run
    assert sorted(os.listdir(str(out))) == ['alpha', 'beta']
    with open(SCHEMA) as stream:
        schema = json.load(stream)
    jsonschema.Draft202012Validator.check_schema(schema)
    for cluster in ('alpha', 'beta'):
        jsonschema.Draft202012Validator(schema).validate(load(out, cluster))
        assert sorted(os.listdir(os.path.join(str(out), cluster))) == ['report.html', 'report.json', 'timeline.md']


def test_the_playbook_and_each_tasks_start(run):
    # the playbook's name from ansible-playbook's command line; a result finds its task's start (the host and the
    # task's place), so the gate task's span is its run, not the moment of its result
    out, _process = run
    for cluster in ('alpha', 'beta'):
        report = load(out, cluster)
        assert (report['playbook'], report['check_mode']) == ('site.yml', False)
    gate = [gate for gate in load(out, 'alpha')['gates']
            if gate['task'] == 'Gate - inventory values present' and gate['host'] == 'alpha-cp-1'][0]
    assert gate['end'] > gate['start']


def test_schema_rejects_a_report_missing_its_gates(run):
    out, _process = run
    with open(SCHEMA) as stream:
        schema = json.load(stream)
    report = load(out, 'alpha')
    del report['gates']
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, schema)


def test_files_are_private(run):
    out, _process = run
    for cluster in ('alpha', 'beta'):
        for name in ('report.html', 'report.json', 'timeline.md'):
            mode = stat.S_IMODE(os.stat(os.path.join(str(out), cluster, name)).st_mode)
            assert mode == 0o600, (cluster, name, oct(mode))


def test_stages_in_run_order_with_the_bootstrap_timeline(run):
    out, _process = run
    alpha = load(out, 'alpha')
    assert [stage['name'] for stage in alpha['stages']] == ['preflight', 'vms', 'cni']
    assert [row['stage'] for row in alpha['bootstrap_timeline']] == ['preflight', 'vms', 'cni']
    assert all(row['status'] == 'ok' for row in alpha['bootstrap_timeline'])
    starts = [stage['start'] for stage in alpha['stages']]
    assert starts == sorted(starts)
    assert alpha['stages'][2]['hosts'] == ['alpha-w-1']
    # beta has no host in the cni play
    assert [stage['name'] for stage in load(out, 'beta')['stages']] == ['preflight', 'vms']
    with open(os.path.join(str(out), 'alpha', 'timeline.md')) as stream:
        table = stream.read()
    assert '| stage | start offset | status |' in table
    assert '| preflight | +0:00 | ok |' in table


def test_gates_by_every_convention(run):
    out, _process = run
    gates = load(out, 'alpha')['gates']
    by_task = {}
    for gate in gates:
        by_task.setdefault(gate['task'], {})[gate['host']] = gate
    named = by_task['Gate - inventory values present']
    assert set(named) == {'alpha-cp-1', 'alpha-w-1'}
    assert named['alpha-cp-1']['ok'] is True and named['alpha-cp-1']['name'] == 'inventory values present'
    explicit = by_task['A gate by the result key convention']['alpha-w-1']
    assert explicit['name'] == 'VM running and its agent answering'
    assert explicit['observation'] == 'VM 111 running; agent reports 127.0.0.3'
    assert (explicit['elapsed'], explicit['attempts'], explicit['stage']) == (1.5, 3, 'vms')
    failed = by_task['Gate - address answers (fails on the worker, ignored)']
    assert failed['alpha-cp-1']['ok'] is True
    assert failed['alpha-w-1']['ok'] is False
    assert 'alpha-w-1 does not answer on 127.0.0.3:50000' in failed['alpha-w-1']['observation']


def test_remediation_log(run):
    out, _process = run
    steps = load(out, 'alpha')['remediations']
    assert [step['action'] for step in steps] == ['talos reboot', 'PVE hard reset (no_log)']
    reboot, reset = steps
    assert reboot['reason'] == 'kubelet waits for volume /var/lib/kubelet'
    assert (reboot['target'], reboot['attempt'], reboot['outcome'], reboot['stage']) == \
        ('alpha-w-1', 1, 'node Ready after reboot', 'cni')
    # a no_log step keeps its name and status only
    assert (reset['reason'], reset['outcome']) == (None, 'ok')
    assert load(out, 'beta')['remediations'] == []


def test_flux_graph_and_cluster_facts(run):
    out, _process = run
    alpha = load(out, 'alpha')
    graph = alpha['flux_graph']
    assert sorted(node['id'] for node in graph['nodes']) == [
        'Kustomization/flux-system/apps', 'Kustomization/flux-system/cilium-config',
        'Kustomization/flux-system/proxmox-csi', 'Kustomization/flux-system/sealed-secrets']
    assert ['Kustomization/flux-system/proxmox-csi', 'Kustomization/flux-system/apps'] in graph['edges']
    assert len(graph['tiers']) == 3
    # flux_graph ran once (run_once on alpha-cp-1): beta's report has no graph
    assert load(out, 'beta')['flux_graph'] is None
    facts = alpha['facts']
    assert facts['cluster']['cluster_name'] == 'alpha'
    assert facts['cluster']['talos_version'] == 'v1.13.9'
    nodes = dict((node['name'], node) for node in facts['nodes'])
    assert sorted(nodes) == ['alpha-cp-1', 'alpha-w-1']
    assert (nodes['alpha-w-1']['role'], nodes['alpha-w-1']['vm_id'], nodes['alpha-w-1']['node_ip']) == ('worker', 111, '127.0.0.3')
    assert alpha['hosts']['alpha-w-1']['ignored'] == 2


def test_no_secret_in_any_report_file(run):
    out, process = run
    seen_mask = False
    for directory, _dirs, files in os.walk(str(out)):
        for name in files:
            with open(os.path.join(directory, name), encoding='utf-8') as stream:
                text = stream.read()
            assert VAULTED_SECRET not in text, name
            assert NAMED_SECRET not in text, name
            seen_mask = seen_mask or '$REDACTED$' in text
    # The fixture leaks both secrets once without no_log: the report masked them instead of dropping the task.
    assert seen_mask
    tasks = [gate['task'] for gate in load(out, 'alpha')['gates']]
    assert 'Gate - address answers (fails on the worker, ignored)' in tasks
    # the terminal summary is the callback's too
    summary = process.stdout[process.stdout.index('RUN REPORT [alpha]'):]
    assert VAULTED_SECRET not in summary and NAMED_SECRET not in summary
    assert os.path.join(str(out), 'alpha', 'report.html') in summary


def _png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit, non-interlaced RGB or RGBA PNG."""
    with open(path, 'rb') as stream:
        data = stream.read()
    assert data[:8] == b'\x89PNG\r\n\x1a\n'
    offset = 8
    chunks = {}
    idat = b''
    while offset < len(data):
        length, kind = struct.unpack('>I4s', data[offset:offset + 8])
        body = data[offset + 8:offset + 8 + length]
        offset += 12 + length
        if kind == b'IDAT':
            idat += body
        else:
            chunks[kind] = body
    width, height, depth, colour, _comp, _filter, interlace = struct.unpack('>IIBBBBB', chunks[b'IHDR'])
    assert depth == 8 and colour in (2, 6) and interlace == 0
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows = []
    previous = bytearray(stride)
    position = 0
    for _row in range(height):
        kind = raw[position]
        line = bytearray(raw[position + 1:position + 1 + stride])
        position += 1 + stride
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            upper_left = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                estimate = left + up - upper_left
                pa, pb, pc = abs(estimate - left), abs(estimate - up), abs(estimate - upper_left)
                predictor = left if pa <= pb and pa <= pc else (up if pb <= pc else upper_left)
                line[i] = (line[i] + predictor) & 0xFF
        rows.append([tuple(line[x * channels:x * channels + 3]) for x in range(width)])
        previous = line
    return width, height, rows


def _chromium(tmp_path, *arguments):
    profile = tmp_path / 'chromium-profile'
    profile.mkdir(exist_ok=True)
    command = [CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
               '--disable-background-networking', '--disable-component-update', '--disable-sync',
               '--user-data-dir=%s' % profile] + list(arguments)
    return subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason='chromium is not installed (scripts/system-packages installs it)')
def test_html_renders_in_headless_chromium(run, tmp_path):
    out, _process = run
    page = 'file://%s' % os.path.join(str(out), 'alpha', 'report.html')
    dom = _chromium(tmp_path, '--dump-dom', page).stdout
    assert '<svg' in dom and 'id="gantt"' in dom
    assert dom.count('class="stage-bar"') == 3
    assert dom.count('class="gate-bar"') == len(load(out, 'alpha')['gates'])
    assert 'id="flux-graph"' in dom
    for heading in ('Bootstrap timeline', 'Gates', 'Remediation log', 'Flux dependency graph', 'Cluster'):
        assert '>%s</h2>' % heading in dom
    assert dom.count('<table>') >= 6
    assert 'src=' not in dom and '<script' not in dom and 'href="http' not in dom   # self-contained

    shot = tmp_path / 'report.png'
    _chromium(tmp_path, '--window-size=1280,1600', '--screenshot=%s' % shot, page)
    width, height, rows = _png_pixels(str(shot))
    assert (width, height) == (1280, 1600)
    colours = set()
    for row in rows[::2]:
        colours.update(row[::2])
    # the Gantt chart's stage bars (ok: #2f9e44), the failed gate (#e03131) and a table header (#f1f3f7) were painted
    for expected in ((0x2f, 0x9e, 0x44), (0xe0, 0x31, 0x31), (0xf1, 0xf3, 0xf7)):
        assert expected in colours, expected


def test_under_a_json_stdout_callback_the_summary_goes_to_stderr(tmp_path):
    playbook = tmp_path / 'one.yml'
    playbook.write_text('---\n- name: One stage\n  hosts: alpha-cp-1\n  gather_facts: false\n  tags: [vms]\n  tasks:\n'
                        '    - name: Gate - something\n      ansible.builtin.debug: {msg: hi}\n')
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_CALLBACKS_ENABLED='proxtalos.cluster.timeline',
               ANSIBLE_STDOUT_CALLBACK='ansible.posix.json', PROXTALOS_REPORT_DIR=str(tmp_path / 'out'), ANSIBLE_NOCOLOR='1')
    process = subprocess.run([PLAYBOOK_BIN, '-i', os.path.join(FIXTURES, 'inventory'), str(playbook)], cwd=ROOT, env=env,
                             check=False, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr
    assert json.loads(process.stdout)['stats']['alpha-cp-1']['ok'] == 1
    assert 'proxtalos run report: cluster alpha, OK' in process.stderr
    assert load(tmp_path / 'out', 'alpha')['gates'][0]['name'] == 'something'
