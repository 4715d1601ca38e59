"""plugins/filter/host_arguments.py, and the role node_options through ansible-playbook.

A role imported run_once (site.yml: preflight, vms) has its own argument check once, in the first host's context; its
first task checks every host's own values of its options in one validate_argument_spec task, naming the host.
"""
import json
import os
import subprocess
import sys

import pytest
import yaml

from ansible.errors import AnsibleFilterError

from ansible_collections.proxtalos.cluster.plugins.filter.host_arguments import host_argument_spec, host_arguments

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
ANSIBLE_PLAYBOOK = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')

OPTIONS = {'vm_cores': {'type': 'int', 'description': 'cores'},
           'vm_id': {'type': 'int', 'required': True},
           'proxmox_vms_state': {'type': 'str', 'choices': ['started', 'stopped'], 'default': 'started'}}


def test_the_spec_has_one_dict_option_per_host_with_the_roles_options_but_default_and_description():
    spec = host_argument_spec(OPTIONS, ['cp-1', 'w-1'], {'vm_id': 1011})
    assert sorted(spec) == ['cp-1', 'w-1']
    assert spec['w-1']['type'] == 'dict'
    assert spec['w-1']['options'] == {'vm_cores': {'type': 'int'}, 'vm_id': {'type': 'int', 'required': True},
                                      'proxmox_vms_state': {'type': 'str', 'choices': ['started', 'stopped']}}
    assert OPTIONS['vm_id']['required'] is True and 'default' in OPTIONS['proxmox_vms_state']   # not changed


def test_an_option_the_first_host_gets_from_the_play_is_not_required_of_every_host():
    spec = host_argument_spec(OPTIONS, ['cp-1', 'w-1'], {'vm_cores': 2})
    assert spec['cp-1']['options']['vm_id'] == {'type': 'int'}


def test_the_arguments_are_each_hosts_own_values_every_host():
    hostvars = {'cp-1': {'vm_id': 1011, 'other': 1}, 'w-1': {'other': 2}, 'w-2': {'vm_cores': 'x', 'vm_id': 1022}}
    assert host_arguments(['cp-1', 'w-1', 'w-2'], hostvars, OPTIONS.keys()) == {
        'cp-1': {'vm_id': 1011}, 'w-1': {}, 'w-2': {'vm_cores': 'x', 'vm_id': 1022}}


@pytest.mark.parametrize('options', [None, ['vm_id'], {'vm_id': 'int'}])
def test_options_that_are_not_a_dict_of_dicts_are_an_error(options):
    with pytest.raises(AnsibleFilterError, match='host_argument_spec'):
        host_argument_spec(options, ['h'])


def run_check(tmp_path, hosts):
    """The role node_options over proxmox_vms' main entry point on local hosts; the JSON callback's document."""
    playbook = [{'name': 'Per-host check', 'hosts': 'cluster', 'gather_facts': False, 'tasks': [
        {'name': 'Check', 'ansible.builtin.import_role': {'name': 'proxtalos.cluster.node_options'},
         'vars': {'node_options_role': 'proxmox_vms', 'node_options_entry_point': 'main'}, 'run_once': True}]}]
    inventory = {'all': {'vars': {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable},
                         'children': {'cluster': {'hosts': dict(hosts)}}}}
    (tmp_path / 'inventory.yml').write_text(yaml.safe_dump(inventory, sort_keys=False))
    (tmp_path / 'play.yml').write_text(yaml.safe_dump(playbook, sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_LOCAL_TEMP=str(tmp_path / 'tmp'),
               ANSIBLE_STDOUT_CALLBACK='ansible.posix.json', PROXTALOS_REPORT_DIR=str(tmp_path / 'report'),
               ANSIBLE_LOCALHOST_WARNING='false')
    run = subprocess.run([ANSIBLE_PLAYBOOK, '-i', str(tmp_path / 'inventory.yml'), str(tmp_path / 'play.yml')],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    document = json.loads(run.stdout[run.stdout.index('{'):])
    return run.returncode, [result for task in document['plays'][0]['tasks'] for result in task['hosts'].items()]


def run_playbook(tmp_path, inventory, playbook):
    """Run the playbook on the inventory with the repository's ansible.cfg; the JSON it wrote to out.json."""
    (tmp_path / 'inventory.yml').write_text(yaml.safe_dump(inventory, sort_keys=False))
    (tmp_path / 'play.yml').write_text(yaml.safe_dump(playbook, sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_LOCAL_TEMP=str(tmp_path / 'tmp'),
               PROXTALOS_REPORT_DIR=str(tmp_path / 'report'), ANSIBLE_LOCALHOST_WARNING='false')
    run = subprocess.run([ANSIBLE_PLAYBOOK, '-i', str(tmp_path / 'inventory.yml'), str(tmp_path / 'play.yml')],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:]
    return json.loads((tmp_path / 'out.json').read_text())


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_a_wrong_value_of_another_host_fails_naming_that_host_and_the_option(tmp_path):
    good = {'vm_id': 1011, 'vm_pve_node': 'pve1', 'vm_cores': 4}
    code, results = run_check(tmp_path, [('cp-1', good), ('w-1', dict(good, vm_id=1021)),
                                         ('w-2', dict(good, vm_id=1022, vm_cores='many', proxmox_vms_state='sleeping'))])
    assert code != 0
    # the role's own argument check, the check of every host's values and the task that says what is wrong: each run
    # once, on the first host
    assert [host for host, _result in results] == ['cp-1', 'cp-1', 'cp-1']
    message = results[-1][1]['msg']
    assert message.startswith("proxmox_vms (main) - a host's own values are wrong or missing: "), message
    assert "found in 'w-2'" in message and 'vm_cores' in message and 'proxmox_vms_state' in message, message
    assert "'cp-1'" not in message and "'w-1'" not in message


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_a_host_without_a_required_value_of_its_own_fails_naming_that_host(tmp_path):
    good = {'vm_id': 1011, 'vm_pve_node': 'pve1'}
    code, results = run_check(tmp_path, [('cp-1', good), ('w-1', dict(good, vm_id=1021)), ('w-3', {'vm_pve_node': 'pve1'})])
    assert code != 0
    message = results[-1][1]['msg']
    assert 'missing required arguments: vm_id found in w-3' in message, message
    assert "'w-1'" not in message


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_good_values_pass(tmp_path):
    good = {'vm_id': 1011, 'vm_pve_node': 'pve1'}
    code, results = run_check(tmp_path, [('cp-1', good), ('w-1', dict(good, vm_id=1021, proxmox_vms_state='stopped'))])
    assert code == 0 and not any(result.get('failed') for _host, result in results), results


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_templated_values_are_what_hostvars_gives_each_host(tmp_path):
    # The filter templates every host's values through one engine that compiles each template once: each host's
    # value is still its own (the same template text, other variables), as hostvars[host] gives it.
    inventory = {'all': {'vars': {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable,
                                  'size': '{{ base | int * 2 }}', 'name_of': '{{ inventory_hostname }}-{{ zone }}'},
                         'children': {'cluster': {'vars': {'zone': 'a'}, 'hosts': {
                             'h1': {'base': 1}, 'h2': {'base': 5, 'zone': 'b'}, 'h3': {'base': 7}}}}}}
    playbook = [{'name': 'Read', 'hosts': 'cluster', 'gather_facts': False, 'tasks': [
        {'name': 'Both ways', 'run_once': True, 'ansible.builtin.copy': {'dest': str(tmp_path / 'out.json'), 'mode': '0600', 'content': (
            "{{ {'filter': ansible_play_hosts | proxtalos.cluster.host_arguments(hostvars, ['size', 'name_of', 'absent']),"
            " 'hostvars': dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'size')"
            " | zip(ansible_play_hosts | map('extract', hostvars, 'name_of'))))} | to_json }}")}}]}]
    found = run_playbook(tmp_path, inventory, playbook)
    assert found['filter'] == {'h1': {'size': 2, 'name_of': 'h1-a'}, 'h2': {'size': 10, 'name_of': 'h2-b'},
                               'h3': {'size': 14, 'name_of': 'h3-a'}}
    assert found['hostvars'] == dict((host, [values['size'], values['name_of']]) for host, values in found['filter'].items())


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
def test_dict_and_list_values_with_templates_are_each_hosts_own(tmp_path):
    # A filter runs inside a template: a dict or list value comes back as a lazy container, rendered after the filter
    # returns - with the variables of the engine it is bound to, which must be that host's own.
    inventory = {'all': {'vars': {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable,
                                  'opts': {'name': '{{ inventory_hostname }}', 'size': '{{ base | int * 2 }}'},
                                  'listy': ['{{ inventory_hostname }}', '{{ base }}'], 'alias': '{{ opts }}'},
                         'children': {'cluster': {'hosts': {'h1': {'base': 1}, 'h2': {'base': 5}, 'h3': {'base': 7}}}}}}
    playbook = [{'name': 'Read', 'hosts': 'cluster', 'gather_facts': False, 'tasks': [
        {'name': 'Filter', 'run_once': True, 'ansible.builtin.copy': {'dest': str(tmp_path / 'out.json'), 'mode': '0600', 'content': (
            "{{ ansible_play_hosts | proxtalos.cluster.host_arguments(hostvars, ['opts', 'listy', 'alias']) | to_json }}")}}]}]
    found = run_playbook(tmp_path, inventory, playbook)
    assert found == dict((host, {'opts': {'name': host, 'size': base * 2}, 'listy': [host, base],
                                 'alias': {'name': host, 'size': base * 2}})
                         for host, base in (('h1', 1), ('h2', 5), ('h3', 7)))
