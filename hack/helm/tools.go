//go:build tools

// Package tools pins the helm CLI that `make helm` builds into .cache/bin (see hack/mk/helm.mk).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
