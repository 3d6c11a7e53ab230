# Set-up and tests. `make setup` then `make test`; see README.md.

PYTHON ?= python3.11
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python
TENSORFLOW := tensorflow-cpu==2.18.1
# Packages whose declared dependencies must not be installed ([tool.caramel] in pyproject.toml):
# tf-keras would pull the full `tensorflow` over tensorflow-cpu.
NO_DEPS = $(shell $(PYTHON) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['tool']['caramel']['install-without-dependencies'])")
HOROVOD_VERSION := 0.28.1
# Horovod ships only as source and compiles against one TensorFlow ABI, so its wheel is cached
# per Horovod and TensorFlow version, outside the clone: a fresh clone reuses it. pip's own
# wheel cache is bypassed because it would not tell TensorFlow versions apart.
WHEEL_CACHE ?= $(HOME)/.cache/caramel/horovod-$(HOROVOD_VERSION)-tf2.18.1-cp311
HOROVOD_BUILD_ENV := HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j$(shell nproc)
PYTEST_ARGS ?=

.PHONY: setup test test-fast crd clean bench bench-zoo bench-topology bench-needs-root

# The CRD is generated from the API models; tests fail when a committed copy drifts.
CRD_COPIES := manifests/crd.yaml helm/caramel/files/crd.yaml

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: pyproject.toml Makefile scripts/install-k8s-tools.sh
	@command -v cmake >/dev/null || { echo "cmake is needed to build Horovod: apt-get install cmake"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV_PYTHON) -m pip install --quiet --upgrade pip setuptools wheel
	@# kubectl and helm, for the chart tests and the kind end-to-end script; cached like Horovod.
	@bash scripts/install-k8s-tools.sh $(VENV)
	@echo "--- installing TensorFlow (CPU)"
	$(VENV_PYTHON) -m pip install --quiet $(TENSORFLOW)
	@if ls $(WHEEL_CACHE)/horovod-*.whl >/dev/null 2>&1; then \
		echo "--- using the cached Horovod wheel in $(WHEEL_CACHE)"; \
	else \
		echo "--- building Horovod $(HOROVOD_VERSION) with Gloo (takes 2-5 minutes, once)"; \
		$(HOROVOD_BUILD_ENV) $(VENV_PYTHON) -m pip wheel --no-build-isolation --no-deps --no-cache-dir \
			--wheel-dir $(WHEEL_CACHE) horovod==$(HOROVOD_VERSION); \
	fi
	$(VENV_PYTHON) -m pip install --quiet $(WHEEL_CACHE)/horovod-*.whl
	@echo "--- installing Caramel"
	$(VENV_PYTHON) -m pip install --quiet -e '.[test]'
	$(VENV_PYTHON) -m pip install --quiet --no-deps $(NO_DEPS)
	@# An earlier set-up installed tensorflow beside tensorflow-cpu; both write the same files,
	@# so removing one breaks the other: remove it, then reinstall tensorflow-cpu whole.
	@if $(VENV_PYTHON) -m pip show --quiet tensorflow >/dev/null 2>&1; then \
		echo "--- removing the second TensorFlow (tensorflow) beside tensorflow-cpu"; \
		$(VENV_PYTHON) -m pip uninstall --quiet -y tensorflow; \
		$(VENV_PYTHON) -m pip install --quiet --force-reinstall --no-deps $(TENSORFLOW); \
	fi
	TF_CPP_MIN_LOG_LEVEL=3 $(VENV_PYTHON) -c "import horovod.tensorflow, caramel.job.api"
	$(VENV_PYTHON) -m caramel.job.one_tensorflow
	@touch $@
	@echo "--- set-up done: activate with 'source $(VENV)/bin/activate'"

test: setup
	$(VENV_PYTHON) -m pytest $(PYTEST_ARGS)

# Unit tests only, without the end-to-end runs of real workers.
test-fast: setup
	$(VENV_PYTHON) -m pytest -m 'not e2e' $(PYTEST_ARGS)

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

bench-needs-root:
	@[ "$$(id -u)" = 0 ] || { echo "make bench needs root: it creates network namespaces, veths, a bridge, tc qdiscs and an iptables rule (try: sudo make bench)" >&2; exit 1; }

# matplotlib, for the benchmark's plot (the bench extra of pyproject.toml).
$(VENV)/.bench-done: $(VENV)/.setup-done pyproject.toml
	$(VENV_PYTHON) -m pip install --quiet -e '.[test,bench]'
	@touch $@

crd: setup
	@for copy in $(CRD_COPIES); do mkdir -p $$(dirname $$copy); $(VENV_PYTHON) -m caramel_operator.crd > $$copy; echo "wrote $$copy"; done

clean:
	rm -rf $(VENV) build *.egg-info runtime/*.egg-info
