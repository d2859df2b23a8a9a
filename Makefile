# layercache. Run as root: tests make real overlay mounts and the e2e
# cluster runs a real kubelet. `make help` lists the targets.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
GO ?= go
BIN := $(CURDIR)/bin
ROOT ?= /var/lib/layercache
NODES ?= 1
CLUSTER ?= local
# Optional parts make up installs: WITH=tekton (Tekton Pipelines), WITH=argo
# (Argo Workflows), WITH="tekton argo"; both built from source.
WITH ?=
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
	$(GO) vet -tags e2e,benchpeer ./e2e/bench/

.PHONY: test
test: test-unit bench e2e ## everything: unit and real-mount tests, benchmarks, then e2e on a local cluster

.PHONY: test-unit
test-unit: ## unit tests and real-mount tests (needs root)
	$(GO) test -count=1 ./...

.PHONY: bench
bench: ## layerfs benchmarks (needs root); ratios are printed as metrics
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 ./layerfs/

##@ Cluster (e2e harness)

.PHONY: up
up: ## start a local cluster (NODES=1|2, CLUSTER=local|kind, WITH="tekton argo") with layercache deployed
	e2e/cluster/up.sh --nodes $(NODES) --backend $(CLUSTER) --with "$(WITH)"

.PHONY: down
down: ## stop the local cluster and remove everything it made
	e2e/cluster/down.sh

.PHONY: e2e
e2e: WITH += tekton argo
e2e: up ## start the cluster (with Tekton and Argo Workflows) and run the e2e suite against it
	e2e/cluster/run-e2e.sh

.PHONY: demo
demo: up ## quick start: a cache reused by a second build pod
	e2e/cluster/demo.sh

##@ Deploy

# Tools build from their own modules under e2e/tools (`go install` cannot
# build kpt), pinned by those modules' go.mod and go.sum.
KPT_VERSION := v1.0.0-beta.50
KUBECTL ?= kubectl
# config/default (any cluster) or config/e2e (the local cluster's overlay).
OVERLAY ?= default
DEPLOY_TIMEOUT ?= 5m

$(BIN)/controller-gen: e2e/tools/controller-gen/go.mod e2e/tools/controller-gen/go.sum
	cd e2e/tools/controller-gen && $(GO) build -o $@ sigs.k8s.io/controller-tools/cmd/controller-gen

$(BIN)/kpt: e2e/tools/kpt/go.mod e2e/tools/kpt/go.sum
	cd e2e/tools/kpt && $(GO) build -ldflags "-X github.com/GoogleContainerTools/kpt/run.version=$(KPT_VERSION)" -o $@ github.com/GoogleContainerTools/kpt

.PHONY: generate
generate: $(BIN)/controller-gen ## regenerate api/v1alpha1 deepcopy and the Cache CRD in config/crd
	$(BIN)/controller-gen object paths=./api/... crd paths=./api/... output:crd:dir=./config/crd

# The local cluster's kubeconfig unless KUBECONFIG is set.
deploy undeploy: export KUBECONFIG ?= $(firstword $(wildcard $(CURDIR)/_output/cluster/kubeconfig) $(HOME)/.kube/config)

.PHONY: deploy
deploy: $(BIN)/kpt ## kpt live apply config/$(OVERLAY) (OVERLAY=default|e2e) to $KUBECONFIG and wait until it is ready
	@[ -f "$$KUBECONFIG" ] || { echo "deploy: no kubeconfig at '$$KUBECONFIG': set KUBECONFIG, or run make up for the local cluster" >&2; exit 1; }
	@if [ "$(OVERLAY)" = default ]; then \
		set -x; $(BIN)/kpt live apply config --reconcile-timeout=$(DEPLOY_TIMEOUT); \
	else \
		mkdir -p _output/deploy; \
		{ cat config/resourcegroup.yaml; echo ---; $(KUBECTL) kustomize config/$(OVERLAY); } > _output/deploy/$(OVERLAY).yaml; \
		set -x; $(BIN)/kpt live apply - --reconcile-timeout=$(DEPLOY_TIMEOUT) < _output/deploy/$(OVERLAY).yaml; \
	fi

.PHONY: undeploy
undeploy: $(BIN)/kpt ## delete every Cache (node agents clear them from the nodes), then everything deploy applied
	@[ -f "$$KUBECONFIG" ] || { echo "undeploy: no kubeconfig at '$$KUBECONFIG': set KUBECONFIG, or run make up for the local cluster" >&2; exit 1; }
	@if $(KUBECTL) get crd caches.layercache.dev >/dev/null 2>&1; then \
		set -x; $(KUBECTL) delete caches.layercache.dev --all --all-namespaces --wait --timeout=$(DEPLOY_TIMEOUT); \
	fi
	$(BIN)/kpt live destroy config

##@ Benchmarks against peers

.PHONY: bench-e2e
bench-e2e: up ## layercache vs rancher/local-path-provisioner on the local cluster: medians and ratios in _output/bench (BENCH_RUNS=5)
	e2e/bench/run.sh
