# versitygw (Apache-2.0), the S3 server of the integration and fault tiers
# (tests/fixtures/s3server.py), built from its pinned Go module (hack/versitygw/go.mod) into
# .cache/bin like helm and Toxiproxy. It serves a posix directory in the test session's tmp.
#   make versitygw   .cache/bin/versitygw
VERSITYGW_DIR := hack/versitygw
VERSITYGW_BIN := $(CACHE)/bin/versitygw
VERSITYGW_VERSION = $(shell cd $(VERSITYGW_DIR) && go list -m -f '{{.Version}}' github.com/versity/versitygw)

.PHONY: versitygw
versitygw: $(VERSITYGW_BIN)

$(VERSITYGW_BIN): $(VERSITYGW_DIR)/go.mod $(VERSITYGW_DIR)/go.sum
	@mkdir -p $(@D)
	cd $(VERSITYGW_DIR) && CGO_ENABLED=0 go build -trimpath \
		-ldflags='-s -w -X main.Version=$(VERSITYGW_VERSION)' -o $@ \
		github.com/versity/versitygw/cmd/versitygw

# The unit tier needs no S3 server; the integration and fault tiers do.
TEST_PREREQS += versitygw
