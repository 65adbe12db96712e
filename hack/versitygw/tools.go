//go:build tools

// Package tools pins versitygw (the S3-compatible server of the integration and fault tiers,
// tests/fixtures/s3server.py) so `go build github.com/versity/versitygw/cmd/versitygw` builds the
// pinned version.
package tools

import _ "github.com/versity/versitygw/cmd/versitygw"
