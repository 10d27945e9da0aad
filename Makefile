# vipgate — see README.md. Targets that touch the network need root and only ever touch network
# namespaces they create.
GO      ?= go
BIN     := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
APT_PKGS := nftables iproute2 ethtool clang-14 llvm-14 conntrack conntrackd iperf3 arping tcpdump bird2 frr etcd-server haproxy nginx libnginx-mod-stream
# Bounded fuzzing in `make test`, as a count of inputs per target (about 10 s each here). A count, not
# a duration: with a duration, Go 1.26's fuzz coordinator can report a spurious "context deadline
# exceeded" at the deadline (golang/go#75804, fixed in Go 1.27). Longer runs: FUZZ_FILE=60s etc.
FUZZ_FILE    ?= 3000x
FUZZ_RULESET ?= 300x
# The NAT fast path's program on crafted frames (BPF_PROG_TEST_RUN; root): ~30,000 a second here.
FUZZ_PACKET  ?= 100000x

.PHONY: all build deps test test-cluster unit e2e fuzz demo bench clean apiserver bpf

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/vipgate ./cmd/vipgate
	CGO_ENABLED=0 $(GO) build -o $(BIN)/labserver ./test/labserver

# deps installs the Debian packages the lab needs (only what is missing).
deps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# test: everything CI runs. Unit tests need no root; the netns end-to-end tests need root. The
# gateway package is tested (test-deb) and built for this machine before test-cluster, whose
# gateway hosts install it.
TEST_ENV := VIPGATE_BIN=$(CURDIR)/$(BIN)/vipgate VIPGATE_LABSERVER=$(CURDIR)/$(BIN)/labserver \
	VIPGATE_KUBE_APISERVER=$(CURDIR)/$(BIN)/kube-apiserver

test: deps build apiserver cluster-deps
	$(MAKE) lint
	$(TEST_ENV) $(GO) test -count=1 -timeout 25m ./...
	$(MAKE) fuzz
	$(MAKE) test-deb
	$(MAKE) deb DEB_ARCH=$(IMAGE_ARCH)
	$(MAKE) test-cluster

# test-cluster: the tests that build a real cluster (test/cluster): a LoadBalancer reached from
# outside, the upstream e2e subset (testcluster.CIFocus), Ingress, rolling update, node death.
test-cluster: cluster-deps
	$(TEST_ENV) VIPGATE_CLUSTER_TESTS=1 $(GO) test -count=1 -timeout 50m -v ./test/cluster/

unit:
	$(GO) test -count=1 -short ./...

# lint: go vet and staticcheck (its default checks; staticcheck.conf where one is tuned) over the main
# module and the nested modules with our code. Not linted: third_party/nftables (a vendored copy of
# google/nftables, its own module, so ./... skips it), the tools modules (test/tools*: imports only),
# and test/coredns and test/bench/kubeproxy (LINT_HEAVY: CoreDNS's and Kubernetes' dependency trees
# make their vet take ~10 minutes on a cold cache; `make lint LINT_HEAVY=1` includes them). staticcheck
# is pinned by test/tools-lint and built into bin/ when its go.mod changes.
LINT_MODULES := . deploy/deb test/helmtools membership/memberlistsim
LINT_HEAVY ?=
ifneq ($(LINT_HEAVY),)
LINT_MODULES += test/coredns test/bench/kubeproxy
endif
.PHONY: lint
lint: $(BIN)/staticcheck
	@for m in $(LINT_MODULES); do \
		echo "lint: $$m"; \
		( cd $$m && $(GO) vet ./... && $(CURDIR)/$(BIN)/staticcheck ./... ) || exit 1; \
	done

$(BIN)/staticcheck: test/tools-lint/go.mod test/tools-lint/go.sum
	@mkdir -p $(BIN)
	cd test/tools-lint && $(GO) build -o $(CURDIR)/$@ honnef.co/go/tools/cmd/staticcheck

# bpf rebuilds the gateway's NAT fast path program (gateway/natpath/bpf/natpath.c) into the objects
# the Go package embeds, which are committed (a build needs no clang): the tc program, and the same
# source as an XDP program (-DNATPATH_XDP). TestObjectUpToDate checks that the committed objects are
# this build's, byte for byte, where clang is installed (make test installs it).
BPF_CLANG ?= clang-14
BPF_STRIP ?= llvm-strip-14
BPF_OUT ?= $(CURDIR)/gateway/natpath/natpath_bpfel.o
BPF_XDP_OUT ?= $(CURDIR)/gateway/natpath/natpath_xdp_bpfel.o
bpf:
	cd gateway/natpath/bpf && $(BPF_CLANG) $(BPF_CFLAGS) -c natpath.c -o $(BPF_OUT)
	cd gateway/natpath/bpf && $(BPF_CLANG) $(BPF_CFLAGS) -DNATPATH_XDP -c natpath.c -o $(BPF_XDP_OUT)
	$(BPF_STRIP) -g $(BPF_OUT) $(BPF_XDP_OUT)
BPF_CFLAGS = -O2 -g -target bpf -Wall -Werror -I/usr/include/$(shell gcc -dumpmachine) -fdebug-prefix-map=$(CURDIR)=.

e2e: deps build apiserver
	$(TEST_ENV) $(GO) test -count=1 -timeout 20m -v ./test/e2e/

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzFileDocument$$' -fuzztime $(FUZZ_FILE) ./cluster/
	$(GO) test -run '^$$' -fuzz '^FuzzRuleset$$' -fuzztime $(FUZZ_RULESET) ./proxy/
	$(GO) test -run '^$$' -fuzz '^FuzzConflictOrder$$' -fuzztime 3000x ./proxy/
	$(GO) test -run '^$$' -fuzz '^FuzzPacket$$' -fuzztime $(FUZZ_PACKET) ./gateway/natpath/
	$(GO) test -run '^$$' -fuzz '^FuzzMembershipDatagram$$' -fuzztime 20000x ./membership/
	$(GO) test -run '^$$' -fuzz '^FuzzRelayDatagram$$' -fuzztime 20000x ./gateway/ctsync/relay/
	$(GO) test -run '^$$' -fuzz '^FuzzAuthSection$$' -fuzztime 100000x ./bgp/bfd/
	$(GO) test -run '^$$' -fuzz '^FuzzParseSolicitation$$' -fuzztime 100000x ./l2/

# demo: a lab in network namespaces (two nodes running vipgate node, two running vipgate gateway, BIRD as
# the router), a tour of the Service types and a gateway failover.
demo: deps build
	$(GO) run ./test/demo --vipgate $(CURDIR)/$(BIN)/vipgate --labserver $(CURDIR)/$(BIN)/labserver

# bench: one table of dataplane figures (full and incremental syncs vs the real kube-proxy and nft -f,
# both measured in the same run; rule counts, memory, churn of 1,000 endpoint changes/s for 60 s
# (--churn-time to shorten; kube-proxy under the same churn), per-packet cost, throughput, control-plane latency,
# the gateway's small-packet rate per forwarding mode vs plain routing, its connection rate and latency vs HAProxy and nginx (run
# in the lab's namespaces only, never as services), the flows it holds and their memory), measured in throwaway network namespaces; appended to BENCH.md, the scaling curves drawn as
# SVG into docs/bench/. kube-proxy's nftables proxier v1.37.2 is measured by default (the driver
# test/bench/kubeproxy, built into bin/ when its sources change); BENCH_KUBEPROXY=0 skips it,
# BENCH_KUBEPROXY=v1.37.2,v1.36.3 adds v1.36.3. BENCH_ARGS goes to the bench as it is, e.g.
# BENCH_ARGS="--sizes 1000,3000,10000,30000,100000" for the 100,000-Service full sync, or
# "--no-kube-proxy-churn". `go run ./test/bench --quick --no-kube-proxy` takes
# about a minute. Go benchmarks of the pure parts: `go test -run '^$$' -bench . -benchmem ./dataplane/ ./proxy/`.
BENCH_KUBEPROXY ?= v1.37.2
BENCH_ARGS ?=
bench_comma := ,
KUBEPROXY_BENCH_BINS := $(addprefix $(BIN)/kube-proxy-bench-,$(filter-out 0,$(subst $(bench_comma), ,$(BENCH_KUBEPROXY))))
KUBEPROXY_BENCH_SRC  := $(wildcard test/bench/kubeproxy/*.go test/bench/kubeproxy/go.*)
bench: deps build apiserver $(KUBEPROXY_BENCH_BINS)
	VIPGATE_LABSERVER=$(CURDIR)/$(BIN)/labserver VIPGATE_BIN=$(CURDIR)/$(BIN)/vipgate VIPGATE_KUBE_APISERVER=$(CURDIR)/$(BIN)/kube-apiserver \
		$(GO) run ./test/bench --out BENCH.md --plots docs/bench --kube-proxy "$(BENCH_KUBEPROXY)" --kube-proxy-bin $(CURDIR)/$(BIN) $(BENCH_ARGS)

# The kube-proxy drivers of `make bench`: one module, the real nftables proxier of k8s.io/kubernetes
# v1.37.2 (go.mod) or v1.36.3 (go.136.mod, tag kubeproxy136). Seconds with a warm build cache.
$(BIN)/kube-proxy-bench-v1.37.2: $(KUBEPROXY_BENCH_SRC)
	@mkdir -p $(BIN)
	cd test/bench/kubeproxy && $(GO) build -o $(CURDIR)/$@ .

$(BIN)/kube-proxy-bench-v1.36.3: $(KUBEPROXY_BENCH_SRC)
	@mkdir -p $(BIN)
	cd test/bench/kubeproxy && $(GO) build -modfile=go.136.mod -tags kubeproxy136 -o $(CURDIR)/$@ .

# apiserver builds the real kube-apiserver for the Kubernetes integration tests (with the other
# Kubernetes binaries of test/cluster/cluster.mk, in one go build: about 4 minutes the first time).
apiserver: $(BIN)/kube-apiserver

# image: vipgate's OCI image without Docker (deploy/image, go-containerregistry): the static binary
# in one reproducible layer (same inputs, same digest), written as an OCI image layout archive that
# `ctr -n k8s.io images import` and `skopeo copy oci-archive:...` accept. Tagged with VERSION.
# IMAGE_ARCH=arm64 cross-builds; SOURCE_DATE_EPOCH (default 0) sets every timestamp.
IMAGE_VERSION := $(shell cat VERSION)
IMAGE_REPO    ?= ghcr.io/vipgate/vipgate
IMAGE_ARCH    ?= $(shell $(GO) env GOARCH)
IMAGE_TAR     := $(BIN)/vipgate-image.tar
# The image tool runs on this host whatever GOOS/GOARCH the binary is built for.
IMAGE_TOOL    := env -u GOOS -u GOARCH $(GO) run ./deploy/image

.PHONY: image test-images

image:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) $(GO) build -trimpath -buildvcs=false \
		-ldflags "-s -w -X main.version=$(IMAGE_VERSION)" -o $(BIN)/vipgate-linux-$(IMAGE_ARCH) ./cmd/vipgate
	$(IMAGE_TOOL) vipgate --binary $(BIN)/vipgate-linux-$(IMAGE_ARCH) --version $(IMAGE_VERSION) \
		--name $(IMAGE_REPO) --arch $(IMAGE_ARCH) --out $(IMAGE_TAR)

# deb: vipgate's Debian package for a gateway host (deploy/deb, nfpm as a Go library; no Docker,
# no debhelper): bin/vipgate_<VERSION file>_<arch>.deb with /usr/bin/vipgate (static, -trimpath), the
# gateway's systemd unit (not enabled on install), /etc/vipgate/gateway.yaml as a conffile and a
# sysctl drop-in for forwarding. DEB_ARCH="amd64 arm64" by default (cross-built); reproducible, with
# SOURCE_DATE_EPOCH (default 0) as every timestamp. deploy/deb is a Go module of its own (nfpm's
# dependencies stay out of go.mod). test-deb: its tests; as root they install, upgrade, remove and
# purge it with the real dpkg into throwaway roots (deploy/README.md, "Gateway VM").
DEB_ARCH ?= amd64 arm64
DEB_TOOL := cd deploy/deb && env -u GOOS -u GOARCH $(GO) run .

.PHONY: deb test-deb

deb:
	@mkdir -p $(BIN)
	@for arch in $(DEB_ARCH); do \
		echo "CGO_ENABLED=0 GOARCH=$$arch $(GO) build ... -o $(BIN)/vipgate-linux-$$arch ./cmd/vipgate"; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -buildvcs=false \
			-ldflags "-s -w -X main.version=$(IMAGE_VERSION)" -o $(BIN)/vipgate-linux-$$arch ./cmd/vipgate || exit 1; \
		( $(DEB_TOOL) --binary $(CURDIR)/$(BIN)/vipgate-linux-$$arch --version $(IMAGE_VERSION) --arch $$arch \
			--repo $(CURDIR) --out $(CURDIR)/$(BIN)/vipgate_$(IMAGE_VERSION)_$$arch.deb ) || exit 1; \
	done

test-deb:
	cd deploy/deb && $(GO) vet . && $(GO) test -count=1 -timeout 15m -v .

# image-multiarch: the same image for amd64 and arm64 as one multi-platform image (an OCI image
# index under the tag: docker, containerd and kubelet pick their platform's image) in
# bin/vipgate-image-multiarch.tar; `skopeo copy --all oci-archive:...` pushes both,
# `ctr images import --all-platforms` imports both.
IMAGE_MULTIARCH_TAR := $(BIN)/vipgate-image-multiarch.tar
.PHONY: image-multiarch
image-multiarch:
	@mkdir -p $(BIN)
	for arch in amd64 arm64; do \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -buildvcs=false \
			-ldflags "-s -w -X main.version=$(IMAGE_VERSION)" -o $(BIN)/vipgate-linux-$$arch ./cmd/vipgate || exit 1; \
	done
	$(IMAGE_TOOL) vipgate-index --binary amd64=$(BIN)/vipgate-linux-amd64 --binary arm64=$(BIN)/vipgate-linux-arm64 \
		--version $(IMAGE_VERSION) --name $(IMAGE_REPO) --out $(IMAGE_MULTIARCH_TAR)

# test-images: the images the test cluster loads instead of pulling, into bin/images/ (the list is
# TestImages in deploy/image/images.go): pause (static build of Kubernetes' pause.c), agnhost (plus
# busybox, curl, OpenBSD nc and dig from Debian), busybox, kube-proxy (with Debian's nft and
# iptables), CoreDNS (test/coredns), MetalLB's controller and speaker (test/metallb) and Flannel
# (test/flannel: flanneld and the flannel CNI plugin, for CNI=flannel). The binaries come from test/cluster/cluster.mk's rules. Needs root the first time to install
# the Debian packages below.
TEST_IMAGES_PKGS := gcc libc6-dev busybox-static curl wget dash netcat-openbsd bind9-dnsutils iptables
KUBERNETES_DIR    = $(shell cd test/tools && $(GO) list -m -f '{{.Dir}}' k8s.io/kubernetes)

test-images: $(BIN)/agnhost $(BIN)/coredns $(BIN)/kube-proxy $(BIN)/traefik $(BIN)/flanneld $(BIN)/flannel-cni $(BIN)/metallb-controller $(BIN)/metallb-speaker build
	@mkdir -p $(BIN)/images
	@missing=""; for p in $(TEST_IMAGES_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	gcc -static -O2 -o $(BIN)/pause $(KUBERNETES_DIR)/build/pause/linux/pause.c
	$(IMAGE_TOOL) test-images --bin $(BIN) --out $(BIN)/images

clean:
	rm -rf $(BIN)

include test/cluster/cluster.mk
