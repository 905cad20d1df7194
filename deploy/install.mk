# Installing kubewasm into a cluster with kustomize: `kubectl apply -k deploy/` (the runtime)
# and `kubectl apply -k deploy/overlays/tutorials` (plus both tutorial guests).
# Included by the top-level Makefile: `include deploy/install.mk` (it includes the image's
# targets too). Paths are relative to the repository root.
#
#   make image           the runtime image as a tarball (deploy/dev/image/image.mk)
#   make install-files   the files deploy/overlays/tutorials needs, from freshly built guests
#   make install-check   every kustomization renders (no cluster needed)

include deploy/dev/image/image.mk

# The tutorial guests as shipped: built without WASI (they need neither a clock nor stdio).
SHIPPED_GUEST_DIR ?= $(or $(KUBEWASM_GUEST_DIR_NO_WASI),target/wasm32-unknown-unknown/guest)
TUTORIALS_GENERATED := deploy/overlays/tutorials/generated

.PHONY: install-files install-check

## The tutorials overlay's generated/ directory (never committed): the guests' modules, gzipped
## (the runtime gunzips ConfigMap modules; gzipped they fit kubectl's last-applied annotation),
## and copies of the CRDs and the examples' manifests (kustomize reads no file outside the
## overlay's directory).
install-files: guests
	@rm -rf $(TUTORIALS_GENERATED)
	@mkdir -p $(TUTORIALS_GENERATED)/crds $(TUTORIALS_GENERATED)/hello-world $(TUTORIALS_GENERATED)/configmap-restarter
	cp deploy/crds/kubewasm.dev.yaml $(TUTORIALS_GENERATED)/crds/
	gzip -9n < $(SHIPPED_GUEST_DIR)/hello_world.wasm > $(TUTORIALS_GENERATED)/hello_world.wasm.gz
	gzip -9n < $(SHIPPED_GUEST_DIR)/configmap_restarter.wasm > $(TUTORIALS_GENERATED)/configmap_restarter.wasm.gz
	cp deploy/examples/hello-world/crd.yaml deploy/examples/hello-world/rbac.yaml \
		deploy/examples/hello-world/controller.yaml $(TUTORIALS_GENERATED)/hello-world/
	cp deploy/examples/configmap-restarter/rbac.yaml deploy/examples/configmap-restarter/controller.yaml \
		$(TUTORIALS_GENERATED)/configmap-restarter/
	@echo "install-files: $(TUTORIALS_GENERATED) ready; kubectl apply -k deploy/overlays/tutorials"

install-check: install-files
	kubectl kustomize deploy/ >/dev/null
	kubectl kustomize deploy/overlays/tutorials >/dev/null
	kubectl kustomize deploy/overlays/verify-keys >/dev/null
	@echo "install-check: deploy/ and deploy/overlays/{tutorials,verify-keys} render"
