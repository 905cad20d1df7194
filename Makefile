# kubewasm — the two commands that matter: `make demo` and `make test`.
# Everything they need (the wasm target, Debian packages, the Kubernetes binaries) is
# installed by the targets themselves.

SHELL := /bin/bash
CARGO ?= cargo
export KUBEWASM_CACHE ?= $(HOME)/.cache/kubewasm
# Where cargo builds: $CARGO_TARGET_DIR when set (a warm or shared target directory), else ./target.
TARGET_DIR := $(abspath $(or $(CARGO_TARGET_DIR),target))
GUEST_DIR := $(TARGET_DIR)/wasm32-wasip2/guest
GUESTS := hello-world configmap-restarter guitar-reviewer pod-watcher hello-finalizer hostile intruder prepared
GUEST_WASM := $(GUEST_DIR)/hello_world.wasm $(GUEST_DIR)/configmap_restarter.wasm $(GUEST_DIR)/guitar_reviewer.wasm $(GUEST_DIR)/pod_watcher.wasm $(GUEST_DIR)/hello_finalizer.wasm $(GUEST_DIR)/hostile.wasm $(GUEST_DIR)/intruder.wasm $(GUEST_DIR)/prepared.wasm
export KUBEWASM_GUEST_DIR := $(GUEST_DIR)
# Guests built without WASI too (docs/03-writing-a-controller.md, "Guests without WASI"):
# wasm32-unknown-unknown, made a component by the toolchain's wasm-component-ld
# (.cargo/config.toml).
# Every shipped guest needs neither a clock nor stdio, so each is shipped built this way (the
# demo and the examples load these); the hostile test guest is built both ways (some of its
# attacks need WASI). The Python guests need WASI (componentize-py's interpreter).
NO_WASI_GUESTS := hello-world configmap-restarter guitar-reviewer pod-watcher hello-finalizer hostile
export KUBEWASM_GUEST_DIR_NO_WASI := $(TARGET_DIR)/wasm32-unknown-unknown/guest
# The debug kubewasm binary the demo scripts run (deploy/dev/demo/*.sh read $KUBEWASM).
export KUBEWASM ?= $(TARGET_DIR)/debug/kubewasm
# This checkout's own clusters: `make up`/`make down` and `make cluster-up`/`cluster-down`
# address state directories named after the checkout, so they never stop a cluster another
# checkout (or another engineer sharing the cache) started. `CLUSTER_DIR=...` names another.
CHECKOUT_ID := $(shell printf '%s' '$(CURDIR)' | sha256sum | cut -c1-8)
export KUBEWASM_DEMO_DIR ?= $(KUBEWASM_CACHE)/clusters/demo-$(CHECKOUT_ID)
CLUSTER_DIR ?= $(or $(KUBEWASM_CLUSTER_DIR),$(KUBEWASM_CACHE)/clusters/default-$(CHECKOUT_ID))

include deploy/dev/local/cluster.mk
include deploy/install.mk

.PHONY: all test demo demo-offline variant-guests up down toolchain guests build lint file-sizes layers fmt unit-test integration-test bench bench-reconcile bench-storm bench-cluster bench-cluster-venv bench-density bench-python bench-cache bench-compile bench-restart bench-fairness bench-shadow bench-ahead crds guest-sizes guest-size-typed

all: build guests

## Toolchain: the pinned Rust (rust-toolchain.toml) with the wasm32-wasip2 target, and
## wasm32-unknown-unknown for guests without WASI.
toolchain:
	@for t in wasm32-wasip2 wasm32-unknown-unknown; do \
	  rustup target list --installed | grep -qx $$t || rustup target add $$t || exit 1; done

build: toolchain
	$(CARGO) build --bins

## Guests are built from source, never committed.
guests: toolchain python-guests variant-guests
	$(CARGO) build --profile guest --target wasm32-wasip2 $(addprefix -p ,$(GUESTS))
	$(CARGO) build --profile guest --target wasm32-unknown-unknown $(addprefix -p ,$(NO_WASI_GUESTS))

## Two guests built again with a build-time setting, into a target directory of their own (the
## setting is part of a crate's fingerprint: in the shared one, each build would undo the other):
## the HelloWorld greeting `Howdy` (make demo's second module; the shadow-rollout test's
## candidate) and the restarter keeping only its selector's first requirement (the risky
## candidate of the shadow-rollout test). runtime/test-support/src/guests.rs builds the same.
VARIANT_DIR := $(TARGET_DIR)/variants
variant-guests: toolchain
	HELLO_WORLD_GREETING=Howdy CONFIGMAP_RESTARTER_WIDEN=1 $(CARGO) build --profile guest --target wasm32-wasip2 --target wasm32-unknown-unknown --target-dir $(VARIANT_DIR) -p hello-world -p configmap-restarter
	@mkdir -p $(KUBEWASM_GUEST_DIR_NO_WASI) && cp $(VARIANT_DIR)/wasm32-unknown-unknown/guest/hello_world.wasm $(KUBEWASM_GUEST_DIR_NO_WASI)/hello_world_howdy.wasm
	@mkdir -p $(GUEST_DIR) && cp $(VARIANT_DIR)/wasm32-wasip2/guest/hello_world.wasm $(GUEST_DIR)/hello_world_howdy.wasm \
		&& cp $(VARIANT_DIR)/wasm32-wasip2/guest/configmap_restarter.wasm $(GUEST_DIR)/configmap_restarter_wide.wasm

## Python guests (issue 25): guest-sdk/python/build.sh builds each with componentize-py, pinned
## there and installed into $(KUBEWASM_CACHE)/python/<version>/ on first use.
PYTHON_GUESTS := python-hello-world python-configmap-restarter
PYTHON_GUEST_WASM := $(foreach g,$(PYTHON_GUESTS),$(GUEST_DIR)/$(subst -,_,$(g)).wasm)
PYTHON_SDK := guest-sdk/python/build.sh guest-sdk/wit/kubewasm.wit $(wildcard guest-sdk/python/kubewasm/*.py)

.PHONY: python-guests python-test
python-guests: $(PYTHON_GUEST_WASM)

## componentize-py does not build incrementally (15 s a guest): a guest is built again only when
## its sources, the SDK or the WIT changed.
define python-guest
$(GUEST_DIR)/$(subst -,_,$(1)).wasm: $(PYTHON_SDK) $(wildcard guests/$(1)/*.py) guests/$(1)/pyproject.toml
	guest-sdk/python/build.sh guests/$(1) $$@
endef
$(foreach g,$(PYTHON_GUESTS),$(eval $(call python-guest,$(g))))

## pytest for the Python SDK and every guests/python-* (natively, no wasm).
python-test:
	guest-sdk/python/build.sh test -q

guest-sizes: guests
	@for f in $(GUEST_WASM) $(foreach g,$(NO_WASI_GUESTS),$(KUBEWASM_GUEST_DIR_NO_WASI)/$(subst -,_,$(g)).wasm); do \
	  printf '%-45s %8d bytes\n' $$f $$(stat -c %s $$f); done

## What k8s-openapi types cost a guest: one controller written with JSON, with the parent typed
## (ConfigMap) and with every object typed (ConfigMap, Pods) — guest-sdk/examples/.
guest-size-typed: toolchain
	$(CARGO) build --profile guest --target wasm32-wasip2 -p kubewasm-guest-sdk --example untyped --example typed_configmap --example typed
	@dir=$${CARGO_TARGET_DIR:-target}/wasm32-wasip2/guest/examples; base=$$(stat -c %s $$dir/untyped.wasm); \
	for e in untyped typed_configmap typed; do \
	  size=$$(stat -c %s $$dir/$$e.wasm); gz=$$(gzip -9c $$dir/$$e.wasm | wc -c); \
	  awk -v e=$$e -v s=$$size -v b=$$base -v g=$$gz 'BEGIN { printf "%-16s %9d bytes  %4.1fx   gzip -9 %8d bytes\n", e, s, s / b, g }'; \
	done

fmt:
	$(CARGO) fmt --all

# Every test tier, offline, cluster and node (runtime/Cargo.toml's features): what `make test`
# runs and lints.
ALL_TIERS := --features kubewasm/node-tests

lint: toolchain file-sizes layers
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets $(ALL_TIERS) -- -D warnings
	$(CARGO) clippy --target wasm32-wasip2 $(addprefix -p ,$(GUESTS)) -- -D warnings
	$(CARGO) clippy --target wasm32-unknown-unknown $(addprefix -p ,$(NO_WASI_GUESTS)) -p kubewasm-guest-alloc -- -D warnings

## The floors' dependencies point one way: the API types build without the engine or a
## client (a webhook or a tool may use them), the sandbox knows no Kubernetes, module
## sources know nothing of the runtime (controllers, host, manager, metrics) above them. (The
## runtime cannot depend on the command that runs it: cargo refuses the cycle.)
layers:
	@bad=$$($(CARGO) tree -p kubewasm-api -e normal --prefix none | awk '{print $$1}' | grep -xE 'wasmtime|kubewasm-sandbox|kube-client|tokio|kubewasm' | sort -u | tr '\n' ' '); \
	if [ -n "$$bad" ]; then echo "kubewasm-api (runtime/api) depends on: $$bad; the API types must build without them"; exit 1; fi
	@bad=$$($(CARGO) tree -p kubewasm-sandbox -e normal --prefix none | awk '{print $$1}' | grep -xE 'kube|kube-core|kube-client|k8s-openapi|kubewasm-api|kubewasm' | sort -u | tr '\n' ' '); \
	if [ -n "$$bad" ]; then echo "kubewasm-sandbox (runtime/sandbox) depends on: $$bad; the sandbox must know no Kubernetes"; exit 1; fi
	@bad=$$($(CARGO) tree -p kubewasm-sources -e normal --prefix none | awk '{print $$1}' | grep -xE 'kubewasm|axum|prometheus-client' | sort -u | tr '\n' ' '); \
	if [ -n "$$bad" ]; then echo "kubewasm-sources (runtime/sources) depends on: $$bad; module sources must know nothing of the runtime above them"; exit 1; fi

## No production source file over $(MAX_CODE_LINES) code lines: comments, blank lines and a file's
## test module (from its first `#[cfg(test)]` on) are not counted.
MAX_CODE_LINES := 450
file-sizes:
	@over=$$(find runtime guest-sdk guests -path '*/target' -prune -o -path '*/src/*' -name '*.rs' -print | sort | while read -r f; do \
		n=$$(awk '/^#\[cfg\(test\)\]/{exit} {print}' "$$f" | grep -cvE '^\s*(//|$$)'); \
		[ "$$n" -gt $(MAX_CODE_LINES) ] && echo "  $$f: $$n"; done); \
	if [ -n "$$over" ]; then echo "production files over $(MAX_CODE_LINES) code lines (split them along what they do):"; echo "$$over"; exit 1; fi

## Every test: lint, unit, guest-native, sandbox, CLI, integration against the local control plane.
test: export KUBEWASM_IMAGE_TAR := $(abspath $(IMAGE_TAR))
test: lint guests python-test k8s-binaries image install-files
	$(CARGO) test --workspace $(ALL_TIERS)
	@# The bench still runs (tiny size, debug build); its numbers come from `make bench` only.
	$(CARGO) test -p kubewasm $(ALL_TIERS) --bench reconcile -- 20 >/dev/null
	KUBEWASM_DENSITY_ROUNDS=1 $(CARGO) test -p kubewasm $(ALL_TIERS) --bench density -- 3 >/dev/null
	$(CARGO) test -p kubewasm $(ALL_TIERS) --bench cluster -- tiny >/dev/null
	$(CARGO) test -p kubewasm $(ALL_TIERS) --bench cache_memory -- 3 >/dev/null
	$(CARGO) test -p kubewasm $(ALL_TIERS) --bench compile_cache -- 2 >/dev/null
	KUBEWASM_RESTART_MOVES=1 $(CARGO) test -p kubewasm $(ALL_TIERS) --bench restart -- 2 >/dev/null
	@echo "make test: all tests passed"

## The offline tier only (unit, guests natively, SDK vectors, sandbox, CLI): no cluster, no
## Kubernetes binaries.
unit-test: guests
	$(CARGO) test --workspace

## The cluster tier: the tests against a local control plane (etcd and the locally built API server).
integration-test: guests k8s-binaries
	$(CARGO) test -p kubewasm --features kubewasm/cluster-tests --test control_plane --test live --test shards --test watches

## Every benchmark, P1–P6 (BENCHMARKS.md): one reconcile four ways and epoch on/off, density,
## then the cluster comparisons.
bench: bench-reconcile bench-density bench-cluster

## Restart time for 1 and 100 modules: compiled each time, into an empty cache, from the cache.
bench-compile: guests
	$(CARGO) test -p kubewasm --bench compile_cache -- 1 100

## Restart through the manager (local control plane and registry): time until 1 and 100 modules
## from a registry are Ready on a first start, a restart with both caches, a restart with an empty
## compiled cache; and a moved tag until its new digest runs.
bench-restart: guests k8s-binaries
	$(CARGO) test -p kubewasm --bench restart -- 1 100

## Shadow rollouts: one reconcile alone, with a candidate called after it (as the runtime does)
## and beside it, and the comparison of the two answers; latency and CPU.
bench-shadow: guests
	$(CARGO) bench -p kubewasm --bench reconcile -- shadow

## P1 as the runtime calls a busy controller: instances made ahead against instances made on
## the call's path, the native floor and the Python webhook (latency and CPU per reconcile).
bench-ahead: guests python-guests
	$(CARGO) bench -p kubewasm --bench reconcile -- ahead

## P1 (one reconcile: sandbox, native floor, axum webhook, Python webhook) and P5 (epochs on/off).
bench-reconcile: guests
	$(CARGO) bench -p kubewasm --bench reconcile

## team-b's reconcile latency (p50/p99) without and during team-a's storm, on a local control plane.
bench-storm: guests k8s-binaries
	KUBEWASM_STORM_BASELINE=1 $(CARGO) test -p kubewasm --features kubewasm/cluster-tests --test live storm -- --nocapture 2>&1 \
		| grep -E '^(team-b reconcile latency|runtime peak RSS|runtime log:|test result)'

## team-b's latency idle and while team-a's 20 controllers flood the replica's writes, and
## team-a's write rate alone against the replica's (the fair write scheduler, live).
bench-fairness: guests k8s-binaries
	$(CARGO) test -p kubewasm --features kubewasm/cluster-tests --test live fairness -- --nocapture 2>&1 \
		| grep -E '^(team-b reconcile latency|team-a |test result)'

## P2 (ConfigMap change → Pods deleted: kubewasm, a native kube-rs floor, the tutorial's Python),
## P4 (1,000 HelloWorlds at once: kubewasm vs a raw kube-rs client) and P6 (3,000 HelloWorlds over
## 30 tenants: 1, 2 and 3 replicas vs raw clients) on a local control plane, no node.
## The bench itself runs in the dev profile (the bench profile would rebuild every dependency
## once more); what it measures is the release `kubewasm run`.
bench-cluster: guests k8s-binaries bench-cluster-venv
	$(CARGO) build --release -p kubewasm --bin kubewasm
	KUBEWASM_RUN_BIN=$(TARGET_DIR)/release/kubewasm $(CARGO) test -p kubewasm --bench cluster

## P3: how many WasmControllers one runtime holds: time until N are Ready and its memory
## (local control plane, no node). Like bench-cluster, the bench runs in the dev profile and
## measures the release `kubewasm`.
bench-density: guests k8s-binaries
	$(CARGO) build --release -p kubewasm --bin kubewasm
	KUBEWASM_DENSITY_BINARY=$(TARGET_DIR)/release/kubewasm $(CARGO) test -p kubewasm --bench density

## Python guests (issue 25): the Python HelloWorld beside the Rust one (size, compile with and
## without the compiled cache, phases, one reconcile interleaved with the other ways, memory per
## running instance), then P3 with it: 100 and 1,000 controllers of one module from a registry.
bench-python: guests k8s-binaries
	$(CARGO) bench -p kubewasm --bench reconcile -- 2000 python
	$(CARGO) build --release -p kubewasm --bin kubewasm
	KUBEWASM_DENSITY_EXAMPLE=python-hello-world KUBEWASM_DENSITY_ROUNDS=2 \
		KUBEWASM_DENSITY_BINARY=$(TARGET_DIR)/release/kubewasm $(CARGO) test -p kubewasm --bench density -- 100 1000

## Memory the runtime holds per byte a namespace's cache account is charged (the memory budget
## of docs/06-security-model.md).
## Allocations are counted, not timed: the dev profile measures the same as a release build.
bench-cache:
	$(CARGO) test -p kubewasm --bench cache_memory -- 1000

## The tutorial's Python controller needs the official `kubernetes` client: a venv in the cache.
bench-cluster-venv:
	@$(KUBEWASM_CACHE)/py/bin/python -c 'import kubernetes' 2>/dev/null || \
		{ python3 -m venv $(KUBEWASM_CACHE)/py && $(KUBEWASM_CACHE)/py/bin/pip install -q 'kubernetes==37.0.2'; }

crds:
	$(CARGO) run -q --bin kubewasm -- crds > deploy/crds/kubewasm.dev.yaml

## The main job: a local control plane, a module registry, the runtime, the tutorials step by
## step (one of them pushed to the registry and run from spec.module.image), then stop.
demo: guests build k8s-binaries
	@bash deploy/dev/demo/live.sh

## What each controller would do, offline (no cluster).
demo-offline: guests build
	@bash deploy/dev/demo/offline.sh

## Like demo, but leave the control plane and the runtime running for kubectl; `make down` stops.
up: guests build k8s-binaries
	@bash deploy/dev/demo/live.sh --keep

down:
	@pid=$$(cat '$(KUBEWASM_DEMO_DIR)/kubewasm.pid' 2>/dev/null); \
	if [ -n "$$pid" ] && tr '\0' ' ' </proc/$$pid/cmdline 2>/dev/null | grep -q 'kubewasm run'; then kill $$pid; fi; \
	rm -f '$(KUBEWASM_DEMO_DIR)/kubewasm.pid'; \
	pid=$$(cat '$(KUBEWASM_DEMO_DIR)/registry.pid' 2>/dev/null); \
	if [ -n "$$pid" ] && tr '\0' ' ' </proc/$$pid/cmdline 2>/dev/null | grep -q 'docker-registry serve'; then kill $$pid; fi; \
	rm -rf '$(KUBEWASM_DEMO_DIR)/registry.pid' '$(KUBEWASM_DEMO_DIR)/registry'; \
	bash deploy/dev/local/cluster.sh down '$(KUBEWASM_DEMO_DIR)'
