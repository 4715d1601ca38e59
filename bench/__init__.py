"""Benchmarks against the lab: `python -m bench` (make bench). Not tests: they measure, they do not assert.

One module per benchmark in this package (p5_vm_creation.py, ...). Each defines BENCHMARK, a
bench.common.Benchmark with a name, a description, the goal it is measured against and run(options)
returning a list of Metric. `python -m bench` runs them all (or the ones named), prints a Markdown table
and writes bench/results/<date>.json.
"""
