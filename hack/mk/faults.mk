# The fault-injection suite (tests/faults, docs/reliability.md): Toxiproxy, built from its pinned
# Go module (hack/toxiproxy/go.mod) into .cache/bin like the control plane, sits between the
# components and the S3 server; the suite injects store faults and kills components mid-batch
# and checks the invariants after every iteration.
#   make toxiproxy   .cache/bin/toxiproxy-server
#   make faults      the fault suite with its default (short) sweep, as `make test` runs it
#   make soak        the long sweeps: LLMBATCH_FAULT_ITERATIONS (default 200) store/crash faults on
#                    the suite's stack, LLMBATCH_CRASH_ITERATIONS (default 50) crashes on the stack
#                    `llmbatch dev up` starts and as many on the chart install,
#                    LLMBATCH_BLAST_ITERATIONS (default 30) faults of one tenant on a shared slot
TOXIPROXY_DIR := hack/toxiproxy
TOXIPROXY_BIN := $(CACHE)/bin/toxiproxy-server
SOAK_ITERATIONS ?= 200
CRASH_SOAK_ITERATIONS ?= 50
BLAST_SOAK_ITERATIONS ?= 30

.PHONY: toxiproxy faults soak
toxiproxy: $(TOXIPROXY_BIN)

$(TOXIPROXY_BIN): $(TOXIPROXY_DIR)/go.mod $(TOXIPROXY_DIR)/go.sum
	@mkdir -p $(@D)
	cd $(TOXIPROXY_DIR) && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o $@ \
		github.com/Shopify/toxiproxy/v2/cmd/server

TEST_PREREQS += toxiproxy

# $$(TEST_PREREQS): expanded when make runs, not here, so the prerequisites that the .mk files
# read after this one append (the control plane, versitygw...) are built too.
.SECONDEXPANSION:
faults: $$(TEST_PREREQS)
	$(BIN)/pytest tests/faults $(PYTEST_ARGS)

soak: $$(TEST_PREREQS)
	LLMBATCH_FAULT_ITERATIONS=$(SOAK_ITERATIONS) LLMBATCH_CRASH_ITERATIONS=$(CRASH_SOAK_ITERATIONS) \
		LLMBATCH_BLAST_ITERATIONS=$(BLAST_SOAK_ITERATIONS) $(BIN)/pytest tests/faults -x $(PYTEST_ARGS)

# The crash sweeps alone (docs/reliability.md): on the stack `llmbatch dev up` starts and on the
# chart install.
#   LLMBATCH_CRASH_SEED=… LLMBATCH_CRASH_ITERATIONS=… LLMBATCH_CRASH_VICTIMS=… make crash-sweep
CRASH_SWEEPS ?= tests/faults/test_devstack_sweep.py tests/faults/test_chart_sweep.py
.PHONY: crash-sweep
crash-sweep: $$(TEST_PREREQS)
	$(BIN)/pytest $(CRASH_SWEEPS) -s $(PYTEST_ARGS)
