"""proxtalos.cluster.host_values through ansible-playbook on local hosts: each host's value is what that host's own
set_fact of the variable gives (role defaults, group and host vars, facts, play and extra vars), in one run_once task."""
import json
import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
# PROXTALOS_ANSIBLE_PLAYBOOK (as tests/integration/test_oldest_core.py) runs the plays on another ansible-core.
ANSIBLE_PLAYBOOK = os.environ.get('PROXTALOS_ANSIBLE_PLAYBOOK') or os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')

# The value read for every host: a role default that templates inventory variables, a group var, a fact set on one
# host, a play var, magic variables.
ROLE_DEFAULTS = {
    'demo_size': "{{ size | default(1) }}",
    'demo_value': {'host': '{{ inventory_hostname }}', 'size': '{{ demo_size | int * 2 }}',
                   'zone': "{{ zone | default('none') }}", 'note': "{{ note | default('') }}",
                   'play': '{{ play_word }}', 'first': '{{ ansible_play_batch | first }}',
                   'hosts': "{{ ansible_play_hosts | join(',') }}/{{ ansible_play_hosts_all | join(',') }}",
                   'group': "{{ 'cp' if inventory_hostname in groups['cp'] else 'other' }}"},
    'demo_bad': {'patches': '{{ patches }}'},
    'demo_scoped': {'role': '{{ demo_role_var }}', 'task': '{{ demo_task_var }}', 'host': '{{ inventory_hostname }}',
                    'short': '{{ inventory_hostname_short }}', 'groups': '{{ group_names }}'},
}
ROLE_VARS = {'demo_role_var': 'from role vars'}

PLAYBOOK = """---
- name: A fact on one host first
  hosts: h3
  gather_facts: false
  tasks:
    - name: Note
      ansible.builtin.set_fact:
        note: from a fact
- name: Each host's value from its own set_fact, then every host's in one task
  hosts: all
  gather_facts: false
  vars:
    play_word: played
  tasks:
    - name: Each host's own
      ansible.builtin.include_role:
        name: demo
        tasks_from: own
    - name: Every host's in one task
      ansible.builtin.include_role:
        name: demo
        tasks_from: all
      run_once: true
"""

OWN_TASKS = """---
- name: Own value
  ansible.builtin.set_fact:
    demo_own: "{{ lookup('ansible.builtin.vars', demo_own_var | default('demo_value')) }}"
  vars:
    demo_task_var: from the task
"""

ALL_TASKS = """---
- name: Every host's value
  proxtalos.cluster.host_values:
    hosts: "{{ demo_hosts | default(ansible_play_batch) }}"
    var: "{{ demo_var | default('demo_value') }}"
  register: demo_all
  no_log: "{{ demo_no_log | default(false) }}"
  vars:
    demo_task_var: from the task
- name: Write both
  ansible.builtin.copy:
    content: "{{ {'all': demo_all.by_host, 'own': dict(ansible_play_batch | zip(ansible_play_batch | map('extract', hostvars, 'demo_own')))} | to_json }}"
    dest: "{{ out }}"
    mode: "0600"
"""


def setup(tmp_path, broken=False):
    inventory = {'all': {
        'vars': {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable, 'patches': []},
        'children': {
            'cp': {'vars': {'zone': 'a'}, 'hosts': {'h1': {}, 'h2': {'size': 5, 'ansible_host': 'h9.example'}}},
            'other': {'hosts': {'h3': {'zone': 'b'}, 'h4': {}}}}}}
    if broken:   # h3's own value cannot be templated
        inventory['all']['children']['other']['hosts']['h3']['patches'] = '{{ registry_auth }}'
    (tmp_path / 'hosts.yml').write_text(yaml.safe_dump(inventory))
    (tmp_path / 'play.yml').write_text(PLAYBOOK)
    role = tmp_path / 'roles' / 'demo'
    (role / 'defaults').mkdir(parents=True)
    (role / 'vars').mkdir()
    (role / 'tasks').mkdir()
    (role / 'defaults' / 'main.yml').write_text(yaml.safe_dump(ROLE_DEFAULTS))
    (role / 'vars' / 'main.yml').write_text(yaml.safe_dump(ROLE_VARS))
    (role / 'tasks' / 'own.yml').write_text(OWN_TASKS)
    (role / 'tasks' / 'all.yml').write_text(ALL_TASKS)


def run(tmp_path, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_LOCAL_TEMP=str(tmp_path / 'tmp'),
               PROXTALOS_REPORT_DIR=str(tmp_path / 'report'), ANSIBLE_ROLES_PATH=str(tmp_path / 'roles'))
    return subprocess.run([ANSIBLE_PLAYBOOK, '-i', str(tmp_path / 'hosts.yml'), str(tmp_path / 'play.yml'),
                           '-e', 'out=%s' % (tmp_path / 'out.json')] + list(extra),
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_every_hosts_value_is_its_own_set_fact_value(tmp_path):
    setup(tmp_path)
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    found = json.loads((tmp_path / 'out.json').read_text())
    assert found['all'] == found['own']
    assert list(found['all']) == ['h1', 'h2', 'h3', 'h4']
    assert found['all']['h2'] == {'host': 'h2', 'size': 10, 'zone': 'a', 'note': '', 'play': 'played', 'first': 'h1',
                                  'hosts': 'h1,h2,h3,h4/h1,h2,h3,h4', 'group': 'cp'}
    assert found['all']['h3']['zone'] == 'b' and found['all']['h3']['note'] == 'from a fact'
    assert found['all']['h4']['size'] == 2 and found['all']['h4']['group'] == 'other'

    # Extra vars win for every host, as in each host's own task.
    done = run(tmp_path, '-e', 'zone=x')
    assert done.returncode == 0, done.stdout[-4000:]
    found = json.loads((tmp_path / 'out.json').read_text())
    assert found['all'] == found['own'] and set(v['zone'] for v in found['all'].values()) == {'x'}


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_a_host_without_the_variable_fails_naming_it(tmp_path):
    setup(tmp_path)
    done = run(tmp_path, '-e', 'demo_var=no_such_variable')
    assert done.returncode != 0
    assert 'host_values: h1 has no variable no_such_variable' in done.stdout


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
@pytest.mark.parametrize('no_log', [False, True])
def test_a_value_that_cannot_be_templated_fails_naming_its_host(tmp_path, no_log):
    setup(tmp_path, broken=True)
    done = run(tmp_path, '-e', 'demo_no_log=%s' % no_log, '-e', 'demo_var=demo_bad')
    assert done.returncode != 0
    errors = [line for line in (done.stdout + done.stderr).splitlines() if 'ERROR' in line]
    assert any('host_values: h3: ' in line and 'registry_auth' in line for line in errors), errors


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_role_vars_task_vars_and_magic_variables_are_each_hosts_own(tmp_path):
    setup(tmp_path)
    done = run(tmp_path, '-e', 'demo_var=demo_scoped', '-e', 'demo_own_var=demo_scoped')
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    found = json.loads((tmp_path / 'out.json').read_text())
    assert found['all'] == found['own']
    assert found['all']['h4'] == {'role': 'from role vars', 'task': 'from the task', 'host': 'h4', 'short': 'h4',
                                  'groups': ['other']}


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
@pytest.mark.parametrize('name', ['h7', 'h9.example'])
def test_a_name_the_inventory_lacks_fails_naming_it(tmp_path, name):
    # h9.example is h2's ansible_host: delegation would take it for h2; host_values takes inventory names only
    setup(tmp_path)
    done = run(tmp_path, '-e', '{"demo_hosts": ["h1", "%s"]}' % name)
    assert done.returncode != 0
    assert 'host_values: %s is not a host of the inventory' % name in done.stdout
