# rls — see README.md. `make help` lists the targets.
GO       ?= go
BIN      ?= bin/rls
CONFIG   ?= ./config
export CGO_ENABLED ?= 1
# A race-built test binary sleeps a second before it exits unless told not
# to (the race runtime's atexit_sleep_ms=1000): a second a package.
export GORACE ?= atexit_sleep_ms=0

GOBIN    ?= $(shell $(GO) env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

.PHONY: help build run test unit deps lint tidy proto bench bench-quick clean image release release-check

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build bin/rls
	$(GO) build -o $(BIN) ./cmd/rls

# The container image (Dockerfile). There is no docker on every machine: say so
# plainly rather than fail on "command not found".
IMAGE  ?= rls:dev
DOCKER ?= $(shell command -v docker 2>/dev/null || command -v podman 2>/dev/null)

# Releases (docs/operations.md, "Versions and releases"): offline, into dist/.
VERSION ?=
DIST    ?= dist

# What the image and a release stamp into the binary (rls version): the
# version (VERSION, else git describe), the commit and its time.
STAMP_VERSION = $(or $(VERSION),$(shell git describe --tags --match 'v*' 2>/dev/null || echo v0.0.0-dev))
STAMP_COMMIT  = $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
STAMP_DATE    = $(shell TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null)

image: ## build the container image (IMAGE=rls:dev; IMAGE=registry/rls:tag to push it), stamped with VERSION and the commit, with docker or podman
	@if [ -z "$(DOCKER)" ]; then \
	  echo "make image: neither docker nor podman is installed here: install one, or set DOCKER=/path/to/it" >&2; exit 1; fi
	@$(DOCKER) info >/dev/null 2>&1 || { \
	  echo "make image: $(DOCKER) is installed but cannot build: '$(DOCKER) info' fails (is its daemon running, and may you use it?)" >&2; exit 1; }
	$(DOCKER) build --build-arg VERSION=$(STAMP_VERSION) --build-arg COMMIT=$(STAMP_COMMIT) --build-arg DATE=$(STAMP_DATE) -t $(IMAGE) .

release: ## versioned linux/amd64 and linux/arm64 binaries, the Helm chart, SHA256SUMS and the image command into dist/ (VERSION=v1.2.3)
	GO=$(GO) VERSION=$(VERSION) DIST=$(DIST) bash scripts/release.sh

release-check: ## a release dry run into dist/, checking binaries, checksums, chart and rls version
	GO=$(GO) DIST=$(DIST) bash scripts/release-check.sh

run: build ## serve ./config on the embedded memory store (gRPC :8081, HTTP :8080)
	./$(BIN) serve --config-dir $(CONFIG)

deps: ## install what the tests need (redis-server and nutcracker from Debian) when missing
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || { \
	  echo "redis-server not found: installing Debian's redis-server package"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server >/dev/null || { \
	    echo "could not install redis-server: run 'apt-get install -y redis-server'"; exit 1; }; }
	@redis-server --version
	@command -v nutcracker >/dev/null || test -x /usr/sbin/nutcracker || { \
	  echo "nutcracker not found: installing Debian's nutcracker package (twemproxy, for the tests behind it)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nutcracker >/dev/null || { \
	    echo "could not install nutcracker: run 'apt-get install -y nutcracker'"; exit 1; }; }
	@command -v grpcurl >/dev/null || { echo "installing grpcurl (the README's examples are run by a test)"; \
	  $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4; }
	@command -v service_cmd >/dev/null || test -x "$(GOBIN)/service_cmd" || { echo "installing envoyproxy/ratelimit's service_cmd (the mixed-fleet test runs it beside rls)"; \
	  $(GO) install github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36; }

# The tools make test runs are pinned and installed into bin/tools, so that
# whether it passes does not depend on which (if any) are on PATH:
# staticcheck, and deadcode, which TestNoDeadProductionCode (cmd/rls) runs
# (it skips where deadcode is missing). Defined before the rules that name
# them: make expands a rule's prerequisites as it reads them.
STATICCHECK_VERSION ?= v0.8.2
STATICCHECK := bin/tools/staticcheck-$(STATICCHECK_VERSION)
DEADCODE_VERSION ?= v0.52.0
DEADCODE := bin/tools/deadcode-$(DEADCODE_VERSION)

# tool NAME,PACKAGE,VERSION: the rule installing PACKAGE@VERSION as
# bin/tools/NAME-VERSION.
define tool
bin/tools/$(1)-$(3):
	@mkdir -p bin/tools
	GOBIN=$(CURDIR)/bin/tools/tmp-$(1) $(GO) install $(2)@$(3)
	mv bin/tools/tmp-$(1)/$(1) $$@ && rmdir bin/tools/tmp-$(1)
endef
$(eval $(call tool,staticcheck,honnef.co/go/tools/cmd/staticcheck,$(STATICCHECK_VERSION)))
$(eval $(call tool,deadcode,golang.org/x/tools/cmd/deadcode,$(DEADCODE_VERSION)))

# Tests that start redis-server (or nutcracker) carry the build tag "redis":
# make test sets it, make unit does not, so that make unit needs neither.
TEST_TAGS ?= redis

# lint has run go vet (all its analyzers) on the main module, and bench/ and
# deploy/ run it before their tests: go test's own vet pass (a subset) is
# off, not repeated.
test: deps lint release-check $(DEADCODE) ## everything: vet, gofmt, a release dry run, unit, Redis and integration tests with the race detector
	@# -p 4: half these packages' time is waiting (real Redis, real clocks), not CPU.
	DEADCODE=$(CURDIR)/$(DEADCODE) $(GO) test -p 4 -vet=off -race -count=1 -timeout 15m -tags $(TEST_TAGS) $$($(GO) list ./... | grep -v /integration$$)
	@# Allocation bounds, without the race detector (whose sync.Pool drops items at random).
	$(GO) test -vet=off -count=1 -run 'Allocation' ./pkg/service/
	@# The load generator is its own module (bench/), which ./... above does not reach.
	cd bench && $(GO) vet ./... && $(GO) test -vet=off -race -count=1 -timeout 5m ./...
	@# So is the Kubernetes kit's test (deploy/: the Helm chart rendered with Helm's
	@# packages, decoded into k8s.io/api types, its command run by rls --dry-run;
	@# the dashboard and alert rules parsed with Prometheus's PromQL parser and
	@# checked against a real rls on a real Redis).
	@# No -race: it runs no concurrent code (rls runs as its own process), and
	@# building Helm and client-go twice (vet, race) costs ~2 min on a cold cache.
	cd deploy && $(GO) vet ./... && $(GO) test -vet=off -count=1 -timeout 5m ./...
	@# Last and alone (-p 1): its tests start real rls and redis-server processes.
	$(GO) test -vet=off -race -count=1 -timeout 15m -p 1 ./integration/

unit: ## the tests outside integration/ without the redis tag: no redis-server, nutcracker or rls binary needed (make test runs the tagged ones too)
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /integration)

lint: $(STATICCHECK) ## gofmt, go vet and staticcheck (pinned, installed into bin/tools)
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet -tags $(TEST_TAGS) ./...
	$(STATICCHECK) -tags $(TEST_TAGS) ./...
	cd bench && ../$(STATICCHECK) ./...
	cd deploy && ../$(STATICCHECK) ./...

bench: deps ## micro-benchmarks, end-to-end scenarios (memory, Cluster; Redis side by side with envoyproxy/ratelimit) into docs/BENCHMARKS.md and docs/bench/ (~12 min)
	bash scripts/bench.sh

bench-quick: deps ## rls and envoyproxy/ratelimit side by side on one Redis, 3 s runs, one round, into bin/bench-quick/ (~3 min)
	BENCH_QUICK=1 bash scripts/bench.sh

proto: ## regenerate proto/ Go code with buf and local plugins, and lint it
	@command -v buf >/dev/null || $(GO) install github.com/bufbuild/buf/cmd/buf@v1.75.0
	@command -v protoc-gen-go >/dev/null || $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	@command -v protoc-gen-go-grpc >/dev/null || $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	buf lint
	buf generate

tidy: ## go mod tidy, failing when it changes anything
	$(GO) mod tidy && git diff --exit-code go.mod go.sum

clean: ## remove build output
	rm -rf bin dist

# Fuzzing: `make test` runs every fuzz target's seed corpus (testdata/fuzz/)
# as ordinary tests; `make fuzz` fuzzes each target for FUZZTIME in turn (go
# test -fuzz takes one target of one package). Crashers are written to the
# package's testdata/fuzz/<Target>/: commit them as seeds once fixed.
FUZZTIME     ?= 5m
FUZZ_TARGETS ?= ./pkg/descriptors:FuzzParse ./pkg/descriptors:FuzzKeyInjective \
                ./pkg/service:FuzzShouldRateLimit ./pkg/service:FuzzDecodeRequest \
                ./pkg/store/redisstore:FuzzDifferential ./pkg/limiter:FuzzCacheAgreesWithTheStore

.PHONY: fuzz soak

fuzz: ## fuzz each target for FUZZTIME (5m) in turn (FuzzDifferential needs redis-server: it is behind the redis tag)
	@set -e; for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "== $$name ($$pkg) for $(FUZZTIME)"; \
	  $(GO) test -tags $(TEST_TAGS) -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -timeout 0 $$pkg; done

soak: ## not in CI: SOAK_MINUTES (10) of load with Redis restarts and reloads, then 1M hostile keys and 4 KB values against byte budgets
	./scripts/soak.sh
	RLS_BOUNDS_KEYS=1000000 $(GO) test -race -count=1 -timeout 60m -v \
	  -run '^TestMemoryBoundedUnderHostileCardinality$$' ./integration/
	RLS_BYTES_FULL=1 $(GO) test -count=1 -timeout 30m -v \
	  -run '^TestTablesBoundedByBytes$$' ./integration/
