# vipgate — see README.md. Targets that touch the network need root and only ever touch network
# namespaces they create.
GO      ?= go
BIN     := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
APT_PKGS := nftables iproute2 conntrack iperf3 arping tcpdump bird2 frr etcd-server
# Bounded fuzzing in `make test`, as a count of inputs per target (about 10 s each here). A count, not
# a duration: with a duration, Go 1.26's fuzz coordinator can report a spurious "context deadline
# exceeded" at the deadline (golang/go#75804, fixed in Go 1.27). Longer runs: FUZZ_FILE=60s etc.
FUZZ_FILE    ?= 3000x
FUZZ_RULESET ?= 300x

.PHONY: all build deps test unit e2e fuzz demo bench clean apiserver

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/vipgate ./cmd/vipgate
	$(GO) build -o $(BIN)/labserver ./test/labserver

# deps installs the Debian packages the lab needs (only what is missing).
deps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# test: everything CI runs. Unit tests need no root; the netns end-to-end tests need root.
TEST_ENV := VIPGATE_BIN=$(CURDIR)/$(BIN)/vipgate VIPGATE_LABSERVER=$(CURDIR)/$(BIN)/labserver \
	VIPGATE_KUBE_APISERVER=$(CURDIR)/$(BIN)/kube-apiserver

test: deps build apiserver
	$(GO) vet ./...
	$(TEST_ENV) $(GO) test -count=1 -timeout 25m ./...
	$(MAKE) fuzz

unit:
	$(GO) test -count=1 -short ./...

e2e: deps build apiserver
	$(TEST_ENV) $(GO) test -count=1 -timeout 20m -v ./test/e2e/

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzFileDocument$$' -fuzztime $(FUZZ_FILE) ./cluster/
	$(GO) test -run '^$$' -fuzz '^FuzzRuleset$$' -fuzztime $(FUZZ_RULESET) ./dataplane/

# demo: a lab in network namespaces (two nodes running vipgate node, two running vipgate gateway, BIRD as
# the router), a tour of the Service types and a gateway failover.
demo: deps build
	$(GO) run ./test/demo --vipgate $(CURDIR)/$(BIN)/vipgate --labserver $(CURDIR)/$(BIN)/labserver

# bench: one table of dataplane figures (full and incremental syncs vs kube-proxy and nft -f, rule
# counts, memory, per-packet cost, throughput, control-plane latency), measured in throwaway network
# namespaces; appended to BENCH.md. `go run ./test/bench --quick` takes about a minute. Go benchmarks of
# the pure parts: `go test -run '^$$' -bench . -benchmem ./dataplane/`.
bench: deps build apiserver
	VIPGATE_LABSERVER=$(CURDIR)/$(BIN)/labserver VIPGATE_BIN=$(CURDIR)/$(BIN)/vipgate VIPGATE_KUBE_APISERVER=$(CURDIR)/$(BIN)/kube-apiserver $(GO) run ./test/bench --out BENCH.md

# apiserver builds the real kube-apiserver for the Kubernetes integration tests (about 7 minutes the
# first time, cached afterwards).
apiserver:
	@mkdir -p $(BIN)
	@if [ ! -x $(BIN)/kube-apiserver ]; then \
		echo "building kube-apiserver v1.36.3 (about 7 minutes the first time)"; \
		cd test/tools && $(GO) build -o $(CURDIR)/$(BIN)/kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver; \
	fi

clean:
	rm -rf $(BIN)
