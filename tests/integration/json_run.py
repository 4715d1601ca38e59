"""One ansible-playbook run read through the ansible.posix.json stdout callback (shared by the lab suites that run
site.yml to its end: gitops_lab, k8s_stages_lab)."""

import json


class JsonRun(object):
    """rc, stdout, stderr and the callback's JSON document (plays, tasks, per-host results, stats) of a finished run
    (a subprocess.CompletedProcess with text output)."""

    def __init__(self, completed):
        self.rc = completed.returncode
        self.stdout = completed.stdout
        self.stderr = completed.stderr
        try:  # the JSON document first; notification callbacks (the run report) print after it
            start = completed.stdout.index('{')
            self.data = json.JSONDecoder().raw_decode(completed.stdout[start:])[0]
        except ValueError:
            raise AssertionError('ansible-playbook did not print JSON (rc %d):\n%s\n%s'
                                 % (completed.returncode, completed.stdout[-4000:], completed.stderr[-3000:])) from None

    @property
    def stats(self):
        return self.data.get('stats') or {}

    def changed(self):
        """{host: changed count}."""
        return dict((host, values.get('changed', 0)) for host, values in self.stats.items())

    def results(self, task_part):
        """[(host, result)] of every task whose name contains task_part, in run order."""
        found = []
        for play in self.data.get('plays') or []:
            for task in play.get('tasks') or []:
                if task_part in task['task']['name']:
                    found.extend(task['hosts'].items())
        return found

    def result_values(self, task_part):
        """The host results alone of the tasks whose name contains task_part, in run order."""
        return [result for _host, result in self.results(task_part)]

    def failures(self):
        """[(task name, host, msg)] of every failed (not ignored) host result."""
        out = []
        for play in self.data.get('plays') or []:
            for task in play.get('tasks') or []:
                for host, result in task['hosts'].items():
                    if result.get('failed') and not result.get('_ansible_ignore_errors'):
                        out.append((task['task']['name'], host, result.get('msg', '')))
        return out

    def failure_messages(self):
        """[(task name, msg)] of every failed (not ignored) host result."""
        return [(task, message) for task, _host, message in self.failures()]

    def explain(self):
        return 'rc %d; failures: %s; stderr: %s' % (self.rc, self.failures(), self.stderr[-2000:])
