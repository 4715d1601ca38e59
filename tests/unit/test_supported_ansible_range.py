"""One supported ansible-core range: meta/runtime.yml's requires_ansible, requirements.txt and the README agree."""
import os
import re

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(*path):
    with open(os.path.join(ROOT, *path), encoding='utf-8') as handle:
        return handle.read()


def test_runtime_requirements_and_readme_state_the_same_range():
    required = yaml.safe_load(_read('meta', 'runtime.yml'))['requires_ansible']
    pinned = re.search(r'^ansible-core(\S+)\s*$', _read('requirements.txt'), re.M).group(1)
    assert sorted(required.split(',')) == sorted(pinned.split(',')), (required, pinned)
    low = re.search(r'>=(\d+)\.(\d+)\.0', required).groups()
    high = re.search(r'<(\d+)\.(\d+)\.0', required).groups()
    stated = 'ansible-core %s.%s to %s.%d' % (low[0], low[1], high[0], int(high[1]) - 1)
    assert stated in ' '.join(_read('README.md').split()), stated
