"""Write ansible-test's get-pip bootstrap script as an offline stand-in.

ansible-test downloads get-pip-<version>.py from ci-files.testing.ansible.com before it builds
the sanity venvs. Where that host cannot be reached, it uses a cached copy if one exists. This
writes one that bootstraps pip with ensurepip and then installs what ansible-test asks for from
the package index the machine is configured with.
"""
import os
import pathlib
import re
import sys

STUB = '''\
# Offline stand-in for get-pip.py, written by proxtalos.cluster's scripts/ansible_test_pip_stub.py.
import ensurepip
import os
import subprocess
import sys

# ensurepip points PIP_CONFIG_FILE at /dev/null in os.environ; keep the caller's environment so
# pip still finds the machine's index and certificate settings.
env = dict(os.environ)
ensurepip.bootstrap(upgrade=True)
args = [a for a in sys.argv[1:] if a not in ('--no-setuptools', '--no-wheel')]
sys.exit(subprocess.call([sys.executable, '-m', 'pip', 'install', '--upgrade'] + args, env=env))
'''


def wanted_pip_versions():
    import ansible_test
    source = pathlib.Path(ansible_test.__file__).parent / '_internal' / 'python_requirements.py'
    return sorted(set(re.findall(r"pip='([0-9.]+)'", source.read_text())))


def main():
    cache = pathlib.Path(os.path.expanduser('~/.ansible/test/cache'))
    cache.mkdir(parents=True, exist_ok=True)
    versions = wanted_pip_versions()
    if not versions:
        sys.exit('could not find the pip version ansible-test bootstraps')
    for version in versions:
        path = cache / ('get_pip_%s.py' % version.replace('.', '_'))
        if not path.exists() or path.read_text() != STUB:
            path.write_text(STUB)
        print(path)


if __name__ == '__main__':
    main()
