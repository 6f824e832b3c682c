# Tessera's build. Two entry points for a fresh machine:
#   make simulate   - install into .venv and run `tessera simulate` on the bundled default cluster
#   make test       - install into .venv (with dev tools) and run the whole test suite
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: simulate test lint venv clean native native-test kube helm go-tools image protos node-deps prometheus fuzz chaos schemas demo demo-down

# The enforcement library (C) is built first and copied into the package
# (src/tessera/enforcement/lib/), so it is installed with it.
native:
	$(MAKE) -C native package

# The modules setup.py compiles with mypyc (compiled-modules.txt): the install is redone (about a
# minute) when one of them changes, so the compiled .so beside each is never older than its source.
COMPILED := $(shell sed -e 's/\#.*//' compiled-modules.txt)

$(STAMP): pyproject.toml setup.py compiled-modules.txt $(COMPILED)
	$(MAKE) native
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP) protos

# The kubelet plugin APIs (registration, DRA) as Python gRPC stubs, generated from the .proto
# files of k8s.io/kubelet at the version in tools/kube/go.mod (fetched with `go mod download`)
# into src/tessera/driver/_generated/ (git-ignored). Cached: a no-op when nothing changed.
protos: $(STAMP)
	$(BIN)/python -m tessera.driver.protos

simulate: $(STAMP)
	$(BIN)/tessera simulate

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench tools
	$(BIN)/mypy
	$(BIN)/lint-imports

# The real control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
# kubectl), a real node (kubelet, containerd, containerd-shim-runc-v2, ctr) and the
# upstream-allocator harness, compiled from the Go module proxy into tools/kube/bin/
# (cached: a no-op when nothing changed; ~30 min on 2 cores the first time, docs/cluster.md).
kube:
	tools/kube/build.sh

# helm (helm.sh/helm/v4, pinned in tools/helm/go.mod) from the Go module proxy into
# tools/helm/bin/helm: the chart tests lint, render, install and uninstall deploy/helm/tessera
# with it (cached like kube; under 8 CPU-minutes cold, 15 min on a busy machine: tools/helm/README.md).
helm:
	tools/helm/build.sh

# Both Go tool builds side by side: the Kubernetes build keeps about one of two cores busy
# (docs/cluster.md), helm's build takes the other.
go-tools:
	$(MAKE) -j2 kube helm

# The image of every entry point (deploy/images/Dockerfile; docs/install.md "Building the
# image"), built with buildah, no Docker daemon and no registry (tools/image/README.md):
# installs buildah, runc and mmdebstrap from Debian (tools/image/install.sh), makes a Debian
# bookworm base from Debian's packages once (BASE=upstream: the Dockerfile's pinned
# debian:bookworm-slim instead), and writes build/image/tessera-<version>.oci.tar for
# `ctr images import`. A no-op (seconds) when none of its inputs changed.
IMAGE ?= tessera.local/tessera:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
BASE  ?= local
image: protos
	IMAGE=$(IMAGE) BASE=$(BASE) tools/image/build.sh

# Try Tessera on this machine (root): a local cluster with this machine as a real node, 8 fake
# H100 GPUs, Tessera installed by its chart from the image, a HAMi pod and a DRA pod; prints what
# each container sees. `make demo-down` stops it and restores the host (README, quick start).
DEMO_DIR ?= $(HOME)/.cache/tessera/demo
demo: $(STAMP) protos go-tools node-deps image
	$(BIN)/tessera cluster demo --state-dir $(DEMO_DIR)

demo-down: $(STAMP)
	$(BIN)/tessera cluster down --state-dir $(DEMO_DIR)

# Debian packages a real node (`tessera cluster up --kubelet`, the `node` tests) needs:
# runc, containernetworking-plugins, busybox-static, iproute2. Installed with apt-get when
# root and missing; a no-op (one dpkg-query) otherwise.
node-deps:
	tools/kube/node-deps.sh

# Debian's prometheus package: the real server the monitor tests scrape with (idempotent).
prometheus:
	tools/prometheus/install.sh

test: $(STAMP) native protos go-tools node-deps prometheus
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench tools
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q --timeout=900 --timeout-method=signal

# The fuzz campaign at ten times the CI size (tests/fuzz: 2,000 mutants of every input kind).
fuzz: $(STAMP)
	TESSERA_FUZZ_MUTANTS=$${TESSERA_FUZZ_MUTANTS:-2000} $(BIN)/python -m pytest -q -m fuzz tests/fuzz

# The chaos campaign on the real node (tests/e2e/test_chaos.py) at 40 steps instead of CI's 6:
# root, the node's turn held (another session may need the node), about 20 min on 2 cores.
chaos: $(STAMP) native protos go-tools node-deps
	TESSERA_CHAOS_STEPS=$${TESSERA_CHAOS_STEPS:-40} flock /tmp/tessera-node-turn.lock \
		$(BIN)/python -m pytest -q -s -m chaos tests/e2e/test_chaos.py

# Regenerate src/tessera/api/schemas/kubernetes.json from the control plane `make kube` builds
# (after a Kubernetes version bump in tools/kube).
schemas: $(STAMP) kube
	$(BIN)/python tools/openapi/generate.py

native-test: $(STAMP) native
	$(BIN)/python -m pytest -q -m native tests/native

clean:
	rm -rf $(VENV) build native/build src/tessera/enforcement/lib src/tessera/driver/_generated .pytest_cache .mypy_cache .ruff_cache
	find src -name '*.cpython-*.so' -delete
