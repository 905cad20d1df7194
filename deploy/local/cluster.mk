# The local Kubernetes control plane (see deploy/local/README.md).
# Included by the top Makefile: `include deploy/local/cluster.mk`.
#
#   make k8s-binaries     install what is missing, build and cache kube-apiserver and
#                         kube-controller-manager v1.20.2 (once; minutes cold, instant warm)
#   make cluster-up       start a control plane; the last line is `export KUBECONFIG=...`,
#                         so `eval "$(make -s cluster-up)"` points kubectl at it
#   make cluster-down     stop it
#
# CLUSTER_DIR chooses the state directory (default: $KUBEWASM_CACHE/clusters/default).

CLUSTER_SH ?= $(CURDIR)/deploy/local/cluster.sh
CLUSTER_DIR ?=

.PHONY: k8s-binaries cluster-up cluster-down cluster-env cluster-status

k8s-binaries:
	@bash $(CLUSTER_SH) install
	@bash $(CLUSTER_SH) build

cluster-up:
	@bash $(CLUSTER_SH) up $(CLUSTER_DIR)

cluster-down:
	@bash $(CLUSTER_SH) down $(CLUSTER_DIR)

cluster-env:
	@bash $(CLUSTER_SH) env $(CLUSTER_DIR)

cluster-status:
	@bash $(CLUSTER_SH) status $(CLUSTER_DIR)
