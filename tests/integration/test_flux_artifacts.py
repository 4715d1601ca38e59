"""The flux role's upstream artifacts (roles/flux/vars/artifacts.yml): the role downloads the pinned files of the install
method, checks each against its sha256 before anything is applied (a mismatch fails naming the file, the expected and the
actual sha256, and writes nothing), from a local directory (air-gapped) or over HTTPS from the lab's artifact mirror
(lab/artifact_mirror.py, its "internet", trusted through the CA the lab makes); check mode predicts, a re-run changes
nothing. The mirror serves exactly the pinned bytes. No cluster is needed: tasks_from artifacts runs on the controller."""

import hashlib
import os
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request

import pytest
import yaml

from json_run import JsonRun as Run
from lab import artifacts
from lab.artifact_mirror import ArtifactMirror

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK_BIN = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')

pytestmark = pytest.mark.skipif(not os.access(PLAYBOOK_BIN, os.X_OK), reason='no ansible-playbook in .venv (make setup)')


@pytest.fixture(scope='module')
def cache():
    absent = artifacts.missing()
    assert not absent, ('the lab artifact cache %s lacks pinned files (make setup, or scripts/upstream_binaries.py '
                        '--artifacts): %s' % (artifacts.cache_dir(), [artifacts.url_path(e) for e in absent][:3]))
    return artifacts.cache_dir()


def run(tmp_path, *args, method='manifest'):
    book = tmp_path / 'artifacts.yml'
    if not book.exists():
        book.write_text(yaml.safe_dump([{'name': 'Pinned artifacts', 'hosts': 'localhost', 'gather_facts': False, 'tasks': [
            {'name': 'Artifacts', 'ansible.builtin.include_role': {'name': 'proxtalos.cluster.flux', 'tasks_from': 'artifacts'}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_STDOUT_CALLBACK='ansible.posix.json',
               ANSIBLE_LOCALHOST_WARNING='false', ANSIBLE_INVENTORY_UNPARSED_WARNING='false',
               ANSIBLE_LOCAL_TEMP=str(tmp_path / 'ansible-tmp'))
    command = [PLAYBOOK_BIN, str(book), '-i', 'localhost,', '-c', 'local',
               '-e', 'ansible_python_interpreter={{ ansible_playbook_python }}',
               '-e', 'flux_artifacts_dir=%s' % (tmp_path / 'artifacts'), '-e', 'flux_install_method=%s' % method]
    return Run(subprocess.run(command + list(args), capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False))


DEFAULT_COMPONENTS = ('source-controller', 'kustomize-controller', 'helm-controller', 'notification-controller')


def downloaded(tmp_path, method='manifest', components=DEFAULT_COMPONENTS):
    """{local path: sha256} the role should have kept for the method."""
    out = {}
    for entry in artifacts.pins()['flux_operator' if method == 'operator' else 'flux']['files']:
        if entry.get('component') and entry['component'] not in components:
            continue
        out[str(tmp_path / 'artifacts' / 'upstream' / entry['repo'] / entry['ref'] / entry['path'])] = entry['sha256']
    return out


def sha256(path):
    with open(path, 'rb') as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def test_from_a_local_directory_check_mode_predicts_and_a_rerun_changes_nothing(tmp_path, cache):
    local = ('-e', 'flux_artifacts_local_dir=%s' % cache)
    predicted = run(tmp_path, *local, '--check')
    assert predicted.rc == 0, predicted.explain()
    assert predicted.changed() == {'localhost': 1}, predicted.changed()  # the directories; nothing written
    assert not (tmp_path / 'artifacts').exists()
    first = run(tmp_path, *local)
    assert first.rc == 0, first.explain()
    want = downloaded(tmp_path)
    assert {path: sha256(path) for path in want} == want
    # only the pinned files: no image-automation, no source-watcher (not in flux_components)
    kept = sorted(os.path.join(d, f) for d, _s, files in os.walk(tmp_path / 'artifacts') for f in files)
    assert kept == sorted(want)
    for args in (local, local + ('--check',)):
        again = run(tmp_path, *args)
        assert again.rc == 0 and again.changed() == {'localhost': 0}, (args, again.changed(), again.explain())


def test_a_file_that_is_not_the_pinned_one_fails_naming_it_and_both_hashes_and_is_not_kept(tmp_path, cache):
    local = tmp_path / 'site-mirror'
    shutil.copytree(cache, local)
    entry = next(e for e in artifacts.pins()['flux']['files'] if e.get('component') == 'kustomize-controller')
    tampered = artifacts.cached_path(entry, local)
    os.chmod(tampered, 0o644)
    with open(tampered, 'ab') as handle:
        handle.write(b'# not upstream\n')
    result = run(tmp_path, '-e', 'flux_artifacts_local_dir=%s' % local)
    assert result.rc != 0
    messages = dict(result.failure_messages())
    named = messages.get('proxtalos.cluster.flux : The pinned upstream artifacts that could not be had (nothing applied)')
    assert named == ('artifact %s@%s %s (from file://%s): sha256 %s, but the pin says %s (roles/flux/vars/artifacts.yml); '
                     'nothing was applied' % (entry['repo'], entry['ref'], entry['path'], tampered, sha256(tampered),
                                              entry['sha256'])), result.explain()
    assert not os.path.exists(tmp_path / 'artifacts' / 'upstream' / entry['repo'] / entry['ref'] / entry['path'])


def test_the_lab_mirror_serves_exactly_the_pinned_bytes_over_https_with_its_ca(tmp_path, cache):
    del cache
    mirror = ArtifactMirror(str(tmp_path / 'run')).start()
    try:
        assert oct(os.stat(tmp_path / 'run' / 'artifact-mirror.key').st_mode & 0o777) == '0o600'
        context = ssl.create_default_context(cafile=mirror.ca_path)
        for entry in artifacts.files():
            with urllib.request.urlopen(mirror.url + artifacts.url_path(entry), context=context, timeout=10) as answer:
                assert hashlib.sha256(answer.read()).hexdigest() == entry['sha256'], entry['path']
        with pytest.raises(urllib.error.HTTPError) as unknown:
            urllib.request.urlopen(mirror.url + '/fluxcd/flux2/v2.9.5/go.mod', context=context, timeout=10)
        assert unknown.value.code == 404
        with pytest.raises(urllib.error.URLError):  # a client that does not trust the lab's CA
            urllib.request.urlopen(mirror.url + artifacts.url_path(artifacts.files()[0]),
                                   context=ssl.create_default_context(), timeout=10)
        # the role, operator method, from the mirror trusted through the lab's CA
        untrusted = run(tmp_path, '-e', 'flux_artifacts_base_url=%s' % mirror.url, method='operator')
        assert untrusted.rc != 0 and 'CERTIFICATE_VERIFY_FAILED' in str(untrusted.failure_messages()), untrusted.explain()
        assert not (tmp_path / 'artifacts' / 'upstream' / 'controlplaneio-fluxcd').exists() or not any(
            files for _d, _s, files in os.walk(tmp_path / 'artifacts' / 'upstream'))
        result = run(tmp_path, '-e', 'flux_artifacts_base_url=%s' % mirror.url, '-e', 'flux_artifacts_ca_path=%s' % mirror.ca_path,
                     method='operator')
        assert result.rc == 0, result.explain()
        want = downloaded(tmp_path, method='operator')
        assert {path: sha256(path) for path in want} == want
    finally:
        mirror.stop()
