# The local Kubernetes control plane (hack/testcluster) and a matching kubectl, built from the
# pinned k8s.io/kubernetes module with the machine's Go (k8s v1.37.2 needs go >= 1.26.0, so no
# toolchain download). See docs/devcluster.md.
#   make testcluster   .cache/bin/testcluster   (etcd + apiserver + controller-manager + scheduler)
#   make kubectl       .cache/bin/kubectl
#   make dev-up / dev-down / dev-status
TESTCLUSTER_DIR := hack/testcluster
TESTCLUSTER_BIN := $(CACHE)/bin/testcluster
KUBECTL_BIN := $(CACHE)/bin/kubectl
TESTCLUSTER_SRCS := $(TESTCLUSTER_DIR)/go.mod $(TESTCLUSTER_DIR)/go.sum $(wildcard $(TESTCLUSTER_DIR)/*.go) \
	hack/mk/testcluster.mk
# -trimpath and a stripped link keep the link step's time and memory down. The version variables
# are what a release build sets (hack/lib/version.sh upstream): the API server's /version, which
# helm checks against a chart's kubeVersion, and kubectl's client version.
K8S_VERSION = $(shell cd $(TESTCLUSTER_DIR) && go list -m -f '{{.Version}}' k8s.io/kubernetes)
K8S_VERSION_LDFLAGS = $(foreach pkg,k8s.io/component-base/version k8s.io/client-go/pkg/version,\
	-X $(pkg).gitVersion=$(K8S_VERSION) \
	-X $(pkg).gitMajor=$(word 1,$(subst ., ,$(K8S_VERSION:v%=%))) \
	-X $(pkg).gitMinor=$(word 2,$(subst ., ,$(K8S_VERSION:v%=%))) \
	-X $(pkg).gitTreeState=clean)
GO_BUILD = go build -trimpath -ldflags='-s -w $(K8S_VERSION_LDFLAGS)'

.PHONY: testcluster kubectl dev-up dev-down dev-status
testcluster: $(TESTCLUSTER_BIN)
kubectl: $(KUBECTL_BIN)

$(TESTCLUSTER_BIN): $(TESTCLUSTER_SRCS)
	@mkdir -p $(@D)
	cd $(TESTCLUSTER_DIR) && $(GO_BUILD) -o $@ .

$(KUBECTL_BIN): $(TESTCLUSTER_DIR)/go.mod $(TESTCLUSTER_DIR)/go.sum hack/mk/testcluster.mk
	@mkdir -p $(@D)
	cd $(TESTCLUSTER_DIR) && $(GO_BUILD) -o $@ k8s.io/kubernetes/cmd/kubectl

dev-up: venv testcluster kubectl
	$(BIN)/llmbatch dev up

dev-down: venv
	$(BIN)/llmbatch dev down

dev-status: venv
	$(BIN)/llmbatch dev status

TEST_PREREQS += testcluster kubectl
