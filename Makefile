# layercache. Run as root: tests make real overlay mounts and the e2e
# cluster runs a real kubelet. `make help` lists the targets.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
GO ?= go
BIN := $(CURDIR)/bin
ROOT ?= /var/lib/layercache
NODES ?= 1
CLUSTER ?= local
export GOFLAGS ?= -buildvcs=false

.PHONY: help
help: ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | sort

##@ Build and check

.PHONY: build
build: ## build bin/layerfs and bin/layercache
	$(GO) build -o $(BIN)/ ./cmd/...

.PHONY: lint
lint: ## gofmt and go vet
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e/...

.PHONY: test
test: test-unit e2e ## everything: unit and root tests, then e2e on a local cluster

.PHONY: test-unit
test-unit: ## unit tests and real-mount tests (needs root)
	$(GO) test -count=1 ./...

.PHONY: bench
bench: ## layerfs benchmarks (needs root); ratios are printed as metrics
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 ./layerfs/

##@ Cluster (e2e harness)

.PHONY: up
up: ## start a local cluster (NODES=1|2, CLUSTER=local|kind) with layercache deployed
	e2e/cluster/up.sh --nodes $(NODES) --backend $(CLUSTER)

.PHONY: down
down: ## stop the local cluster and remove everything it made
	e2e/cluster/down.sh

.PHONY: e2e
e2e: up ## start the cluster and run the e2e suite against it
	e2e/cluster/run-e2e.sh

.PHONY: demo
demo: up ## quick start: a cache reused by a second build pod
	e2e/cluster/demo.sh
