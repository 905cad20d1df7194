# The local Kubernetes cluster (see deploy/dev/local/README.md).
# Included by the top Makefile: `include deploy/dev/local/cluster.mk`.
#
#   make k8s-binaries     install what is missing, build and cache kube-apiserver,
#                         kube-controller-manager, kube-scheduler, the kubelet v1.20.2 and the
#                         static pause (once; minutes cold, instant warm)
#   make cluster-up       start a control plane; the last line is `export KUBECONFIG=...`,
#                         so `eval "$(make -s cluster-up)"` points kubectl at it
#   make node-up          the same with a node (root; one per machine): Pods run
#   make cluster-down     stop it (with its node, if it has one)
#   make node-images      build (once) the pause and busybox images; print their paths
#   make image-push IMAGE=archive.tar NAME=repo[:tag]
#                         put a docker-save or OCI archive into the node's local registry
#   make node-smoke       up --node, a Pod, a Deployment, down, nothing left (twice: NODE_SMOKE_RUNS)
#
# CLUSTER_DIR chooses the state directory (the top Makefile's default is one per checkout,
# $KUBEWASM_CACHE/clusters/default-<hash of the checkout's path>).

CLUSTER_SH ?= $(CURDIR)/deploy/dev/local/cluster.sh
NODE_SMOKE_SH ?= $(CURDIR)/deploy/dev/local/node-smoke.sh
CLUSTER_DIR ?= $(KUBEWASM_CACHE)/clusters/default
NODE_SMOKE_RUNS ?= 2

.PHONY: k8s-binaries cluster-up node-up cluster-down cluster-env cluster-status node-images image-push node-smoke

k8s-binaries:
	@bash $(CLUSTER_SH) install
	@bash $(CLUSTER_SH) build

cluster-up:
	@bash $(CLUSTER_SH) up $(CLUSTER_DIR)

node-up:
	@bash $(CLUSTER_SH) up --node $(CLUSTER_DIR)

cluster-down:
	@bash $(CLUSTER_SH) down $(CLUSTER_DIR)

cluster-env:
	@bash $(CLUSTER_SH) env $(CLUSTER_DIR)

cluster-status:
	@bash $(CLUSTER_SH) status $(CLUSTER_DIR)

node-images:
	@bash $(CLUSTER_SH) images

image-push:
	@test -n "$(IMAGE)" -a -n "$(NAME)" || { echo "usage: make image-push IMAGE=archive.tar NAME=repo[:tag]" >&2; exit 2; }
	@bash $(CLUSTER_SH) image-push "$(IMAGE)" "$(NAME)"

node-smoke:
	@bash $(NODE_SMOKE_SH) $(NODE_SMOKE_RUNS)
