# Set-up and tests. `make setup` then `make test`; see README.md.

PYTHON ?= python3.11
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python
# The TensorFlow pin, read from pyproject.toml (the one place versions are written).
TENSORFLOW := $(shell $(PYTHON) -c "import tomllib; print(next(d for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'] if d.startswith('tensorflow')))")
HOROVOD_VERSION := 0.28.1
# Horovod ships only as source and compiles against one TensorFlow ABI, so its wheel is cached
# per Horovod and TensorFlow version and per patch, outside the clone: a fresh clone reuses it.
# pip's own wheel cache is bypassed because it would not tell TensorFlow versions apart.
HOROVOD_PATCH_ID := $(shell cat scripts/horovod/*.patch scripts/horovod/build-wheel.sh | sha256sum | cut -c1-12)
WHEEL_CACHE ?= $(HOME)/.cache/caramel/horovod-$(HOROVOD_VERSION)-$(subst ==,,$(TENSORFLOW))-cp311-$(HOROVOD_PATCH_ID)
# CARAMEL_WITHOUT_HOROVOD=1 make setup: TensorFlow's own collectives only (spec.caramel.backend:
# tensorflow), nothing compiled.
CARAMEL_WITHOUT_HOROVOD ?=
PYTEST_ARGS ?=
# Installed without their dependencies ([tool.caramel] in pyproject.toml): tf-keras (Keras 2), whose
# requirement on the full `tensorflow` would install a second TensorFlow.
WITHOUT_DEPENDENCIES := $(shell $(PYTHON) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['tool']['caramel']['without-dependencies'])")

.PHONY: setup test test-fast test-process test-recovery crd rbac clean bench bench-zoo bench-topology bench-horovod-scripts bench-needs-root

# The CRD and the API reference (docs/api.md) are generated from the API models; tests fail when a
# committed copy drifts.
CRD_COPIES := manifests/crd.yaml helm/caramel/files/crd.yaml
API_REFERENCE := docs/api.md
# The operator's RBAC is generated from caramel_operator.rbac, each copy as path:variant; tests fail
# when a committed copy drifts.
RBAC_COPIES := helm/caramel/files/rbac-rules.yaml:chart manifests/rbac.yaml:cluster manifests/namespaced/rbac-namespaced.yaml:namespaced

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: pyproject.toml Makefile scripts/install-k8s-tools.sh scripts/horovod/build-wheel.sh scripts/horovod/*.patch
	$(PYTHON) -m venv $(VENV)
	$(VENV_PYTHON) -m pip install --quiet --upgrade pip setuptools wheel
	@# kubectl and helm, for the chart tests and the kind end-to-end script; cached like Horovod.
	@bash scripts/install-k8s-tools.sh $(VENV)
	@echo "--- installing $(TENSORFLOW) and Caramel"
	$(VENV_PYTHON) -m pip install --quiet -e '.[test]'
	$(VENV_PYTHON) -m pip install --quiet --no-deps $(WITHOUT_DEPENDENCIES)
	@if [ -n "$(CARAMEL_WITHOUT_HOROVOD)" ]; then \
		echo "--- CARAMEL_WITHOUT_HOROVOD is set: no Horovod (the tensorflow backend only)"; \
	elif ls $(WHEEL_CACHE)/horovod-*.whl >/dev/null 2>&1; then \
		echo "--- using the cached Horovod wheel in $(WHEEL_CACHE)"; \
	else \
		echo "--- building Horovod $(HOROVOD_VERSION) with Gloo against $(TENSORFLOW) (takes 3-5 minutes, once)"; \
		bash scripts/horovod/build-wheel.sh $(VENV_PYTHON) $(WHEEL_CACHE); \
	fi
	@if [ -z "$(CARAMEL_WITHOUT_HOROVOD)" ]; then $(VENV_PYTHON) -m pip install --quiet $(WHEEL_CACHE)/horovod-*.whl; fi
	TF_CPP_MIN_LOG_LEVEL=3 $(VENV_PYTHON) -c "import caramel.tensorflow, caramel.contract.api"
	$(VENV_PYTHON) -m caramel.launch.one_tensorflow
	@touch $@
	@echo "--- set-up done: activate with 'source $(VENV)/bin/activate'"

# The unit tests, and the tests that start processes (marker process, put on by tests/process_marks.py:
# workers, the operator, the emulator, caramel, helm, mypy, docker, ...), each on pytest-xdist's
# workers; the recovery runs (marker recovery: training broken mid-run on purpose, or resumed) by
# themselves, which CI runs after make test. Two tests side by side never share a port: each xdist
# worker picks its jobs' ports from a range of its own (testbed/ports.py). Tests that share a
# module's run of a job are one xdist_group, which one worker runs (loadgroup). PROCESS_WORKERS=1
# runs them one at a time.
TEST_WORKERS ?= 2
PROCESS_WORKERS ?= 2
FAST_TESTS = $(VENV_PYTHON) -m pytest -m 'not process' -n $(TEST_WORKERS) --dist loadgroup
PROCESS_XDIST = $(if $(filter-out 1,$(PROCESS_WORKERS)),-n $(PROCESS_WORKERS) --dist loadgroup)
PROCESS_TESTS = $(VENV_PYTHON) -m pytest -m 'process and not recovery' $(PROCESS_XDIST)
RECOVERY_TESTS = $(VENV_PYTHON) -m pytest -m recovery $(PROCESS_XDIST)

# The suite but its recovery runs (make test-recovery), the unit tests first: a red one fails at
# once, before the slow part starts.
# The tests cover the benchmarks too, whose extra (matplotlib) the bench set-up installs.
test: setup $(VENV)/.bench-done
	@echo "--- the unit tests (make test-fast)"
	$(FAST_TESTS) $(PYTEST_ARGS)
	@echo "--- the tests that start processes (make test-process)"
	$(PROCESS_TESTS) $(PYTEST_ARGS)

# The unit tests only: no process started; at most 2 minutes on 2 cores.
test-fast: setup $(VENV)/.bench-done
	$(FAST_TESTS) $(PYTEST_ARGS)

test-process: setup $(VENV)/.bench-done
	$(PROCESS_TESTS) $(PYTEST_ARGS)

# The end-to-end runs that break training mid-run on purpose or resume it, and check that it ends
# as an unbroken run does (marker recovery): CI runs them after make test.
test-recovery: setup $(VENV)/.bench-done
	$(RECOVERY_TESTS) $(PYTEST_ARGS)

# The scheduling benchmark (benchmarks/README.md). It builds network namespaces, a bridge, tc
# shaping and an iptables rule, hence root. Arguments: make bench BENCH_ARGS="--profiles resnet50".
BENCH_ARGS ?=

bench: bench-needs-root $(VENV)/.bench-done
	$(VENV_PYTHON) -m benchmarks.scheduling_bench $(BENCH_ARGS)

# The model zoo (benchmarks/README.md): every profile at its operating points at 1 and 4 Gbit/s,
# Horovod against Caramel's public paths. Root, like bench. Arguments: make bench-zoo ZOO_ARGS="--profiles densenet121".
ZOO_ARGS ?=

bench-zoo: bench-needs-root $(VENV)/.bench-done
	$(VENV_PYTHON) -m benchmarks.zoo_bench $(ZOO_ARGS)

# Horovod's ring against MULTITREE on two emulated racks behind a shaped uplink, and on one
# bridge (benchmarks/README.md). Root, like bench. Arguments: make bench-topology BENCH_ARGS="--workers 4".
bench-topology: bench-needs-root $(VENV)/.setup-done
	$(VENV_PYTHON) -m benchmarks.topology_bench $(BENCH_ARGS)

# Horovod-shaped scripts (examples/horovod) under Caramel against plain Horovod on the same scripts,
# as local processes (no root). Arguments: make bench-horovod-scripts BENCH_ARGS="--scripts mnist --repeats 5".
bench-horovod-scripts: $(VENV)/.bench-done
	$(VENV_PYTHON) -m benchmarks.horovod_scripts_bench $(BENCH_ARGS)

bench-needs-root:
	@[ "$$(id -u)" = 0 ] || { echo "make bench needs root: it creates network namespaces, veths, a bridge, tc qdiscs and an iptables rule (try: sudo make bench)" >&2; exit 1; }

# matplotlib, for the benchmark's plot (the bench extra of pyproject.toml).
$(VENV)/.bench-done: $(VENV)/.setup-done pyproject.toml
	$(VENV_PYTHON) -m pip install --quiet -e '.[test,bench]'
	$(VENV_PYTHON) -m caramel.launch.one_tensorflow
	@touch $@

crd: setup
	@for copy in $(CRD_COPIES); do mkdir -p $$(dirname $$copy); $(VENV_PYTHON) -m caramel_operator.crd > $$copy; echo "wrote $$copy"; done
	@mkdir -p $$(dirname $(API_REFERENCE)); $(VENV_PYTHON) -m caramel.contract.reference > $(API_REFERENCE); echo "wrote $(API_REFERENCE)"

rbac: setup
	@for copy in $(RBAC_COPIES); do path=$${copy%%:*}; $(VENV_PYTHON) -m caramel_operator.rbac $${copy##*:} > $$path; echo "wrote $$path"; done

clean:
	rm -rf $(VENV) build *.egg-info runtime/*.egg-info
