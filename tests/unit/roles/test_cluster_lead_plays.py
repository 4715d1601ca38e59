"""The cluster-level stages run their plays on one host (playbooks/site.yml, group proxtalos_cluster_lead).

1. Every play on `cluster:&proxtalos_cluster_lead` does only cluster-level work: each task its roles reach is
   run_once (its own, or from the block, import or include `apply` around it) or is itself an include/import (a
   per-host no-op), and none reads the play's host list or a host's own identity (another host's variables, as
   hostvars[host]['node_ip'], are cluster-level reads). A per-node task added to one of
   these roles would otherwise run on the lead alone, silently, and fails here instead.
2. The lead is the first of proxtalos_nodes in inventory order: site.yml's own group_by and add_host tasks, run by
   ansible-playbook on local hosts (no lab), then a play on the lead's pattern; with --limit, the first node of the
   limited set; a node without an address is never the lead; no node with an address leaves the play without hosts.
"""
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ANSIBLE_PLAYBOOK = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
SITE = os.path.join(ROOT, 'playbooks', 'site.yml')
LEAD_HOSTS = 'cluster:&proxtalos_cluster_lead'
NODES_HOSTS = 'cluster:&proxtalos_nodes'
# The cni stage's repair play: only the workers its kubelet check found stuck (none: the play has no host).
STUCK_HOSTS = "{{ groups['proxtalos_cni_kubelet_stuck'] | default([]) }}"
COLLECTION_PREFIX = 'proxtalos.cluster.'

# What a cluster-level task must not read: the play's host list or a host's own identity (the per-node work).
PER_HOST_WORDS = re.compile(r'\b(ansible_play_hosts(_all)?|play_hosts|ansible_play_batch|inventory_hostname(_short)?|node_ip)\b')
INCLUDES = ('include_tasks', 'import_tasks', 'include_role', 'import_role')
BLOCK_KEYS = ('block', 'rescue', 'always')


def load(path):
    with open(path, encoding='utf-8') as handle:
        return yaml.safe_load(handle)


def plays():
    return load(SITE)


def action_of(task):
    """(short action name, its arguments) of a task: the key that is neither a keyword nor a block."""
    keywords = {'name', 'when', 'vars', 'loop', 'loop_control', 'register', 'run_once', 'delegate_to', 'tags', 'args',
                'no_log', 'changed_when', 'failed_when', 'check_mode', 'environment', 'become', 'ignore_errors',
                'any_errors_fatal', 'notify', 'until', 'retries', 'delay', 'delegate_facts', 'listen'}
    for key, value in task.items():
        if key not in keywords and key not in BLOCK_KEYS:
            return key.split('.')[-1], value
    return None, None


def role_tasks_file(role, entry):
    return os.path.join(ROOT, 'roles', role, 'tasks', '%s.yml' % (entry or 'main'))


def walk(path, role, run_once, found):
    """Every task reached from a task file as (file, name, action, inherited run_once, task)."""
    walk_list(load(path) or [], path, role, run_once, found)


def walk_list(tasks, path, role, run_once, found):
    """walk() over a list of tasks of the file `path` (the file itself, or a block in it)."""
    for task in tasks:
        own = bool(task.get('run_once')) or run_once
        if any(key in task for key in BLOCK_KEYS):
            for key in BLOCK_KEYS:
                walk_list(task.get(key) or [], path, role, own, found)
            continue
        action, args = action_of(task)
        found.append((path, task.get('name'), action, own, task))
        if action in ('include_tasks', 'import_tasks'):
            target = args if isinstance(args, str) else args.get('file')
            applied = bool(((task.get('args') or {}).get('apply') or {}).get('run_once'))
            walk(os.path.join(os.path.dirname(path), target), role, own or applied, found)
        elif action in ('include_role', 'import_role'):
            other = args['name'].replace(COLLECTION_PREFIX, '')
            applied = bool((args.get('apply') or {}).get('run_once'))
            walk(role_tasks_file(other, args.get('tasks_from')), other, own or applied, found)


def play_entry_points(play):
    """(role, entry point) of a play: its roles, or the import_role tasks of its tasks."""
    entries = [(role['role'].replace(COLLECTION_PREFIX, ''), None) for role in play.get('roles') or []]
    for task in play.get('tasks') or []:
        action, args = action_of(task)
        assert action in INCLUDES, 'play %r: task %r is not a role import' % (play['name'], task.get('name'))
        entries.append((args['name'].replace(COLLECTION_PREFIX, ''), args.get('tasks_from')))
    return entries


def lead_plays():
    return [play for play in plays() if play['hosts'] == LEAD_HOSTS]


def test_the_cluster_level_stages_run_on_the_lead_and_the_per_node_stages_on_every_node():
    by_stage = {}   # stage tag (a play's first) -> the hosts lines of its plays (Flux's components and prepare: flux_install)
    for play in plays():
        if play.get('tags') != ['always']:
            by_stage.setdefault(play['tags'][0], set()).add(play['hosts'])
    # bootstrap: etcd and the services gate (each node's services read from hostvars) once, on the lead; apply: one
    # apply over every node, each node's address and config read from hostvars
    for stage in ('bootstrap', 'kubeconfig', 'flux_install', 'apps', 'sealed_secrets', 'flux', 'gitops'):
        assert by_stage[stage] == {LEAD_HOSTS}, stage
    # apply: that one apply on the lead, or (rolling mode: group proxtalos_rolling_apply, empty otherwise, so that those
    # plays match no host) the control planes one at a time, then the workers in batches
    rolling = 'cluster:&proxtalos_rolling_apply'
    assert by_stage['apply'] == {LEAD_HOSTS, rolling + ':&controlplane', rolling + ':&worker'}
    # vms: the VMs and their address gate on every node (the role imported run_once), then the Talos API gate over
    # every node, once, on the lead
    assert by_stage['vms'] == {'cluster', LEAD_HOSTS}
    # per node: inputs collected per host in their own context (secrets)
    assert by_stage['secrets'] == {NODES_HOSTS}
    # cni: Cilium, the kubelet check and the gates once on the lead; the repair on each stuck worker itself
    assert by_stage['cni'] == {LEAD_HOSTS, STUCK_HOSTS}
    # report: every node read once on the lead; then only the nodes that did not answer, each failed by its own name
    assert by_stage['report'] == {LEAD_HOSTS, "{{ groups['proxtalos_report_failed'] | default([]) }}"}


@pytest.mark.parametrize('play', lead_plays(), ids=lambda play: play['name'].split(' - ')[0])
def test_every_task_of_a_lead_play_is_cluster_level(play):
    found = []
    for role, entry in play_entry_points(play):
        walk(role_tasks_file(role, entry), role, False, found)
    assert found, play['name']
    for path, name, action, run_once, task in found:
        where = '%s: %r' % (os.path.relpath(path, ROOT), name)
        assert run_once or action in INCLUDES, '%s runs on every host of the play (not run_once)' % where
        words = PER_HOST_WORDS.findall(' '.join(template_code(task)))
        assert not words, '%s reads %s: per-node work does not belong in a play on one host' % (where, [w[0] for w in words])


# A quoted word inside a template is a literal, not a read: a key of another host's variables (hostvars[host]['node_ip'],
# what a cluster-level task may read of every node) or text of a message.
TEMPLATE_LITERAL = re.compile(r"'[^']*'|\"[^\"]*\"")
TEMPLATE_COMMENT = re.compile(r'\{#.*?#\}', re.S)


def template_code(value, key=None):
    """The strings of a task that Ansible reads as code or templates, without their quoted literals and comments; a task's
    name is prose (a name that mentions node_ip reads nothing)."""
    if key == 'name' and isinstance(value, str):
        return []
    if isinstance(value, str):
        return [TEMPLATE_LITERAL.sub("''", TEMPLATE_COMMENT.sub('', value))]
    if isinstance(value, dict):
        return [code for item_key, item in value.items() for code in [str(item_key)] + template_code(item, item_key)]
    if isinstance(value, list):
        return [code for item in value for code in template_code(item)]
    return []


def test_a_read_of_the_hosts_own_identity_is_found_and_another_hosts_variable_is_not():
    own = {'name': 'per node (node_ip)', 'ansible.builtin.debug': {'msg': '{{ node_ip }}'}, 'run_once': True}
    play_hosts = {'name': 'hosts', 'ansible.builtin.debug': {'msg': '{{ ansible_play_hosts | length }}'}, 'run_once': True}
    others = {'name': 'every node (node_ip)', 'run_once': True,
              'ansible.builtin.debug': {'msg': "{{ groups['worker'] | map('extract', hostvars, 'node_ip') | list }}"},
              'vars': {'each': "{% for host in groups['worker'] %}{#- the worker's node_ip -#}"
                               "{{ hostvars[host]['node_ip'] ~ ': node_ip' }}{% endfor %}"}}
    assert PER_HOST_WORDS.findall(' '.join(template_code(own))) == [('node_ip', '', '')]
    assert [words[0] for words in PER_HOST_WORDS.findall(' '.join(template_code(play_hosts)))] == ['ansible_play_hosts']
    assert PER_HOST_WORDS.findall(' '.join(template_code(others))) == []


def test_the_walk_sees_a_task_without_run_once(tmp_path):
    """The walk itself: run_once comes from the task, its block or an include's apply; a plain task is reported."""
    tasks = [{'name': 'cluster', 'ansible.builtin.debug': {'msg': 'x'}, 'run_once': True},
             {'name': 'group', 'run_once': True, 'block': [{'name': 'in block', 'ansible.builtin.debug': {}}]},
             {'name': 'apply', 'ansible.builtin.include_tasks': 'inner.yml', 'args': {'apply': {'run_once': True}}},
             {'name': 'plain include', 'ansible.builtin.include_tasks': {'file': 'plain.yml'}}]
    (tmp_path / 'main.yml').write_text(yaml.safe_dump(tasks))
    (tmp_path / 'inner.yml').write_text(yaml.safe_dump([{'name': 'applied', 'ansible.builtin.debug': {}}]))
    (tmp_path / 'plain.yml').write_text(yaml.safe_dump([{'name': 'per host', 'ansible.builtin.debug': {}}]))
    found = []
    walk(str(tmp_path / 'main.yml'), 'x', False, found)
    once = dict((name, run_once) for _path, name, _action, run_once, _task in found)
    assert once == {'cluster': True, 'in block': True, 'apply': False, 'applied': True,
                    'plain include': False, 'per host': False}


def site_task(play_name, task_name):
    play = [p for p in plays() if p['name'].startswith(play_name)][0]
    return [t for t in play['tasks'] if t['name'].startswith(task_name)][0]


def run_lead_selection(tmp_path, hosts, limit=None):
    """site.yml's group_by and add_host on local hosts (each {name: host vars}, in inventory order), then a play on
    the lead's pattern; returns the hosts that play ran on."""
    grouping = site_task('Node addresses', 'Nodes the stages after vms run on')
    lead = site_task('Node addresses', 'The node the cluster-level stages run on')
    playbook = [
        {'name': 'Node addresses', 'hosts': 'cluster', 'gather_facts': False, 'tasks': [grouping, lead]},
        {'name': 'A cluster-level stage', 'hosts': LEAD_HOSTS, 'gather_facts': False,
         'tasks': [{'name': 'Cluster-level work', 'ansible.builtin.debug': {'msg': '{{ inventory_hostname }}'}}]}]
    inventory = {'all': {'vars': {'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable},
                         'children': {'cluster': {'children': {
                             'controlplane': {'hosts': dict((name, values) for name, values in hosts if name.startswith('cp'))},
                             'worker': {'hosts': dict((name, values) for name, values in hosts if name.startswith('w'))}}}}}}
    (tmp_path / 'inventory.yml').write_text(yaml.safe_dump(inventory, sort_keys=False))
    (tmp_path / 'play.yml').write_text(yaml.safe_dump(playbook, sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_LOCAL_TEMP=str(tmp_path / 'tmp'),
               ANSIBLE_STDOUT_CALLBACK='ansible.posix.json', PROXTALOS_REPORT_DIR=str(tmp_path / 'report'),
               ANSIBLE_LOCALHOST_WARNING='false')
    command = [ANSIBLE_PLAYBOOK, '-i', str(tmp_path / 'inventory.yml'), str(tmp_path / 'play.yml')]
    if limit:
        command += ['--limit', limit]
    run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    document = json.loads(run.stdout[run.stdout.index('{'):])
    stage = [play for play in document['plays'] if play['play']['name'] == 'A cluster-level stage'][0]
    return sorted(set(host for task in stage['tasks'] for host in task['hosts']))


ADDRESSED = [('cp-1', {'node_ip': '10.5.0.11'}), ('cp-2', {'node_ip': '10.5.0.12'}),
             ('w-1', {'node_ip': '10.5.0.21'}), ('w-2', {'node_ip': '10.5.0.22'})]


@pytest.mark.skipif(not os.path.exists(ANSIBLE_PLAYBOOK), reason='no ansible-playbook in .venv')
@pytest.mark.parametrize('hosts, limit, lead', [
    (ADDRESSED, None, ['cp-1']),                                          # the first node in inventory order
    (ADDRESSED, 'w-2,w-1', ['w-1']),                                      # the first of the limited set, inventory order
    ([('cp-1', {})] + ADDRESSED[1:], None, ['cp-2']),                     # a node without an address is never the lead
    ([(name, {}) for name, _values in ADDRESSED], None, []),              # no node with an address: no host, no failure
], ids=['first-node', 'limit-without-the-first-node', 'first-node-without-address', 'no-address-at-all'])
def test_the_lead_is_the_first_node_with_an_address_in_inventory_order(tmp_path, hosts, limit, lead):
    assert run_lead_selection(tmp_path, hosts, limit) == lead


def test_the_flux_hand_off_before_the_releases_sits_between_the_cni_repair_and_the_cni_gates():
    """Flux's controllers need their own nodes' network only: the flux play that hands Flux the repository before the
    bootstrap releases comes after Cilium and the repair, before the cni gates; the gates still come before the apps
    and gitops stages, and the other flux play (after the releases) after the apps stage."""
    order = []   # role:entry point of each stage play's roles and role imports, in site.yml's order
    tags = {}    # the same -> its play's tags
    for play in plays():
        order.extend('%s:main' % role['role'].replace(COLLECTION_PREFIX, '') for role in play.get('roles') or [])
        for task in play.get('tasks') or []:
            action, args = action_of(task)
            if action != 'import_role' or play.get('tags') == ['always']:
                continue
            name = '%s:%s' % (args['name'].replace(COLLECTION_PREFIX, ''), args.get('tasks_from') or 'main')
            if name == 'flux:main':
                # the two hand-off plays, told apart by their condition on flux_handoff_before_apps
                name += ':after' if str(task.get('when', '')).startswith('not') else ':before'
            order.append(name)
            tags[name] = play.get('tags')
    wanted = ['cni:main', 'cni:remediate', 'flux:main:before', 'cni:gates', 'bootstrap_apps:main', 'flux:main:after',
              'gitops:main']
    assert [name for name in order if name in wanted] == wanted, order
    # what Flux needs before it gets the repository: its components, the key Secret, the credentials and seals
    for earlier in ('flux:components', 'sealed_secrets:main', 'flux:prepare'):
        assert order.index(earlier) < order.index('flux:main:before'), (earlier, order)
    # inside the cni stage's plays, but its own stage: --tags cni does not hand Flux the repository
    assert tags['flux:main:before'] == ['flux', 'flux_before_apps'] and tags['flux:main:after'] == ['flux', 'flux_after_apps']
    assert tags['cni:gates'] == ['cni', 'cni_gates']
