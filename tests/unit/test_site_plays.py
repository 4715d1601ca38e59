"""The shape of playbooks/site.yml: stage = tag = role = play = docs page, in execution order (issue 21).

1. Every play of a stage is named `Stage <stage> (<part>) - ...`; its tags are its stage tag first, then its own
   sub-stage tag `<stage>_<part>`, unique in site.yml, then the other tags that select it. The two `always` plays
   belong to no stage.
2. A stage tag selects the same plays as before sub-stage tags existed, and the run report and preflight know every
   stage tag, in the same order.
3. docs/README.md's table "Plays in execution order" lists the plays of site.yml, in order, with their tags, role
   entry points and page (both parsed here).
4. The check that fails a node without an address knows every tag that selects a play after the vms stage.
5. The run report's sub-stage rule (_timeline.sub_stage_tags) gives every task of a stage play of site.yml, with the
   tags Ansible gives it (its own, its blocks', its role's, its play's: ansible-playbook --list-tasks), exactly its
   play's sub-stage tag, and no more than one sub-stage to any task of playbooks/*.yml.
"""
import functools
import os
import re
import subprocess

import pytest
import yaml

from ansible_collections.proxtalos.cluster.plugins.plugin_utils import _timeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANSIBLE_PLAYBOOK = os.path.join(ROOT, '.venv', 'bin', 'ansible-playbook')
PLAYBOOKS = os.path.join(ROOT, 'playbooks')
SITE = os.path.join(ROOT, 'playbooks', 'site.yml')
DOCS = os.path.join(ROOT, 'docs', 'README.md')
PREFLIGHT_VARS = os.path.join(ROOT, 'roles', 'preflight', 'vars', 'main.yml')
COLLECTION_PREFIX = 'proxtalos.cluster.'
STAGE_PLAY_NAME = re.compile(r'^Stage (?P<stage>[a-z_]+) \((?P<part>[A-Za-z ]+)\) - ')
ALWAYS_PLAYS = ('Node addresses for the stages after vms', 'Nodes without an address')
# The stage tags (each play's first tag) in the order their first play runs: what `--tags <stage>` selects, the run
# report's rows and tests/integration/reliability_lab.py's stages() go by.
STAGE_ORDER = ['preflight', 'vms', 'secrets', 'apply', 'bootstrap', 'kubeconfig', 'flux_install', 'sealed_secrets',
               'cni', 'flux', 'apps', 'gitops', 'report']
# Every tag of each play before sub-stage tags were added (the stage tag and the others), by sub-stage tag: a user's
# `--tags <stage>` selects the same plays as before.
TAGS_BEFORE = {'preflight_checks': ['preflight'], 'vms_proxmox': ['vms'], 'vms_talos_api': ['vms'],
               'secrets_render': ['secrets'], 'apply_all': ['apply'], 'apply_rolling_control_planes': ['apply'],
               'apply_rolling_workers': ['apply'], 'bootstrap_etcd': ['bootstrap'], 'kubeconfig_fetch': ['kubeconfig'],
               'flux_components': ['flux_install', 'flux'], 'sealed_secrets_key': ['sealed_secrets'],
               'flux_prepare': ['flux_install', 'flux'], 'bootstrap_gates': ['bootstrap'], 'cni_cilium': ['cni'],
               'cni_remediate': ['cni', 'remediate'], 'flux_before_apps': ['flux'], 'cni_gates': ['cni'],
               'apps_releases': ['apps'], 'flux_after_apps': ['flux'], 'gitops_gates': ['gitops'],
               'report_read': ['report'], 'report_failures': ['report']}


def site_plays():
    with open(SITE, encoding='utf-8') as handle:
        return yaml.safe_load(handle)


def stage_plays():
    return [play for play in site_plays() if play.get('tags') != ['always']]


def entry_points(play):
    """role:entry point of each role the play runs (its roles, its import_role tasks), in order."""
    entries = ['%s:main' % role['role'].replace(COLLECTION_PREFIX, '') for role in play.get('roles') or []]
    for task in play.get('tasks') or []:
        args = task.get('ansible.builtin.import_role')
        if args:
            entries.append('%s:%s' % (args['name'].replace(COLLECTION_PREFIX, ''), args.get('tasks_from', 'main')))
    return entries


def code_cell(cell):
    """The `code` spans of a table cell, in order ('-' is none)."""
    return re.findall(r'`([^`]+)`', cell)


def documented_plays():
    """The rows of docs/README.md's "Plays in execution order" table, each a dict of its cells."""
    with open(DOCS, encoding='utf-8') as handle:
        text = handle.read()
    section = text.split('\n### Plays in execution order\n', 1)[1].split('\n#', 1)[0]
    rows = [line for line in section.splitlines() if line.startswith('| ')]
    header = [cell.strip() for cell in rows[0].strip('|').split('|')]
    assert header == ['#', 'play', 'stage tag', 'sub-stage tag', 'other tags', 'role:entry point', 'page'], header
    out = []
    for line in rows[1:]:
        cells = [cell.strip() for cell in line.strip().strip('|').split('|')]
        assert len(cells) == len(header), line
        out.append(dict(zip(header, cells)))
    return out


def test_every_stage_play_has_its_stage_tag_then_one_sub_stage_tag_of_its_own_named_after_the_play():
    plays = site_plays()
    assert [play['name'].split(' - ')[0] for play in plays if play.get('tags') == ['always']] == list(ALWAYS_PLAYS)
    sub_stages = []
    for play in stage_plays():
        match = STAGE_PLAY_NAME.match(play['name'])
        assert match, 'play %r: not named "Stage <stage> (<part>) - ..."' % play['name']
        stage, part = match.group('stage'), match.group('part')
        tags = play['tags']
        assert len(tags) >= 2, 'play %r: tags %s, want the stage tag then a sub-stage tag' % (play['name'], tags)
        assert tags[1] == '%s_%s' % (stage, part.lower().replace(' ', '_')), (play['name'], tags)
        assert tags[0] in STAGE_ORDER and stage in tags, (play['name'], tags)
        sub_stages.append(tags[1])
    duplicates = sorted(set(tag for tag in sub_stages if sub_stages.count(tag) > 1))
    assert not duplicates, 'sub-stage tags on more than one play: %s' % duplicates
    # exactly one sub-stage tag per play: no play carries another play's sub-stage tag, nor is one a stage tag
    for play in stage_plays():
        assert [tag for tag in play['tags'] if tag in sub_stages] == [play['tags'][1]], (play['name'], play['tags'])
    assert not set(sub_stages) & set(STAGE_ORDER)


def test_a_stage_tag_selects_the_plays_it_selected_before_and_the_report_and_preflight_know_every_stage():
    by_sub_stage = dict((play['tags'][1], [play['tags'][0]] + play['tags'][2:]) for play in stage_plays())
    assert by_sub_stage == TAGS_BEFORE
    order = []
    for play in stage_plays():
        if play['tags'][0] not in order:
            order.append(play['tags'][0])
    assert order == STAGE_ORDER
    # the run report's stage rows, in the same order (plus remediate, a row of the cni stage's repair tasks)
    assert [stage for stage in _timeline.DEFAULT_STAGES if stage != 'remediate'] == STAGE_ORDER
    with open(PREFLIGHT_VARS, encoding='utf-8') as handle:
        known = yaml.safe_load(handle)['preflight_known_stages']
    assert sorted(known) == sorted(set(STAGE_ORDER) - {'preflight', 'report'})


def test_the_documented_table_lists_the_plays_of_site_yml_in_order():
    documented = documented_plays()
    plays = site_plays()
    assert [row['play'] for row in documented] == ['`%s`' % play['name'].split(' - ')[0] for play in plays]
    for number, (row, play) in enumerate(zip(documented, plays), 1):
        where = 'docs/README.md row %s (%s)' % (row['#'], row['play'])
        assert row['#'] == str(number), where
        tags = play['tags']
        if tags == ['always']:
            assert (code_cell(row['stage tag']), row['sub-stage tag'], row['other tags']) == (['always'], '-', '-'), where
        else:
            assert code_cell(row['stage tag']) == [tags[0]], where
            assert code_cell(row['sub-stage tag']) == [tags[1]], where
            assert code_cell(row['other tags']) == tags[2:], where
        assert code_cell(row['role:entry point']) == entry_points(play), where
        pages = re.findall(r'\]\(([^)]+)\)', row['page'])
        assert pages, where
        for page in pages:
            assert os.path.isfile(os.path.join(ROOT, 'docs', page)), '%s: no page %s' % (where, page)
        match = STAGE_PLAY_NAME.match(play['name'])
        assert pages[0] == 'stages/%s.md' % (match.group('stage') if match else 'vms'), where


def test_a_node_without_an_address_fails_for_every_tag_that_selects_a_play_after_the_vms_stage():
    plays = site_plays()
    names = [play['name'] for play in plays]
    unavailable = plays[[name.split(' - ')[0] for name in names].index('Nodes without an address')]
    check = [task for task in unavailable['tasks'] if task['name'] == 'Every node has an address before the stages after vms'][0]
    listed = yaml.safe_load(re.search(r'intersect\((\[[^\]]*\])\)', check['when']).group(1))
    after = set()
    for play in plays[names.index(unavailable['name']) + 1:]:
        if play['tags'][0] not in ('always', 'vms'):
            after.update(play['tags'])
    assert sorted(listed) == sorted(after)
    assert len(listed) == len(set(listed))


LISTED_PLAYBOOK = re.compile(r'^playbook: (?P<path>.*)$')
LISTED_PLAY = re.compile(r'^  play #[0-9]+ \(.*?\): (?P<name>.*)\tTAGS: \[(?P<tags>[^\]]*)\]$')
LISTED_TASK = re.compile(r'^      (?P<name>.*)\tTAGS: \[(?P<tags>[^\]]*)\]$')


def _tag_list(text):
    return [tag.strip() for tag in text.split(',') if tag.strip()]


@functools.lru_cache(maxsize=1)
def listed_tasks():
    """{playbook file name: [(play name, play tags, task name, task tags)]} of every task ansible-playbook --list-tasks
    lists for each playbook of playbooks/ (one run for all of them).

    Its task tags are the ones the task runs with: its own, its blocks', its role's and its play's (ansible-core lists
    them sorted); a dynamic include's tasks are not listed (the include is, with the tags it passes on)."""
    names = sorted(name for name in os.listdir(PLAYBOOKS) if name.endswith('.yml'))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1')
    run = subprocess.run([ANSIBLE_PLAYBOOK, '-i', 'localhost,', '--list-tasks'] + [os.path.join(PLAYBOOKS, name) for name in names],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    listed = {}
    tasks = play = None
    for line in run.stdout.splitlines():
        match = LISTED_PLAYBOOK.match(line)
        if match:
            tasks = listed.setdefault(os.path.basename(match.group('path')), [])
            play = None
            continue
        match = LISTED_PLAY.match(line)
        if match:
            play = (match.group('name'), _tag_list(match.group('tags')))
            continue
        match = LISTED_TASK.match(line)
        if match:
            assert tasks is not None and play is not None, line
            tasks.append(play + (match.group('name'), _tag_list(match.group('tags'))))
    assert sorted(listed) == names, (sorted(listed), names)
    return listed


def test_the_sub_stage_rule_and_what_it_does_not_take():
    stages = _timeline.DEFAULT_STAGES
    assert _timeline.sub_stage_tags(['bootstrap', 'bootstrap_gates'], stages) == ['bootstrap_gates']
    # a task's own tag that is a stage (remediate, flux_install) is no sub-stage; its play's sub-stage tag still is
    assert _timeline.sub_stage_tags(['remediate', 'cni', 'cni_remediate', 'remediate'], stages) == ['cni_remediate']
    assert _timeline.sub_stage_tags(['flux_install', 'flux_components', 'flux'], stages) == ['flux_components']
    # a tag named after a stage that is not among the task's tags, or after no stage, is none
    assert _timeline.sub_stage_tags(['upgrade_kubernetes', 'flux_resume'], stages) == []
    assert _timeline.sub_stage_tags(['cni', 'gates_cni'], stages) == []
    assert _timeline.sub_stage_tags(['cni', 'cni_'], stages) == []
    # two are two (the test below fails a play that has them); the innermost is the task's
    assert _timeline.sub_stage_tags(['cni_gates', 'cni', 'cni_cilium'], stages) == ['cni_gates', 'cni_cilium']
    assert _timeline.sub_stage_of(['cni_gates', 'cni', 'cni_cilium'], stages) == 'cni_gates'
    assert _timeline.sub_stage_of(['always'], stages) is None


@pytest.mark.skipif(not os.access(ANSIBLE_PLAYBOOK, os.X_OK), reason='no ansible-playbook in .venv (make setup)')
def test_every_task_of_a_stage_play_of_site_yml_has_its_plays_sub_stage_and_no_other():
    expected = dict((play['name'], play['tags'][1]) for play in stage_plays())
    seen = set()
    tasks = listed_tasks()['site.yml']
    assert tasks
    for play_name, play_tags, task_name, task_tags in tasks:
        found = _timeline.sub_stage_tags(task_tags, _timeline.DEFAULT_STAGES)
        if play_tags == ['always']:
            assert found == [], (play_name, task_name, task_tags)
            continue
        assert found == [expected[play_name]], (play_name, task_name, task_tags, found)
        assert _timeline.stage_of(task_tags, _timeline.DEFAULT_STAGES) is not None, (play_name, task_name, task_tags)
        seen.add(play_name)
    assert seen == set(expected)   # every stage play listed tasks


@pytest.mark.skipif(not os.access(ANSIBLE_PLAYBOOK, os.X_OK), reason='no ansible-playbook in .venv (make setup)')
def test_no_task_of_a_playbook_has_two_sub_stages():
    listed = listed_tasks()
    assert 'upgrade_kubernetes.yml' in listed
    site_sub_stages = set(play['tags'][1] for play in stage_plays())
    for name, tasks in sorted(listed.items()):
        assert tasks, name
        for play_name, _play_tags, task_name, task_tags in tasks:
            found = _timeline.sub_stage_tags(task_tags, _timeline.DEFAULT_STAGES)
            # a sub-stage outside site.yml would be a play of its own that docs/README.md's table does not list
            assert len(found) <= 1 and set(found) <= site_sub_stages, (name, play_name, task_name, task_tags, found)
