"""Benchmarks against the lab: `python -m bench` (make bench). Not tests: they measure, they do not assert.

One module per benchmark in this package (p1_bootstrap_ratio.py ... p7_cni_gate_latency.py). Each defines
BENCHMARK, a bench.common.Benchmark with a name, a description, the goal it is measured against and
run(options) returning a list of Metric. `python -m bench` runs them all (or the ones named: `--only P1,P3`),
prints a Markdown table and writes bench/results/<date>.json. docs/performance.md explains the numbers.

Shared pieces: bench.common (labs, playbook runs with memory sampling, bootstrap() - one measured site.yml run
that P1, P2, P4 and P6 share within one `python -m bench`), bench.critical_path (the critical path of the
lab's recorded delays), bench.timeline (`python -m bench.timeline ARTIFACTS`: one run's stages, gates and
delays on one clock).
"""
