"""Secrets hygiene and TLS defaults.

Hygiene: the full site.yml at -vvv against a lab (the `converged_cluster` run, the output a user sees), then every
value that must stay secret is searched for in everything the collection printed or wrote: stdout and stderr of
every run against that lab (the fault matrix adds its runs when it shares the session), the run report files,
every artifact that is not itself a secret holder, and the lab's own logs (its request log is what a proxy in front
of PVE, Talos or Kubernetes would log: a secret in a URL would show there). Zero hits. The secret holders (the
secrets bundle, the sealed-secrets keypair, the machine configs, the talosconfig, the kubeconfig) are 0600, and so is
every other file the run writes under the inventory's secrets/ and the artifacts folder.

The secrets: every key, token and secret of the Talos bundle, the sealed-secrets private key, the kubeconfig's and
the talosconfig's client keys, the PVE API token secret (and root password), the lab Git server's token. Each is
searched in the forms it travels in: as stored, base64-decoded (PEM), each line of a PEM body, and a slice from the
middle of a long value (a value cut or re-wrapped still shows).

TLS: PVE, Talos (outside maintenance mode) and Kubernetes modules refuse a server whose certificate the configured
CA did not sign; PVE and Kubernetes verification can be turned off only explicitly (validate_certs: false), and the
module warns when it is; no inventory or role default turns verification off.
"""

import base64
import binascii
import glob
import os
import re
import sys

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_lab import ROOT, file_mode  # noqa: E402  pylint: disable=wrong-import-position,import-error

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# Artifacts that hold secrets by design (0600); every other file must hold none.
SECRET_HOLDER_PATTERNS = ('kubeconfig', 'talosconfig', 'lab-*.yaml')
MIDDLE_SLICE = 40


# ------------------------------------------------------------------------------ the secret values

def _pem_needles(pem_text):
    """The lines of a PEM body (each unique to its key), plus a slice from the middle of the whole body."""
    body = [line.strip() for line in pem_text.splitlines() if line.strip() and not line.startswith('-----')]
    needles = [line for line in body if len(line) >= 32]
    joined = ''.join(body)
    if len(joined) > 2 * MIDDLE_SLICE:
        middle = len(joined) // 2
        needles.append(joined[middle:middle + MIDDLE_SLICE])
    return needles


def _value_needles(value):
    """A secret as stored, a slice of its middle, and - when it is base64 of a PEM - the PEM forms."""
    value = str(value).strip()
    needles = [value]
    if len(value) > 2 * MIDDLE_SLICE:
        middle = len(value) // 2
        needles.append(value[middle:middle + MIDDLE_SLICE])
    try:
        decoded = base64.b64decode(value, validate=True).decode('ascii')
    except (binascii.Error, ValueError, UnicodeDecodeError):
        decoded = ''
    if '-----BEGIN' in decoded:
        needles.extend(_pem_needles(decoded))
    return needles


def _walk_keys(tree, path=''):
    """(dotted path, value) of every leaf of a YAML tree."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _walk_keys(value, '%s.%s' % (path, key) if path else str(key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from _walk_keys(value, '%s[%d]' % (path, index))
    else:
        yield path, tree


def _public_texts(bundle, kubeconfig, talosconfig, sealed_cert):
    """Every certificate of the run, in the forms it travels in (as stored and as PEM): public data.

    A key's PEM body holds its public key (a SEC1 EC key ends with the public point, a PKCS#1 RSA key starts with
    the modulus), and so does the certificate made for it. When the two line up in base64 (about one run in two
    for a P-256 CA, measured), a slice of the key is a slice of the printed certificate: found there, it proves
    nothing, so such a needle is dropped. The key as a whole, and its other slices, are still searched."""
    values = [value for path, value in _walk_keys(bundle) if path.endswith('.crt') and value]
    values += [cluster['cluster'].get('certificate-authority-data') for cluster in kubeconfig['clusters']]
    values += [user['user'].get('client-certificate-data') for user in kubeconfig['users']]
    for context in talosconfig['contexts'].values():
        values += [context.get('ca'), context.get('crt')]
    texts = [sealed_cert]
    for value in filter(None, values):
        texts.append(str(value))
        try:
            texts.append(base64.b64decode(str(value), validate=True).decode('ascii'))
        except (binascii.Error, ValueError, UnicodeDecodeError):
            pass
    return texts


def secret_values(workspace):
    """{name: [needles]} of every secret the run made or used (no needle that is also public data)."""
    secrets = {}
    with open(workspace.bundle, encoding='utf-8') as handle:
        bundle = yaml.safe_load(handle)
    for path, value in _walk_keys(bundle):
        # cluster.id is the cluster's public identity; certificates (.crt) are public; everything else is secret.
        if value and path != 'cluster.id' and not path.endswith('.crt'):
            secrets['talos bundle ' + path] = _value_needles(value)
    with open(workspace.sealed_key, encoding='utf-8') as handle:
        sealed = handle.read()
    secrets['sealed-secrets private key'] = _pem_needles(sealed) + _value_needles(
        base64.b64encode(sealed.encode('ascii')).decode('ascii'))[1:]
    with open(workspace.kubeconfig, encoding='utf-8') as handle:
        kubeconfig = yaml.safe_load(handle)
    for user in kubeconfig['users']:
        secrets['kubeconfig client key of %s' % user['name']] = _value_needles(user['user']['client-key-data'])
    with open(workspace.talosconfig, encoding='utf-8') as handle:
        talosconfig = yaml.safe_load(handle)
    for name, context in talosconfig['contexts'].items():
        secrets['talosconfig client key of %s' % name] = _value_needles(context['key'])
    lab = workspace.lab
    # the flux stage seals the PVE token (the CSI config) and the Git token into the GitOps repository: their base64
    # forms are what a Secret's data holds, the basic auth header what a push sends
    secrets['PVE API token secret'] = [lab.token_secret, base64.b64encode(lab.token_secret.encode()).decode()]
    secrets['PVE root password'] = [lab.password]
    with open(os.path.join(lab.run_dir, 'git-token'), encoding='utf-8') as handle:
        token = handle.read().strip()
    secrets['lab Git server token'] = [token, base64.b64encode(token.encode()).decode(), base64.b64encode(('flux:' + token).encode()).decode()]
    with open(os.path.join(workspace.secrets_dir, 'sealed-secrets.crt'), encoding='utf-8') as handle:
        sealed_cert = handle.read()
    public = _public_texts(bundle, kubeconfig, talosconfig, sealed_cert)
    for name, needles in secrets.items():
        needles[:] = [needle for needle in needles if not any(needle in text for text in public)]
        assert needles and all(len(n) >= 16 for n in needles), 'secret %s has a needle too short to be unique: %r' % (name, needles)
    return secrets


def find_secrets(paths, secrets):
    """[(path, secret name)] of every file that contains any form of any secret."""
    hits = []
    for path in paths:
        with open(path, 'rb') as handle:
            text = handle.read().decode('utf-8', errors='replace')
        # JSON output escapes '/' in some encoders; search the unescaped text as well.
        unescaped = text.replace('\\/', '/')
        for name, needles in secrets.items():
            if any(needle in text or needle in unescaped for needle in needles):
                hits.append((path, name))
    return hits


def files_under(folder):
    return sorted(p for p in glob.glob(os.path.join(folder, '**', '*'), recursive=True) if os.path.isfile(p))


def is_secret_holder(path):
    name = os.path.basename(path)
    return any(re.fullmatch(pattern.replace('*', '.*'), name) for pattern in SECRET_HOLDER_PATTERNS)


# ------------------------------------------------------------------------------ hygiene

def test_the_full_run_at_vvv_converged(converged_cluster):
    first = converged_cluster.first
    assert first.rc == 0, 'site.yml at -vvv failed (rc %d); output in %s' % (first.rc, first.stdout_path)
    assert 'PLAY RECAP' in first.stdout and ' -vvv' not in first.stderr
    # -vvv really was on: module invocations are shown
    assert 'ESTABLISH LOCAL CONNECTION' in first.stdout


def test_no_secret_value_in_any_output_report_artifact_or_lab_log(converged_cluster):
    workspace = converged_cluster
    secrets = secret_values(workspace)
    logs = files_under(workspace.logs)
    reports = files_under(workspace.first_report)
    artifacts = [p for p in files_under(workspace.artifacts) if not is_secret_holder(p)]
    lab_logs = [os.path.join(workspace.lab.run_dir, name) for name in ('requests.log', 'lab.log')]
    scanned = logs + reports + artifacts + lab_logs
    assert len(logs) >= 2 and reports and any(p.endswith('report.json') for p in artifacts), scanned
    first_output = workspace.first.stdout_path
    assert first_output in logs and os.path.getsize(first_output) > 100000, 'the -vvv output is suspiciously small: %s' % first_output
    hits = find_secrets(scanned, secrets)
    assert hits == [], 'secret values found:\n' + '\n'.join('%s: %s' % hit for hit in hits)


def test_the_scan_finds_a_secret_where_there_is_one(converged_cluster, tmp_path):
    """The scanner itself: each secret, in each of its forms, planted in a file, is found."""
    secrets = secret_values(converged_cluster)
    assert len(secrets) >= 12, sorted(secrets)
    for name, needles in secrets.items():
        for index, needle in enumerate(needles):
            planted = tmp_path / ('planted-%d.txt' % index)
            planted.write_text('TASK [x] ok: {"msg": "prefix %s suffix"}\n' % needle, encoding='utf-8')
            assert find_secrets([str(planted)], {name: needles}) == [(str(planted), name)]


def test_every_file_that_holds_a_secret_is_0600(converged_cluster):
    workspace = converged_cluster
    holders = files_under(workspace.secrets_dir) + [p for p in files_under(workspace.artifacts) if is_secret_holder(p)]
    names = sorted(os.path.basename(p) for p in holders)
    assert {'talos-secrets.yaml', 'sealed-secrets.key', 'kubeconfig', 'talosconfig', 'lab-cp-1.yaml', 'lab-w-3.yaml'} <= set(names), names
    wrong = ['%s %o' % (p, file_mode(p)) for p in holders if file_mode(p) != 0o600]
    assert wrong == [], 'files holding secrets that are not 0600: %s' % wrong
    # the report files describe the run (node names, messages): not secrets, but kept private the same way
    wrong = ['%s %o' % (p, file_mode(p)) for p in files_under(workspace.artifacts) if file_mode(p) != 0o600]
    assert wrong == [], wrong
    assert file_mode(workspace.secrets_dir) & 0o077 == 0 and file_mode(workspace.artifacts) & 0o077 == 0


# ------------------------------------------------------------------------------ TLS defaults

def tls_tasks(workspace, foreign):
    """Tasks that reach each API family with a CA that did not sign its certificate, and with verification off."""
    lab = workspace.lab
    pve = {'api_host': lab.pve_host, 'api_port': lab.pve_port, 'api_user': lab.user, 'api_token_id': lab.token_name,
           'api_token_secret': "{{ lookup('ansible.builtin.file', '%s') }}" % lab.paths.token}
    cp1 = '%s.11' % lab.net
    vm = [{'name': 'lab-cp-1', 'node': 'pve1', 'vmid': 1011}]
    return [
        {'name': 'PVE with the system trust store (no ca_path): refused',
         'proxtalos.cluster.proxmox_vm_info': dict(pve, vms=vm), 'register': 'pve_default', 'ignore_errors': True},
        {'name': 'PVE with a CA that did not sign its certificate: refused',
         'proxtalos.cluster.proxmox_vm_info': dict(pve, vms=vm, ca_path=foreign['ca']), 'ignore_errors': True},
        {'name': 'PVE with validate_certs false: answers, with a warning',
         'proxtalos.cluster.proxmox_vm_info': dict(pve, vms=vm, validate_certs=False)},
        {'name': 'PVE with the lab CA: answers',
         'proxtalos.cluster.proxmox_vm_info': dict(pve, vms=vm, ca_path=lab.ca_path)},
        {'name': 'Talos with a talosconfig of another cluster: refused',
         'proxtalos.cluster.talos_info': {'nodes': [{'name': 'lab-cp-1', 'address': cp1}], 'talosconfig': foreign['talosconfig'], 'gather': ['version'],
                                          'wait_timeout': 0}, 'ignore_errors': True},
        {'name': 'Talos with its own talosconfig: answers',
         'proxtalos.cluster.talos_info': {'nodes': [{'name': 'lab-cp-1', 'address': cp1}], 'talosconfig': workspace.talosconfig, 'gather': ['version'],
                                          'wait_timeout': 0}},
        {'name': 'Kubernetes with a kubeconfig whose CA did not sign the API certificate: refused',
         'proxtalos.cluster.k8s_gate': {'gate': 'api', 'kubeconfig': foreign['kubeconfig'], 'wait_timeout': 0},
         'ignore_errors': True},
        {'name': 'Kubernetes with validate_certs false: answers, with a warning',
         'proxtalos.cluster.k8s_gate': {'gate': 'api', 'kubeconfig': foreign['kubeconfig'], 'validate_certs': False,
                                        'wait_timeout': 0}},
        {'name': 'Kubernetes with its own kubeconfig: answers',
         'proxtalos.cluster.k8s_gate': {'gate': 'api', 'kubeconfig': workspace.kubeconfig, 'wait_timeout': 0}},
    ]


def foreign_credentials(workspace, folder):
    """A talosconfig and a kubeconfig that are the cluster's own except for the CA they trust."""
    from cryptography import x509  # pylint: disable=import-outside-toplevel
    from cryptography.hazmat.primitives import hashes, serialization  # pylint: disable=import-outside-toplevel
    from cryptography.hazmat.primitives.asymmetric import ec  # pylint: disable=import-outside-toplevel
    import datetime  # pylint: disable=import-outside-toplevel
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.ORGANIZATION_NAME, 'not-this-cluster')])
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(key, hashes.SHA256()))
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    ca_b64 = base64.b64encode(ca_pem).decode('ascii')
    paths = {'ca': os.path.join(folder, 'foreign-ca.pem'), 'talosconfig': os.path.join(folder, 'foreign-talosconfig'),
             'kubeconfig': os.path.join(folder, 'foreign-kubeconfig')}
    with open(paths['ca'], 'wb') as handle:
        handle.write(ca_pem)
    with open(workspace.talosconfig, encoding='utf-8') as handle:
        talosconfig = yaml.safe_load(handle)
    for context in talosconfig['contexts'].values():
        context['ca'] = ca_b64
    with open(workspace.kubeconfig, encoding='utf-8') as handle:
        kubeconfig = yaml.safe_load(handle)
    for cluster in kubeconfig['clusters']:
        cluster['cluster']['certificate-authority-data'] = ca_b64
    for path, data in ((paths['talosconfig'], talosconfig), (paths['kubeconfig'], kubeconfig)):
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 'w', encoding='utf-8') as handle:
            yaml.safe_dump(data, handle)
    return paths


def test_each_api_family_refuses_an_untrusted_server_by_default_and_warns_when_told_not_to_verify(converged_cluster, tmp_path):
    workspace = converged_cluster
    foreign = foreign_credentials(workspace, str(tmp_path))
    playbook = tmp_path / 'tls.yml'
    playbook.write_text(yaml.safe_dump([{'name': 'TLS defaults', 'hosts': 'lab-cp-1', 'gather_facts': False,
                                         'tasks': tls_tasks(workspace, foreign)}], sort_keys=False), encoding='utf-8')
    run = workspace.run(label='tls-defaults', playbook=str(playbook))
    assert run.rc == 0, run.explain()
    results = dict((name, result) for _s, name, _h, result, _e in run.results())

    def refused(name, *words):
        result = results[name]
        assert result.get('failed') is True, (name, result)
        message = str(result.get('msg', '')).lower()
        assert any(word in message for word in words), (name, result.get('msg'))

    def answered(name, warned):
        result = results[name]
        assert not result.get('failed'), (name, result.get('msg'))
        warnings = ' '.join(str(w) for w in result.get('warnings') or [])
        if warned:
            assert 'validate_certs' in warnings and 'not verified' in warnings, (name, result.get('warnings'))
        else:
            assert 'not verified' not in warnings, (name, result.get('warnings'))

    refused('PVE with the system trust store (no ca_path): refused', 'certificate verify failed')
    refused('PVE with a CA that did not sign its certificate: refused', 'certificate verify failed')
    answered('PVE with validate_certs false: answers, with a warning', warned=True)
    answered('PVE with the lab CA: answers', warned=False)
    refused('Talos with a talosconfig of another cluster: refused', 'certificate', 'tls', 'ssl')
    answered('Talos with its own talosconfig: answers', warned=False)
    refused('Kubernetes with a kubeconfig whose CA did not sign the API certificate: refused', 'certificate verify failed')
    answered('Kubernetes with validate_certs false: answers, with a warning', warned=True)
    answered('Kubernetes with its own kubeconfig: answers', warned=False)


def test_no_inventory_or_role_default_turns_verification_off():
    """Verification is off only where a user writes it: nothing shipped sets validate_certs false or skips TLS."""
    offenders = []
    pattern = re.compile(r'(validate_certs|verify_ssl|insecure-skip-tls-verify|insecure_skip_tls_verify)\s*:\s*(false|no|true)',
                         re.IGNORECASE)
    for folder in ('inventories', 'roles', 'playbooks'):
        for path in files_under(os.path.join(ROOT, folder)):
            if not path.endswith(('.yml', '.yaml')) or '/files/' in path:
                continue
            with open(path, encoding='utf-8') as handle:
                for number, line in enumerate(handle, 1):
                    match = pattern.search(line)
                    if match and (match.group(2).lower() in ('false', 'no')) != ('insecure' in match.group(1).lower()):
                        offenders.append('%s:%d: %s' % (os.path.relpath(path, ROOT), number, line.strip()))
    assert offenders == [], offenders
