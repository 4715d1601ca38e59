"""Run site.yml (or any playbook) with ansible-playbook against a lab, and read what happened.

Results come from the ansible.posix.json callback: the PLAY RECAP counts per host (`stats`) and every
task result per host, so tests can assert on changed/failed counts, diffs and failure messages.
"""
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK_BIN = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
SITE = os.path.join(ROOT, 'site.yml')


class Run(object):
    """One ansible-playbook run: rc, the JSON document, stderr."""

    def __init__(self, rc, document, stderr, command):
        self.rc = rc
        self.document = document
        self.stderr = stderr
        self.command = command

    @property
    def stats(self):
        """PLAY RECAP: host -> {ok, changed, failures, unreachable, skipped, ...}."""
        return self.document.get('stats', {})

    def total(self, key):
        return sum(host.get(key, 0) for host in self.stats.values())

    @property
    def changed(self):
        return self.total('changed')

    @property
    def failed(self):
        return self.total('failures') + self.total('unreachable')

    def results(self, task_name=None):
        """(task name, host, result) for every task result, or those of tasks whose name contains task_name."""
        out = []
        for play in self.document.get('plays', []):
            for task in play.get('tasks', []):
                name = task['task']['name']
                if task_name is not None and task_name not in name:
                    continue
                for host, result in task.get('hosts', {}).items():
                    out.append((name, host, result))
        return out

    def failures(self):
        """host -> failure message of its failed task; for a loop, the messages of the failed items."""
        out = {}
        for _name, host, result in self.results():
            if not result.get('failed'):
                continue
            # Failed loop items carry their own msg (the JSON callback drops their `failed` flag).
            items = [item.get('msg') for item in result.get('results') or [] if item.get('msg')]
            out[host] = '\n'.join(str(m) for m in items) if items else result.get('msg')
        return out

    def describe(self):
        """Enough to see why an assertion failed."""
        unparsed = self.document.get('unparsed_stdout', '')
        return 'rc=%s stats=%s failures=%s stderr=%s%s' % (
            self.rc, json.dumps(self.stats), json.dumps(self.failures()), self.stderr[-2000:],
            ' stdout=' + unparsed[-2000:] if unparsed else '')


def run_playbook(inventory, *args, playbook=SITE, extra_vars=None, timeout=600):
    """ansible-playbook PLAYBOOK -i INVENTORY ARGS, with the repository's ansible.cfg and the JSON callback."""
    command = [PLAYBOOK_BIN, playbook, '-i', str(inventory)] + list(args)
    if extra_vars:
        command += ['-e', json.dumps(extra_vars)]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'),
               ANSIBLE_STDOUT_CALLBACK='ansible.posix.json', ANSIBLE_NOCOLOR='1', ANSIBLE_FORCE_COLOR='0')
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    try:
        # The JSON document comes first; callbacks that print after it (the run report) are left out.
        document = json.JSONDecoder().raw_decode(done.stdout.lstrip())[0] if done.stdout.strip() else {}
    except ValueError:
        document = {'unparsed_stdout': done.stdout}
    return Run(done.returncode, document, done.stderr, command)
