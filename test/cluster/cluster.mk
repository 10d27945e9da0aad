# The real Kubernetes cluster (test/cluster): Kubernetes' own binaries built from test/tools, the
# images `make image` and `make test-images` write, Debian's containerd/runc/CNI plugins. Included by
# the top-level Makefile.

K8S_VERSION ?= v1.36.3
K8S_MINOR   := $(word 2,$(subst ., ,$(K8S_VERSION)))
K8S_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(K8S_MINOR)
K8S_CMDS    := kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl
# The project's test version builds from test/tools into bin/. Another version (K8S_VERSION=v1.37.2)
# builds from test/tools-1.<minor> into bin/k8s-<version>/, which k8s-images completes (that
# version's test images, links to helmrender, CoreDNS and vipgate's image) and vgcluster gets as --bin.
K8S_DEFAULT_VERSION := v1.36.3
ifeq ($(K8S_VERSION),$(K8S_DEFAULT_VERSION))
K8S_TOOLS      := test/tools
K8S_BIN        := $(BIN)
K8S_IMAGES     := test-images
else
K8S_TOOLS      := test/tools-1.$(K8S_MINOR)
K8S_BIN        := $(BIN)/k8s-$(K8S_VERSION)
K8S_IMAGES     := k8s-images
VGCLUSTER_BIN  := --bin $(CURDIR)/$(K8S_BIN)
CONFORMANCE_OUT ?= docs/conformance-$(K8S_VERSION).md
endif
# CNI=flannel: the pod network is Flannel (VXLAN) instead of the lab's bridge (test/cluster/flannel.go),
# for `make cluster` and `make conformance` (whose table then goes to docs/conformance-flannel.md).
CNI ?=
ifeq ($(CNI),flannel)
CONFORMANCE_OUT ?= docs/conformance-flannel.md
endif
CONFORMANCE_OUT ?= docs/conformance.md
K8S_BINS    := $(addprefix $(K8S_BIN)/,$(K8S_CMDS) agnhost e2e.test)
CLUSTER_APT := containerd runc containernetworking-plugins busybox-static curl gcc libc6-dev util-linux
# What `make conformance` runs against vipgate (kube-proxy runs the Services suite only: alone it
# has no LoadBalancer IPs). `make test` runs a subset, testcluster.CIFocus.
CONFORMANCE_FOCUS ?= \[sig-network\] (Services|LoadBalancers)

.PHONY: k8s k8s-images cluster-deps cluster cluster-down conformance test-cluster-gateways test-cluster-metallb test-cluster-migration

# k8s builds every Kubernetes binary the cluster and the tests use, in one go build (about 4 minutes
# on a cold cache, 2 more for e2e.test). Each is rebuilt only when missing.
k8s: $(K8S_BINS)

$(addprefix $(K8S_BIN)/,$(K8S_CMDS) agnhost) &:
	@mkdir -p $(K8S_BIN)
	cd $(K8S_TOOLS) && $(GO) build -ldflags "$(K8S_LDFLAGS)" -o $(CURDIR)/$(K8S_BIN)/ \
		$(addprefix k8s.io/kubernetes/cmd/,$(K8S_CMDS)) k8s.io/kubernetes/test/images/agnhost

$(K8S_BIN)/e2e.test:
	@mkdir -p $(K8S_BIN)
	cd $(K8S_TOOLS) && $(GO) test -c -ldflags "$(K8S_LDFLAGS)" -o $(CURDIR)/$@ k8s.io/kubernetes/test/e2e

$(BIN)/coredns:
	cd test/coredns && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(CURDIR)/$@ .

# k8s-images: the images of bin/k8s-<version>/ (test-images writes the default version's): links to
# bin/'s other files (helmrender, CoreDNS, vipgate's image, ...), pause from that version's pause.c,
# then TestImages with its kube-proxy, agnhost and busybox tags.
k8s-images: $(K8S_BIN)/agnhost $(K8S_BIN)/kube-proxy $(BIN)/coredns $(BIN)/helmrender $(BIN)/flanneld $(BIN)/flannel-cni $(BIN)/metallb-controller $(BIN)/metallb-speaker
	@mkdir -p $(K8S_BIN)/images
	@missing=""; for p in $(TEST_IMAGES_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@for f in $(BIN)/*; do b=$${f##*/}; case " $(K8S_CMDS) agnhost e2e.test pause " in *" $$b "*) continue;; esac; \
		if [ -f $$f ]; then ln -sfn ../$$b $(K8S_BIN)/$$b; fi; done
	gcc -static -O2 -o $(K8S_BIN)/pause \
		$$(cd $(K8S_TOOLS) && $(GO) list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
	TEST_IMAGES_K8S_VERSION=$(K8S_VERSION) $(IMAGE_TOOL) test-images --bin $(K8S_BIN) --out $(K8S_BIN)/images

# The real MetalLB's controller and speaker (test/metallb pins v0.16.2), for PROXY=kube-proxy METALLB=...
$(BIN)/metallb-controller $(BIN)/metallb-speaker &:
	@mkdir -p $(BIN)
	cd test/metallb && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(CURDIR)/$(BIN)/metallb-controller go.universe.tf/metallb/controller
	cd test/metallb && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(CURDIR)/$(BIN)/metallb-speaker go.universe.tf/metallb/speaker

# Flannel's flanneld and its CNI plugin, for CNI=flannel (test/flannel pins flannel v0.28.11,
# test/flannel/cni the plugin of containernetworking/plugins v0.9.1).
$(BIN)/flanneld:
	cd test/flannel && CGO_ENABLED=0 $(GO) build -trimpath \
		-ldflags '-s -w -X github.com/flannel-io/flannel/pkg/version.Version=v0.28.11' -o $(CURDIR)/$@ ./flanneld

$(BIN)/flannel-cni:
	cd test/flannel/cni && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(CURDIR)/$@ \
		github.com/containernetworking/plugins/plugins/meta/flannel

# Traefik, the Ingress controller of the cluster's Ingress test (test/ingress pins it).
$(BIN)/traefik:
	cd test/ingress && CGO_ENABLED=0 $(GO) build -trimpath \
		-ldflags '-s -w -X github.com/traefik/traefik/v3/pkg/version.Version=v3.6.12' \
		-o $(CURDIR)/$@ github.com/traefik/traefik/v3/cmd/traefik

$(BIN)/helmrender:
	cd test/helmtools && $(GO) build -o $(CURDIR)/$@ .

$(BIN)/vgcluster: FORCE
	$(GO) build -o $@ ./test/cluster/vgcluster

FORCE:

cluster-apt:
	@missing=""; for p in $(CLUSTER_APT); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# cluster-deps: everything `make cluster` needs, built or installed only when missing.
cluster-deps: deps cluster-apt k8s $(BIN)/coredns $(BIN)/helmrender $(BIN)/vgcluster image $(K8S_IMAGES)

# cluster: a real cluster (2 nodes, vipgate from its chart as the only service proxy, BIRD as the
# router) left running in the background; `make cluster-down` removes it. GATEWAYS=2 puts two gateway
# hosts in front (test/cluster/gateways.go; GATEWAY_FORWARDING=nodePort|direct|route), vipgate
# installed from bin/vipgate_*_<arch>.deb (`make deb`) when there is one. PROXY=kube-proxy runs the
# real kube-proxy (KUBE_PROXY_MODE=nftables, the default, or iptables) and, with METALLB=l2 or bgp,
# the real MetalLB v0.16.2 (test/cluster/metallb.go).
cluster: cluster-deps
	$(BIN)/vgcluster up --nodes $(or $(NODES),2) --proxy $(or $(PROXY),vipgate) $(VGCLUSTER_BIN) \
		--gateways $(or $(GATEWAYS),0) --gateway-forwarding $(or $(GATEWAY_FORWARDING),nodePort) \
		--kube-proxy-mode=$(KUBE_PROXY_MODE) --metallb=$(METALLB) --cni=$(CNI)

cluster-down: $(BIN)/vgcluster
	$(BIN)/vgcluster down

# conformance: the whole [sig-network] Services e2e suite against vipgate and against kube-proxy
# (nftables mode), each in a fresh cluster built the same way; the comparison table goes to
# docs/conformance.md.
conformance: cluster-deps $(K8S_BIN)/e2e.test
	$(GO) run ./test/cluster/vgcluster conformance --focus '$(CONFORMANCE_FOCUS)' --out $(CONFORMANCE_OUT) $(VGCLUSTER_BIN) --cni=$(CNI)

# test-cluster-gateways: TestGatewaysInFront in every forwarding mode, and the SNAT pair with conntrack
# sync, with the long disruptions (1,000 held connections through a gateway package upgrade, a node
# drain and a node joining); make test runs route and one gateway death only.
GATEWAY_MODES ?= route,nodePort+sync,nodePort,direct
test-cluster-gateways: cluster-deps
	$(TEST_ENV) VIPGATE_CLUSTER_TESTS=1 VIPGATE_GATEWAY_MODES=$(GATEWAY_MODES) VIPGATE_GATEWAY_DISRUPTIONS=1 $(GO) test -count=1 -timeout 80m -v -run TestGatewaysInFront ./test/cluster/

# test-cluster-migration: TestMigration, docs/migration.md followed on a live cluster under load, on
# every path (kube-proxy nftables alone; iptables and nftables with MetalLB L2 and BGP; iptables + L2
# there and back again, kube-proxy-iptables-metallb-l2-rollback), each in a cluster of its own, ~25
# minutes in all; MIGRATION_PATHS=name,... picks some. make test runs kube-proxy-nftables only.
MIGRATION_PATHS ?= all
test-cluster-migration: cluster-deps
	$(TEST_ENV) VIPGATE_CLUSTER_TESTS=1 VIPGATE_MIGRATION_PATHS=$(MIGRATION_PATHS) $(GO) test -count=1 -timeout 150m -v -run TestMigration ./test/cluster/

# test-cluster-metallb: the real kube-proxy (iptables and nftables mode) with the real MetalLB v0.16.2
# (l2 and native BGP), a cluster per combination (TestKubeProxyMetalLB, ~6 minutes);
# METALLB_COMBOS=iptables/bgp picks some. make test leaves it out.
test-cluster-metallb: cluster-deps
	$(TEST_ENV) VIPGATE_CLUSTER_TESTS=1 VIPGATE_CLUSTER_SLOW=1 VIPGATE_METALLB_COMBOS=$(METALLB_COMBOS) \
		$(GO) test -count=1 -timeout 30m -v -run 'TestKubeProxyMetalLB$$' ./test/cluster/
