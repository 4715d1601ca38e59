# proxtalos.cluster: every target sets itself up (system packages, venv, pip, tools) first.
#
#   make demo    start the lab and run site.yml against inventories/lab
#   make test    unit tests, lab tests, integration tests, Molecule, ansible-lint, ansible-test sanity
#   make lint    ansible-lint (production profile, offline) and ansible-test sanity
#   make bench   benchmarks against the lab (results in bench/results/)

SHELL := /bin/bash
.DEFAULT_GOAL := help

ROOT := $(CURDIR)
VENV := $(ROOT)/.venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
TOOLS := $(ROOT)/.tools
COLLECTION_LINK := $(ROOT)/.collections/ansible_collections/proxtalos/cluster
SANITY_ROOT ?= $(ROOT)/.collections/sanity/ansible_collections/proxtalos/cluster
PYTEST_ARGS ?=
BENCH_ARGS ?=
INVENTORY ?= inventories/lab
# The demo's lab runs upstream Kubernetes and Flux's upstream controllers (docs/lab-kubernetes.md), as python -m lab up
# does by default; LAB_KUBERNETES=lab LAB_FLUX=lab gives the retiring hand-written lab/k8s world with the Flux simulation.
LAB_KUBERNETES ?= upstream
LAB_FLUX ?= $(LAB_KUBERNETES)
LAB_ARGS ?= --control-planes 3 --workers 3 --kubernetes $(LAB_KUBERNETES) --flux $(LAB_FLUX)

export PATH := $(BIN):$(TOOLS)/bin:$(PATH)
export ANSIBLE_CONFIG := $(ROOT)/ansible.cfg
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help setup upstream-binaries system-packages test unit lab-test integration integration-upstream oldest-core molecule lint ansible-lint sanity \
        demo lab-up lab-down bench protos clean

help:
	@echo "make demo | make test | make lint | make bench | make setup | make clean"

## --- setup ---------------------------------------------------------------------------------

setup: $(STAMP) $(COLLECTION_LINK) $(BIN)/helm $(BIN)/kubectl upstream-binaries

system-packages:
	@scripts/system-packages

$(STAMP): requirements.txt requirements-dev.txt scripts/system-packages scripts/find-python scripts/fetch_k8s_tools.py
	@scripts/system-packages
	@test -x $(PY) || "$$(scripts/find-python)" -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) scripts/ansible_test_pip_stub.py >/dev/null
	$(PY) scripts/fetch_k8s_tools.py
	@touch $@

# helm and kubectl from .tools/bin, linked into the venv so that `. .venv/bin/activate` finds them too.
$(BIN)/helm $(BIN)/kubectl: $(STAMP)
	@ln -sfn $(TOOLS)/bin/$(notdir $@) $@

# Upstream components (upstream/*.json) built with Go into a per-machine cache outside the work tree
# (lab/upstream.py says where); a warm run only checks them.
upstream-binaries: $(STAMP)
	@$(PY) scripts/upstream_binaries.py
	@$(PY) -c 'from lab.talos import proto; proto.descriptor_set(); print("talos api protos %s: ready" % proto.TALOS_VERSION)'

# The collection is found by ansible.cfg through .collections/ (a link back to this checkout).
$(COLLECTION_LINK):
	@mkdir -p $(dir $@)
	@ln -sfn ../../.. $@

## --- the two README commands -----------------------------------------------------------------

# The lab (lab-up below), then the whole run against it.
demo: lab-up
	$(BIN)/ansible-playbook site.yml -i $(INVENTORY)
	@$(PY) -m lab status; report=$$(ls -t $(INVENTORY)/artifacts/*/report.html 2>/dev/null | head -n 1); \
	    if [ -n "$$report" ]; then echo "Run report: $$report (report.json and timeline.md beside it)"; \
	    else echo "Run report: none found under $(INVENTORY)/artifacts (is callbacks_enabled = proxtalos.cluster.timeline set?)"; fi

test: setup unit lab-test integration-upstream oldest-core molecule lint

## --- test parts --------------------------------------------------------------------------------

unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

lab-test: setup
	$(PY) -m pytest tests/lab $(PYTEST_ARGS)

# Integration tests, by the Kubernetes world their labs run on (python -m lab up --kubernetes/--flux; docs/lab.md):
# - UPSTREAM_KUBERNETES_TESTS, on upstream Kubernetes (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
#   kwok) with the lab's Git server and artifact mirror (lab/flux_sources.py) but no Flux controller: the cni stage's
#   suite on the upstream Cilium chart (3+3 and a single control plane, a crash-looping agent), the apps stage's suite (Pod Security admission refuses
#   privileged pods as on Talos), a GitOps tree that manages flux-system itself.
# - every other file, on upstream Kubernetes with Flux's upstream controllers and the upstream sealed-secrets
#   controller (docs/lab-flux.md): the whole of site.yml, its faults made of real objects, the fault matrix, day two,
#   upgrades, remediation, the report, interrupted runs. Files that start no lab run here too.
# Each group runs two files at a time (each file its own lab). `make integration` is the same as integration-upstream.
UPSTREAM_KUBERNETES_TESTS = tests/integration/test_cni_lab.py tests/integration/test_apps_lab.py \
	tests/integration/test_flux_tree_owned.py

integration: integration-upstream

integration-upstream: setup
	PROXTALOS_LAB_KUBERNETES=upstream PROXTALOS_LAB_FLUX=upstream $(PY) -m pytest tests/integration -n 2 --dist loadfile \
		--durations=15 $(addprefix --ignore=,$(UPSTREAM_KUBERNETES_TESTS)) $(PYTEST_ARGS)
	PROXTALOS_LAB_KUBERNETES=upstream PROXTALOS_LAB_FLUX=lab $(PY) -m pytest -n 2 --dist loadfile --durations=10 \
		$(UPSTREAM_KUBERNETES_TESTS) $(PYTEST_ARGS)

# The oldest ansible-core the collection accepts (constraints-oldest-core.txt), in a second venv: the unit tests, and
# site.yml against a lab then a re-run with changed=0 (tests/integration/test_oldest_core.py). The newest core is
# what every other target runs.
OLDEST_CORE_VENV := $(ROOT)/.venv-oldest-core
OLDEST_CORE_STAMP := $(OLDEST_CORE_VENV)/.installed

$(OLDEST_CORE_STAMP): requirements.txt requirements-dev.txt constraints-oldest-core.txt $(STAMP)
	@test -x $(OLDEST_CORE_VENV)/bin/python || "$$(scripts/find-python)" -m venv $(OLDEST_CORE_VENV)
	$(OLDEST_CORE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST_CORE_VENV)/bin/python -m pip install --quiet -r requirements-dev.txt -c constraints-oldest-core.txt
	@touch $@

oldest-core: setup $(OLDEST_CORE_STAMP)
	$(OLDEST_CORE_VENV)/bin/python -m pytest tests/unit -n 2 $(PYTEST_ARGS)
	PROXTALOS_LAB_KUBERNETES=upstream PROXTALOS_LAB_FLUX=upstream PROXTALOS_ANSIBLE_PLAYBOOK=$(OLDEST_CORE_VENV)/bin/ansible-playbook \
		$(PY) -m pytest tests/integration/test_oldest_core.py $(PYTEST_ARGS)

molecule: setup
	$(BIN)/molecule test --all

lint: ansible-lint sanity

ansible-lint: setup
	$(BIN)/ansible-lint --offline

# ansible-test wants the collection at .../ansible_collections/<ns>/<name>; it gets a fresh copy
# of the files git would track (the working tree, untracked files included, ignored ones not),
# in a repository of its own so that ansible-test lists exactly those files.
sanity: setup
	@rm -rf $(SANITY_ROOT) && mkdir -p $(SANITY_ROOT)
	@git ls-files -z --cached --others --exclude-standard | \
	    while IFS= read -r -d '' f; do [ -e "$$f" ] && printf '%s\0' "$$f"; done | \
	    xargs -0 cp -a --parents -t $(SANITY_ROOT)/
	@cd $(SANITY_ROOT) && git init -q && git add -A
	cd $(SANITY_ROOT) && $(BIN)/ansible-test sanity --python $$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])') --color no

## --- lab and benchmarks --------------------------------------------------------------------------

# On upstream Kubernetes the inline Cilium manifest is rendered once before site.yml, as a user does
# (docs/stages/cni.md): the lab names it in its run dir (lab_cilium_manifest) and render-cilium.yml writes it from the
# upstream Cilium chart that setup fetched. The lab/k8s world ships its stand-in (inventories/lab/files).
lab-up: setup
	$(PY) -m lab up --detach $(LAB_ARGS) --reuse
	if [ "$(LAB_KUBERNETES)" = upstream ]; then $(BIN)/ansible-playbook render-cilium.yml -i $(INVENTORY) \
		-e cni_manifest_keep_existing=true; fi

lab-down: setup
	$(PY) -m lab down

# make bench BENCH_ARGS="--only P1,P3 --scale 0.5" (python -m bench --help lists the options)
bench: setup
	$(PY) -m bench $(BENCH_ARGS)

## --- code generation ---------------------------------------------------------------------------

protos: setup
	$(PY) scripts/gen_talos_api.py

clean:
	-test -x $(PY) && $(PY) -m lab down
	rm -rf $(ROOT)/.venv-oldest-core
	rm -rf $(ROOT)/.collections $(ROOT)/artifacts $(ROOT)/inventories/lab/artifacts $(ROOT)/tests/output
