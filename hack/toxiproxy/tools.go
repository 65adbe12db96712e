//go:build tools

// Package tools pins Toxiproxy (the TCP fault proxy of the fault-injection suite, tests/faults)
// so `go build github.com/Shopify/toxiproxy/v2/cmd/server` builds the pinned version.
package tools

import _ "github.com/Shopify/toxiproxy/v2/cmd/server"
