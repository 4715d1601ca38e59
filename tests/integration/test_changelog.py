"""Changelog fragments lint, and scripts/render-changelog renders every fragment's entry into CHANGELOG.md."""
import os
import re
import subprocess

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANTSIBULL = os.path.join(ROOT, '.venv', 'bin', 'antsibull-changelog')
FRAGMENTS = os.path.join(ROOT, 'changelogs', 'fragments')

pytestmark = pytest.mark.skipif(not os.access(ANTSIBULL, os.X_OK), reason='antsibull-changelog is not installed (make setup)')


def test_fragments_lint():
    process = subprocess.run([ANTSIBULL, 'lint'], cwd=ROOT, check=False, capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stdout + process.stderr
    assert process.stdout.strip() == '', process.stdout


def test_rendered_changelog_has_every_fragment(tmp_path):
    output = tmp_path / 'CHANGELOG.md'
    process = subprocess.run([os.path.join(ROOT, 'scripts', 'render-changelog'), str(output)], cwd=ROOT,
                             check=False, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stdout + process.stderr
    text = output.read_text().replace('\\', '')
    assert text.startswith('# proxtalos.cluster Release Notes')
    for name in sorted(os.listdir(FRAGMENTS)):
        if not name.endswith(('.yml', '.yaml')):
            continue
        with open(os.path.join(FRAGMENTS, name)) as stream:
            fragment = yaml.safe_load(stream)
        for section, entries in fragment.items():
            if section == 'trivial':
                continue   # internal changes are not rendered
            for entry in entries:
                words = ' '.join(entry.split())[:60]
                assert re.sub(r'`+', '', words) in re.sub(r'<code>|</code>|`+', '', ' '.join(text.split())), (name, words)
    assert 'proxtalos.cluster.timeline' in text and 'proxtalos.cluster.multicluster_check' in text


def test_the_committed_changelog_is_rendered_from_the_committed_fragments(tmp_path):
    """CHANGELOG.md is not edited by hand: it is what scripts/render-changelog makes of the committed fragments."""
    output = tmp_path / 'CHANGELOG.md'
    process = subprocess.run([os.path.join(ROOT, 'scripts', 'render-changelog'), '--committed', str(output)], cwd=ROOT,
                             check=False, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stdout + process.stderr
    with open(os.path.join(ROOT, 'CHANGELOG.md'), encoding='utf-8') as stream:
        committed = stream.read()
    assert committed == output.read_text(encoding='utf-8'), 'CHANGELOG.md is stale: run scripts/render-changelog and commit it'
