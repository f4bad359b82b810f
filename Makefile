# gshard_mt: `make train` and `make test` set everything up on a fresh machine.
# JAX 0.11+ needs Python >= 3.12: take the first python3.13/python3.12/python3 on PATH that is new enough,
# else a pyenv-installed 3.12+/3.13+ (the bare pyenv shims refuse to run without a selected version).
SHELL := /bin/bash
VENV ?= .venv
CONFIG ?= configs/tiny.py
WORKDIR ?= runs/tiny
SPLIT ?= test
SWEEP ?= configs/sweeps/experts.py
ARGS ?=

PYTHON_FOR_VENV := $(shell \
  for p in python3.13 python3.12 python3; do \
    if command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then \
      command -v $$p; exit 0; fi; done; \
  if command -v pyenv >/dev/null 2>&1; then \
    for p in $$(ls -d "$$(pyenv root)"/versions/3.1[2-9]* 2>/dev/null | sort -V -r); do \
      if [ -x "$$p/bin/python3" ]; then echo "$$p/bin/python3"; exit 0; fi; done; fi)
PY := $(VENV)/bin/python
# The JAX build installed beside the project: tools/jax_build.py finds a TPU VM (tpu), NVIDIA GPUs (cuda13, or cuda12
# for drivers older than 580) or neither (cpu); `make train JAX_BUILD=cpu` (tpu, cuda12, cuda13) chooses instead.
JAX_BUILD ?= auto

.PHONY: venv test test-fast lint mutate prepare train eval translate sweep study router-study upcycle-study bench bench-gpu inspect-data clean

# The stamp holds the build installed; a JAX_BUILD other than it (and than auto) installs again.
ifneq ($(JAX_BUILD),auto)
ifneq ($(JAX_BUILD),$(shell cat $(VENV)/.installed 2>/dev/null))
.PHONY: $(VENV)/.installed
endif
endif

$(VENV)/.installed: pyproject.toml
	@if [ -z "$(PYTHON_FOR_VENV)" ]; then echo "error: need Python >= 3.12 (python3.12 on PATH, or pyenv install 3.12)" >&2; exit 1; fi
	@test -x $(PY) || $(PYTHON_FOR_VENV) -m venv $(VENV)
	@$(PY) tools/jax_build.py --build $(JAX_BUILD) > $(VENV)/.jax_build
	$(PY) -m pip install -q --upgrade pip
	extras=test; if [ "$$(cat $(VENV)/.jax_build)" = tpu ]; then extras=test,gcs; fi; \
	  $(PY) -m pip install -q -e ".[$$extras]"
	@build=$$(cat $(VENV)/.jax_build); if [ "$$build" != cpu ]; then \
	  jax="jax[$$build]==$$($(PY) -c 'import importlib.metadata as m; print(m.version("jax"))')"; \
	  echo "$(PY) -m pip install -q '$$jax'"; $(PY) -m pip install -q "$$jax"; fi
	@mv $(VENV)/.jax_build $@

venv: $(VENV)/.installed

# Where JAX runs on the CPU, the tests run in up to 4 processes (pytest-xdist), each taking whole files so that a
# file's module fixtures are built once; a TPU or GPU is opened by one process only, so there they run in one.
PYTEST = workers=$$(if [ "$$(cat $(VENV)/.installed)" = cpu ]; then $(PY) -c 'import os; print(min(os.cpu_count(), 4))'; \
  else echo 0; fi); set -x; $(PY) -m pytest -q -n $$workers --dist loadfile

test: venv  # the 10 slowest tests listed after the summary (what the suite takes on 2 cores: README, make test)
	@$(PYTEST) --durations=10 tests

test-fast: venv  # the unit tests, not the slow ones
	@$(PYTEST) tests/unit -m "not slow"

lint: venv
	$(PY) -m ruff check gshard_mt tests bench configs tools train.py eval.py translate.py

mutate: venv  # mutation testing of the pure core against its unit tests (slow, not in test): ARGS="gating dispatch"
	@$(PY) -c 'import mutmut' 2>/dev/null || $(PY) -m pip install -q -e ".[mutate]"
	$(PY) bench/mutate.py $(ARGS)

prepare: venv  # the corpus read, tokenized and written as shards once (train.py does it when they are missing)
	$(PY) -m gshard_mt.tools.prepare_data --config $(CONFIG) --workdir $(WORKDIR) $(ARGS)

train: venv
	$(PY) train.py --config $(CONFIG) --workdir $(WORKDIR) $(ARGS)

eval: venv
	$(PY) eval.py --workdir $(WORKDIR) --split $(SPLIT) $(ARGS)

translate: venv  # echo "Je suis content." | make -s translate ARGS="--src_lang fra" (@: no command echo on stdout)
	@$(PY) translate.py --workdir $(WORKDIR) $(ARGS)

sweep: venv
	$(PY) -m gshard_mt.tools.sweep --sweep $(SWEEP) $(ARGS)

study: venv  # the MoE-versus-dense study (configs/sweeps/study.py): runs/sweeps/study/report.md
	$(PY) -m gshard_mt.tools.study --sweep configs/sweeps/study.py $(ARGS)

router-study: venv  # every router against the dense twin, 2 seeds, ~90 min on 2 CPU cores: bench/results/routers/
	$(PY) -m gshard_mt.tools.router_study --sweep configs/sweeps/routers.py $(ARGS)

upcycle-study: venv  # dense N steps, then dense continued / upcycled / MoE from scratch, 2 seeds: bench/results/upcycling/
	$(PY) -m gshard_mt.tools.upcycle_study --config configs/routers.py $(ARGS)

bench: venv
	$(PY) bench/moe_layer.py --small
	$(PY) bench/moe_layer.py --small --tpu v5p:1x1x1  # the TPU compiler's estimate (libtpu), any machine
	$(PY) bench/input_pipeline.py

bench-gpu: venv  # the accelerator suite: bench/results/<date>-<device>.json (docs/performance.md: python bench/report.py)
	$(PY) bench/gpu_suite.py $(ARGS)

inspect-data: venv  # the run's prepared corpus in WORKDIR, prepared there when missing
	$(PY) -m gshard_mt.tools.inspect_data --config $(CONFIG) --workdir $(WORKDIR) $(ARGS)

clean:
	rm -rf $(VENV) runs
