# The runtime's container image, built without any daemon (deploy/dev/image/README.md).
# Included by the top-level Makefile (through deploy/install.mk); paths are relative to the
# repository root.
#
#   make image                        # -> $(KUBEWASM_CACHE)/images/kubewasm.tar
#   make image KUBEWASM_IMAGE=registry.example/kubewasm:1.2
#   docker load -i "$(make -s image-path)"   # or podman load, kind load image-archive, ctr import

KUBEWASM_CACHE ?= $(HOME)/.cache/kubewasm
CARGO ?= cargo
KUBEWASM_IMAGE ?= kubewasm/runtime:dev
IMAGE_TARGET ?= x86_64-unknown-linux-musl
IMAGE_DIR ?= $(KUBEWASM_CACHE)/images
IMAGE_TAR ?= $(IMAGE_DIR)/kubewasm.tar
# cargo's target directory for the image's build: outside the clone, so that a machine that
# keeps $(KUBEWASM_CACHE) rebuilds only what changed (a cold musl release build takes minutes).
IMAGE_TARGET_DIR ?= $(KUBEWASM_CACHE)/image-target
# A prefix for cargo's build, e.g. IMAGE_NICE="nice -n 10" on a shared machine.
IMAGE_NICE ?=
# More cargo flags, e.g. IMAGE_CARGO_FLAGS=--locked in CI (the Dockerfile builds --locked; here
# the lock file is treated as `make build` treats it).
IMAGE_CARGO_FLAGS ?=

.PHONY: image image-toolchain image-path image-size

## The musl target, and musl-gcc: ring and wasmtime compile C and assembly for the target, and
## cc-rs looks for x86_64-linux-musl-gcc or musl-gcc (Debian's musl-tools), not the host gcc.
image-toolchain:
	@rustup target list --installed | grep -qx $(IMAGE_TARGET) || rustup target add $(IMAGE_TARGET)
	@command -v musl-gcc >/dev/null || { \
		echo "image: installing musl-tools (musl-gcc)"; \
		root=; [ "$$(id -u)" -eq 0 ] || root=sudo; \
		$$root apt-get -o DPkg::Lock::Timeout=300 update -qq && \
		$$root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 \
			install -y -qq --no-install-recommends musl-tools; }

## The image as a docker-archive that is also an OCI layout (one tarball); prints its path.
image: image-toolchain
	$(IMAGE_NICE) $(CARGO) build --release $(IMAGE_CARGO_FLAGS) --target $(IMAGE_TARGET) --target-dir $(IMAGE_TARGET_DIR) -p kubewasm --bin kubewasm
	@mkdir -p $(IMAGE_DIR)
	strip -o $(IMAGE_DIR)/kubewasm $(IMAGE_TARGET_DIR)/$(IMAGE_TARGET)/release/kubewasm
	@SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || echo 0) \
		python3 deploy/dev/image/write-image.py --binary $(IMAGE_DIR)/kubewasm \
		--tag $(KUBEWASM_IMAGE) --out $(IMAGE_TAR) \
		--arch $(if $(filter aarch64-%,$(IMAGE_TARGET)),arm64,amd64) \
		--revision "$$(git rev-parse HEAD 2>/dev/null)"
	@echo $(IMAGE_TAR)

image-path:
	@echo $(IMAGE_TAR)

## The binary's and the image's sizes (deploy/dev/image/README.md quotes them).
image-size: image
	@printf '%-40s %12s bytes\n' "binary (stripped) $(notdir $(IMAGE_DIR))/kubewasm" "$$(stat -c %s $(IMAGE_DIR)/kubewasm)"
	@printf '%-40s %12s bytes\n' "image tarball $(notdir $(IMAGE_TAR))" "$$(stat -c %s $(IMAGE_TAR))"
	@printf '%-40s %12s bytes\n' "image tarball, gzip -9" "$$(gzip -9c $(IMAGE_TAR) | wc -c)"
