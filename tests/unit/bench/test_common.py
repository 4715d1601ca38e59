import datetime
import json
import os
import subprocess
import sys
import types

import pytest

from bench import __main__ as bench_main
from bench import common


def test_a_lab_gets_one_pve_node_per_eight_vms_so_every_node_has_storage_room():
    assert common.pve_nodes_for(1) == ['pve1']
    assert common.pve_nodes_for(6) == ['pve1']
    assert common.pve_nodes_for(8) == ['pve1']
    assert common.pve_nodes_for(9) == ['pve1', 'pve2']
    assert common.pve_nodes_for(24) == ['pve1', 'pve2', 'pve3']
    assert len(common.pve_nodes_for(96)) == 12
    # 8 VMs of 10 GiB (Talos' minimum disk) fit the 100 GiB a lab PVE node's storage holds
    assert common.VMS_PER_PVE_NODE * 10 <= 100


def test_results_of_another_world_go_to_a_file_of_their_own_and_say_their_world(tmp_path, monkeypatch):
    monkeypatch.setattr(common, 'RESULTS', str(tmp_path))
    when = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.timezone.utc)
    lab_world = {'kubernetes': 'lab', 'flux': 'lab'}
    upstream = {'kubernetes': 'upstream', 'flux': 'upstream'}
    entry = {'metrics': [], 'world': upstream}
    assert common.write_results({'p3_noop_rerun': entry}, upstream, when).endswith('2026-11-28-kubernetes-upstream-flux-upstream.json')
    assert common.write_results({'p3_noop_rerun': dict(entry, world=lab_world)}, lab_world, when).endswith('/2026-11-28.json')
    written = json.loads((tmp_path / '2026-11-28-kubernetes-upstream-flux-upstream.json').read_text())
    assert written['world'] == upstream and written['benchmarks']['p3_noop_rerun']['world'] == upstream
    assert json.loads((tmp_path / '2026-11-28.json').read_text())['world'] == lab_world
    assert common.world_tag({'kubernetes': 'upstream', 'flux': 'lab'}) == 'kubernetes-upstream-flux-lab'


def test_the_world_a_lab_ran_is_read_from_the_extensions_of_its_state():
    def lab(*extensions):
        return types.SimpleNamespace(state={'extensions': list(extensions)})
    assert common.lab_world(lab('lab.talos', 'lab.k8s', 'lab.flux')) == {'kubernetes': 'lab', 'flux': 'lab'}
    assert common.lab_world(lab('lab.talos', 'lab.k8s_upstream', 'lab.flux')) == {'kubernetes': 'upstream', 'flux': 'lab'}
    assert common.lab_world(lab('lab.talos', 'lab.k8s_upstream', 'lab.flux_upstream')) == {
        'kubernetes': 'upstream', 'flux': 'upstream'}


def test_the_world_follows_the_option_else_the_labs_environment_variables(monkeypatch):
    monkeypatch.setenv('PROXTALOS_LAB_KUBERNETES', 'upstream')
    monkeypatch.setenv('PROXTALOS_LAB_FLUX', 'upstream')
    try:
        common.choose_world()
        assert common.expected_world() == {'kubernetes': 'upstream', 'flux': 'upstream'}
        common.choose_world('lab', 'lab')
        assert common.expected_world() == {'kubernetes': 'lab', 'flux': 'lab'}
        monkeypatch.setenv('PROXTALOS_LAB_KUBERNETES', 'lab')
        common.choose_world(None, None)
        with pytest.raises(ValueError, match='PROXTALOS_LAB_FLUX upstream needs upstream Kubernetes'):
            common.expected_world()
    finally:
        common.choose_world()


def test_python_m_bench_refuses_upstream_flux_on_the_hand_written_kubernetes(capsys):
    with pytest.raises(SystemExit) as exited:
        bench_main.main(['--kubernetes', 'lab', '--flux', 'upstream', '--list'])
    assert exited.value.code == 2
    assert '--flux upstream needs upstream Kubernetes' in capsys.readouterr().err
    common.choose_world()


def test_the_tree_sampler_sums_the_children_and_keeps_each_names_peak():
    # a child that holds 64 MiB of its own (written, so resident and not shared), and a sleeping one
    holder = subprocess.Popen([sys.executable, '-c', 'import sys, time; b = bytearray(64 << 20); b[::4096] = b"x" * len(b[::4096]); '
                               'print("ready", flush=True); time.sleep(30)'], stdout=subprocess.PIPE, text=True)
    sleeper = subprocess.Popen(['sleep', '30'])
    try:
        assert holder.stdout.readline().strip() == 'ready'
        sampler = common.TreeMemorySampler(holder.pid)   # the holder's own tree: itself alone
        sampler.sample()
        assert sampler.tree_peak_processes == 1
        assert sampler.tree_peak_pss_kb >= 64 * 1024
        assert [(row['name'], row['processes']) for row in sampler.biggest()] == [(common._process_name(holder.pid), 1)]  # pylint: disable=protected-access
        mine = common.TreeMemorySampler(os.getpid())     # this test's tree: the holder and the sleeper are in it
        mine.sample()
        names = {row['name']: row for row in mine.biggest()}
        assert names['sleep']['processes'] == 1
        assert mine.tree_peak_pss_kb >= sampler.tree_peak_pss_kb + names['sleep']['peak_pss_kb']
        assert mine.biggest(1)[0]['peak_pss_kb'] >= 64 * 1024
    finally:
        for child in (holder, sleeper):
            child.kill()
            child.wait()


def test_a_python_module_process_is_named_by_its_module():
    child = subprocess.Popen([sys.executable, '-m', 'timeit', '-s', 'print("ready", flush=True)', '-n', '1', '-r', '1',
                              'import time; time.sleep(30)'], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == 'ready'
        assert common._process_name(child.pid) == 'python -m timeit'  # pylint: disable=protected-access
        assert common._process_name(os.getpid()) != 'python -m timeit'  # pylint: disable=protected-access
    finally:
        child.kill()
        child.wait()
