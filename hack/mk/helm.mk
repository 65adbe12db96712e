# helm, built from its pinned Go module (hack/helm/go.mod) into .cache/bin with the machine's Go,
# with the same link flags as helm's own Makefile (version, and the Kubernetes version that
# `helm template` / `helm lint` assume: client-go's minor, as helm's release builds do).
#   make helm            .cache/bin/helm
#   make chart-lint      helm lint + helm template over every hack/chart-values/*.yaml
HELM_DIR := hack/helm
HELM_BIN := $(CACHE)/bin/helm
HELM_VERSION = $(shell cd $(HELM_DIR) && go list -m -f '{{.Version}}' helm.sh/helm/v3)
HELM_K8S_MINOR = $(word 2,$(subst ., ,$(shell cd $(HELM_DIR) && go list -m -f '{{.Version}}' k8s.io/client-go)))
HELM_LDFLAGS = -s -w \
	-X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	-X helm.sh/helm/v3/internal/version.gitTreeState=clean \
	-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
	-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$(HELM_K8S_MINOR) \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$(HELM_K8S_MINOR)

.PHONY: helm chart-lint
helm: $(HELM_BIN)

$(HELM_BIN): $(HELM_DIR)/go.mod $(HELM_DIR)/go.sum
	@mkdir -p $(@D)
	cd $(HELM_DIR) && CGO_ENABLED=0 go build -trimpath -ldflags '$(HELM_LDFLAGS)' -o $@ helm.sh/helm/v3/cmd/helm

chart-lint: helm
	# The chart requires image.registry and store.uri: lint it with the default value set.
	$(HELM_BIN) lint --strict charts/llm-batch-operator -f hack/chart-values/default.yaml
	for values in hack/chart-values/*.yaml; do \
	  $(HELM_BIN) lint --strict charts/llm-batch-operator -f $$values; \
	  $(HELM_BIN) template t charts/llm-batch-operator -n llmbatch-system -f $$values >/dev/null; \
	done

TEST_PREREQS += helm
