# Prometheus and promtool from Debian's `prometheus` package (checks the chart's rules and runs the
# live-scrape test). The Debian service is never started: tests run the binary themselves.
#   make prometheus      install promtool and prometheus when promtool is missing (root: CI)
#   make rules-check     promtool check rules + promtool test rules
PROMTOOL ?= $(shell command -v promtool 2>/dev/null || echo /usr/bin/promtool)
RULES_FILE := charts/llm-batch-operator/files/prometheus-rules.yaml

.PHONY: prometheus rules-check
TEST_PREREQS += prometheus

prometheus:
	@if ! command -v promtool >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $$SUDO apt-get install -y -q --no-install-recommends prometheus && \
	  { $$SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true; }; \
	fi
	@promtool --version 2>&1 | head -1

rules-check: prometheus
	promtool check rules $(RULES_FILE)
	promtool test rules hack/prometheus/rules-test.yaml
