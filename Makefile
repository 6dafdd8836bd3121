# rgproxy / rgserver. `make run` starts the system, `make test` tests it.
GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
# Seconds each fuzz target runs in `make fuzz`.
FUZZTIME  ?= 60s
# How long `make soak` loads the system.
SOAK_DURATION ?= 10m

.PHONY: all build run test test-deps tidy-check test-rules test-unit test-failpoints test-e2e vet fmt-check fuzz bench bench-deps bench-proxy bench-server bench-metering bench-calibrate bench-isolation bench-cluster-views soak demo-load generate tools clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

# Starts MariaDB if none answers on 3306 (installing it on a fresh Debian
# machine as root), then the system in the foreground; Ctrl-C stops it.
# Exits non-zero, with the log's last lines, when a port it needs is taken
# or a process it started dies.
run: build
	bash scripts/run.sh

# Everything CI runs: static checks, unit tests with the race detector, and
# the end-to-end tests in tests/ against real processes. test-deps installs
# (apt, only what is absent) and starts what those tests need.
test: test-deps vet fmt-check tidy-check test-rules test-unit test-failpoints test-e2e

test-deps:
	bash scripts/test-deps.sh

# go.mod and go.sum must be what `go mod tidy` makes them.
tidy-check:
	$(GO) mod tidy -diff

vet:
	$(GO) vet ./...

# The Prometheus alerting rules beside the dashboards: valid, and each
# alert fires (and stays quiet) on the series dashboards/alerts_test.yml
# gives it. promtool comes from Debian's prometheus package (test-deps).
test-rules: test-deps
	promtool check rules dashboards/alerts.yml
	promtool test rules dashboards/alerts_test.yml

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

test-unit:
	$(GO) test -race -count=1 -timeout 10m $$($(GO) list ./... | grep -v /tests)

# The failpoint suite: pingcap/failpoint markers compiled in by
# failpoint-toolexec, with a build cache of its own so that the source tree
# stays clean and normal builds never see rewritten code.
FAILPOINT_GOCACHE := $(CURDIR)/.cache/failpoint-gocache
test-failpoints:
	$(GO) build -o $(BIN)/failpoint-toolexec github.com/pingcap/failpoint/failpoint-toolexec
	GOCACHE=$(FAILPOINT_GOCACHE) $(GO) test -race -count=1 -timeout 10m \
		-toolexec=$(CURDIR)/$(BIN)/failpoint-toolexec -run Failpoint ./tokenclient/ ./tokenserver/ ./mysqlproto/
	GOCACHE=$(FAILPOINT_GOCACHE) $(GO) build -toolexec=$(CURDIR)/$(BIN)/failpoint-toolexec -o $(BIN)/failpoint/ ./cmd/rgproxy
	RGPROXY_FAILPOINT_BIN=$(CURDIR)/$(BIN)/failpoint $(GO) test -count=1 -timeout 10m -run ChaosFailpoint -v ./tests/

# 45 minutes: about 15 on an idle 2-core machine, twice that with both
# cores busy beside it; the timeout is there to end a hung run, not to judge speed.
test-e2e: build test-deps
	$(GO) test -count=1 -timeout 45m -v ./tests/

# Drives app_a and app_b through rgproxy for the README walkthrough;
# DEMO_LOAD_FLAGS passes flags (see bin/demo-load --help).
demo-load: build
	$(BIN)/demo-load $(DEMO_LOAD_FLAGS)

# Each fuzz target for $(FUZZTIME); not part of `make test`.
fuzz:
	bash scripts/fuzz.sh $(FUZZTIME)

bench: bench-proxy bench-server bench-metering bench-calibrate bench-isolation bench-cluster-views

# What the benchmarks drive (sysbench, HAProxy, Connector/J, MariaDB).
bench-deps:
	bash scripts/test-deps.sh bench

# sysbench oltp_point_select direct vs HAProxy vs rgproxy, side by side.
bench-proxy: build bench-deps
	bash scripts/bench-proxy.sh

# 200 simulated proxies x 1,000 groups against one real rgserver, closed
# loop; then 200 proxies paced at 20,000 group-grants/s over 1,000 and over
# 100,000 groups, /metrics scraped every 5 s in both, compared side by side
# (targets: p99 at 100,000 groups at most 3x the p99 at 1,000, RSS < 1 GiB,
# a joining proxy's snapshot < 2 s).
bench-server: build
	$(BIN)/bench-server --rgserver $(BIN)/rgserver --groups-per-message 10
	$(BIN)/bench-server --rgserver $(BIN)/rgserver --groups-per-message 50
	$(BIN)/bench-server --rgserver $(BIN)/rgserver --groups 1000,100000 --proxies 200 --rate 20000 --duration 20s --scrape-every 5s --parent-every 10

# sysbench through rgproxy, metering on (a limited group at >= 2x demand)
# vs --metering=false; token requests per 1,000 statements; 3-proxy accuracy.
bench-metering: build bench-deps
	bash scripts/bench-metering.sh

# CALIBRATE RESOURCE's answer (live and over a window of the usage
# history, from a light run) beside the RU/s a saturating sysbench
# oltp_read_write run achieves through rgproxy (target within 20%).
bench-calibrate: build bench-deps
	bash scripts/bench-calibrate.sh

# The noisy-neighbour experiment: a victim's p99 alone and beside a heavy
# aggressor (scan, sort), directly and through rgproxy; the aggressor group's
# RU against RU_PER_SEC x T + capacity; one heavy statement's RU alone and
# beside 8 direct copies. BENCH_ISOLATION_FLAGS passes flags.
bench-isolation: build bench-deps
	$(BIN)/bench-isolation --bin-dir $(BIN) $(BENCH_ISOLATION_FLAGS)

# Cluster-wide views with rgserver and 10 rgproxies of 1,000 statement
# shapes each: one view read through one proxy, whole (fan-out, rewrite,
# the backend's evaluation), and with one proxy stopped (target: < 1 s).
bench-cluster-views: build
	$(GO) test -count=1 -run '^$$' -bench ClusterViews -benchtime 20x ./tests/

# The long-run test, not part of `make test`: rgserver x3 (embedded etcd
# cluster), rgproxy x3 and a private MariaDB under mixed load with group
# DDL, a leader kill, a backend restart and sessions idling past
# wait_timeout, time compressed by rgserver's flags; prints a summary and
# fails on an unexpected error, a leak, etcd growth or NOSPACE, a group
# over its limit or a dropped group's series left. SOAK_FLAGS passes flags
# (bin/soak --help).
soak: build test-deps
	$(BIN)/soak --bin-dir $(BIN) --duration $(SOAK_DURATION) $(SOAK_FLAGS)

# The protobuf generators, pinned; protoc comes from Debian's protobuf-compiler.
GOBIN_DIR := $(shell $(GO) env GOPATH)/bin
tools:
	GOBIN=$(GOBIN_DIR) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	GOBIN=$(GOBIN_DIR) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1

generate: tools
	PATH=$(GOBIN_DIR):$$PATH $(GO) generate ./...

clean:
	rm -rf $(BIN) run
