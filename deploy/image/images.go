package main

import (
	"io/fs"
	"os"
	"path/filepath"
)

// Repository is where vipgate's image is published; the manifests and the chart default to
// Repository:$(cat VERSION).
const Repository = "ghcr.io/vipgate/vipgate"

// defaultPath is the PATH of every image built here (containerd would otherwise use its own default).
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// NonRootUID is the unprivileged user of the image (distroless' "nonroot").
const NonRootUID = "65532"

// passwd and group hold root and nonroot, so tools that map IDs to names find them.
var (
	passwd = []byte("root:x:0:0:root:/root:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n")
	group = []byte("root:x:0:\n" +
		"nonroot:x:65532:\n")
)

// VipgateSpec is vipgate's image: the static binary, passwd/group and /tmp. The default user is
// nonroot (65532); the node DaemonSet runs it as root (runAsUser: 0) with NET_ADMIN, NET_RAW and
// NET_BIND_SERVICE because Kubernetes grants added capabilities to UID 0 only, and the controller
// runs as 65532 with none (deploy/README.md).
func VipgateSpec(binary, version string) Spec {
	return Spec{
		Name:       Repository + ":" + version,
		Entrypoint: []string{"/usr/local/bin/vipgate"},
		User:       NonRootUID + ":" + NonRootUID,
		Env:        []string{defaultPath},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "vipgate",
			"org.opencontainers.image.description": "Kubernetes kube-proxy replacement and LoadBalancer speaker",
			"org.opencontainers.image.version":     version,
			"org.opencontainers.image.source":      "https://github.com/vipgate/vipgate",
			// The repository declares no license yet; replace when it does.
			"org.opencontainers.image.licenses": "NOASSERTION",
		},
		Contents: []Content{
			{Src: binary, Dst: "/usr/local/bin/vipgate", Mode: 0o755},
			{Dst: "/etc/passwd", Data: passwd, Mode: 0o644},
			{Dst: "/etc/group", Data: group, Mode: 0o644},
			{Dst: "/tmp", Dir: true, Mode: 0o777 | fs.ModeSticky},
		},
	}
}

// TestImages are the images the test cluster needs that are built here rather than pulled: one
// entry each, built by `make test-images` into bin/images/<repository basename>.tar. bin is the
// directory holding the built binaries (pause, agnhost, ...); busybox and curl come from the
// host's Debian packages (busybox-static, curl).
func TestImages(bin string) []Spec {
	shell := []Content{
		// sh, nc, wget, ip, nslookup, ... as links to a static busybox.
		{Src: "/bin/busybox", Dst: "/bin/busybox", Mode: 0o755, Busybox: true},
		{Dst: "/tmp", Dir: true, Mode: 0o777 | fs.ModeSticky},
		{Dst: "/etc/passwd", Data: passwd, Mode: 0o644},
		{Dst: "/etc/group", Data: group, Mode: 0o644},
	}
	version, tags := testImagesVersion()
	return []Spec{
		{
			// kubernetes/build/pause, built statically from pause.c; user as upstream's Dockerfile.
			Name:       "registry.k8s.io/pause:3.10.2",
			Entrypoint: []string{"/pause"},
			User:       "65535:65535",
			Contents: []Content{
				{Src: filepath.Join(bin, "pause"), Dst: "/pause", Mode: 0o755},
			},
		},
		{
			// As upstream: ENTRYPOINT ["/agnhost"], CMD ["pause"]; plus the tools e2e tests exec in
			// agnhost pods: busybox's applets, and (like upstream's apk add curl netcat-openbsd
			// bind-tools) Debian's dynamically linked curl, OpenBSD nc (-z, -u, -v, which busybox's
			// nc lacks) and dig, each with its libraries.
			Name:       "registry.k8s.io/e2e-test-images/agnhost:" + tags.agnhost,
			Entrypoint: []string{"/agnhost"},
			Cmd:        []string{"pause"},
			Env:        []string{defaultPath},
			Contents: append([]Content{
				{Src: filepath.Join(bin, "agnhost"), Dst: "/agnhost", Mode: 0o755},
				{Src: filepath.Join(bin, "agnhost"), Libs: true}, // nothing if built with CGO_ENABLED=0
				{Src: "/usr/bin/curl", Dst: "/usr/bin/curl", Mode: 0o755},
				{Src: "/usr/bin/curl", Libs: true},
				{Src: "/bin/nc.openbsd", Dst: "/usr/bin/nc", Mode: 0o755}, // Debian netcat-openbsd
				{Src: "/bin/nc.openbsd", Libs: true},
				{Src: "/usr/bin/dig", Dst: "/usr/bin/dig", Mode: 0o755}, // Debian bind9-dnsutils
				{Src: "/usr/bin/dig", Libs: true},
				// /bin/sh is Debian's dash, not busybox: Debian's static busybox prefers its own
				// applets inside sh, so `sh -c "nc -v ..."` (what the Services tests exec) would
				// run busybox's nc, which has no -v, instead of OpenBSD's.
				{Src: "/bin/dash", Dst: "/bin/sh", Mode: 0o755},
				{Src: "/bin/dash", Libs: true},
				// Debian's wget: the static busybox's wget crashes (glibc's resolver cannot be
				// used from a static binary), and the LoadBalancer source-range test runs wget.
				{Src: "/usr/bin/wget", Dst: "/usr/bin/wget", Mode: 0o755},
				{Src: "/usr/bin/wget", Libs: true},
				// One attempt, as upstream's busybox wget: GNU wget's default is 20 tries with 1..10 s
				// pauses, so the LoadBalancer source-range test's blocked `wget -T 5` took about four
				// minutes instead of 5 s (TestAgnhostWgetTriesOnce).
				{Dst: "/etc/wgetrc", Data: []byte("tries = 1\n"), Mode: 0o644},
			}, shell...),
		},
		{
			Name:     "registry.k8s.io/e2e-test-images/busybox:" + tags.busybox,
			Cmd:      []string{"sh"},
			Env:      []string{defaultPath},
			Contents: shell,
		},
		{
			// The real kube-proxy for the conformance comparison (bin/kube-proxy from test/tools),
			// with Debian's nft, which its nftables mode runs, Debian's iptables (the nf_tables
			// variant, Debian's default alternative: iptables, iptables-save, iptables-restore and the
			// ip6tables ones as links to xtables-nft-multi, with the match and target extensions it
			// loads at run time), which its iptables mode runs, and a shell.
			Name:       "registry.k8s.io/kube-proxy:" + version,
			Entrypoint: []string{"/usr/local/bin/kube-proxy"},
			Env:        []string{defaultPath},
			Contents: append(append([]Content{
				{Src: filepath.Join(bin, "kube-proxy"), Dst: "/usr/local/bin/kube-proxy", Mode: 0o755},
				{Src: filepath.Join(bin, "kube-proxy"), Libs: true},
				{Src: "/usr/sbin/nft", Dst: "/usr/sbin/nft", Mode: 0o755},
				{Src: "/usr/sbin/nft", Libs: true},
				// iptables-legacy's lock file lives in /run; the nf_tables variant takes none.
				{Dst: "/run", Dir: true, Mode: 0o755},
			}, iptablesNFT()...), shell...),
		},
		{
			// MetalLB's controller (bin/metallb-controller, built by test/metallb from the module
			// go.universe.tf/metallb v0.16.2). Upstream's image: distroless/static with /controller as
			// the entrypoint; its manifest runs it as 65534. Manifest: test/cluster/manifests/metallb-native.yaml.
			Name:       "quay.io/metallb/controller:v0.16.2",
			Entrypoint: []string{"/controller"},
			Contents: []Content{
				{Src: filepath.Join(bin, "metallb-controller"), Dst: "/controller", Mode: 0o755},
				{Dst: "/etc/passwd", Data: passwd, Mode: 0o644},
				{Dst: "/etc/group", Data: group, Mode: 0o644},
				{Dst: "/tmp", Dir: true, Mode: 0o777 | fs.ModeSticky},
			},
		},
		{
			// MetalLB's speaker (bin/metallb-speaker, the same module), native BGP mode: upstream's
			// image also carries FRR mode's helpers (frr-metrics, cp-tool, frr-reloader.sh), which
			// metallb-native.yaml never runs.
			Name:       "quay.io/metallb/speaker:v0.16.2",
			Entrypoint: []string{"/speaker"},
			Contents: []Content{
				{Src: filepath.Join(bin, "metallb-speaker"), Dst: "/speaker", Mode: 0o755},
				{Dst: "/etc/passwd", Data: passwd, Mode: 0o644},
				{Dst: "/etc/group", Data: group, Mode: 0o644},
				{Dst: "/tmp", Dir: true, Mode: 0o777 | fs.ModeSticky},
			},
		},
		{
			// Flannel, the CNI of the test cluster's CNI=flannel runs (test/cluster/flannel.go,
			// manifests/flannel.yaml): flanneld from its Go module (test/flannel, bin/flanneld) at
			// upstream's /opt/bin/flanneld, with Debian's nft (its nftables mode runs it) and
			// iptables (it cleans up its iptables rules at start), plus the flannel CNI plugin at
			// /flannel (bin/flannel-cni, test/flannel/cni), which upstream ships as a second image
			// (flannel-cni-plugin); the shell's cp installs it on the node.
			Name:       "ghcr.io/flannel-io/flannel:v0.28.11",
			Entrypoint: []string{"/opt/bin/flanneld"},
			Env:        []string{defaultPath},
			Contents: append(append([]Content{
				{Src: filepath.Join(bin, "flanneld"), Dst: "/opt/bin/flanneld", Mode: 0o755},
				{Src: filepath.Join(bin, "flannel-cni"), Dst: "/flannel", Mode: 0o755},
				{Src: "/usr/sbin/nft", Dst: "/usr/sbin/nft", Mode: 0o755},
				{Src: "/usr/sbin/nft", Libs: true},
				{Dst: "/run", Dir: true, Mode: 0o755},
			}, iptablesNFT()...), shell...),
		},
		{
			// The cluster DNS, built from Go modules by test/coredns (bin/coredns).
			Name:       "registry.k8s.io/coredns/coredns:v1.12.4",
			Entrypoint: []string{"/coredns"},
			Contents: []Content{
				{Src: filepath.Join(bin, "coredns"), Dst: "/coredns", Mode: 0o755},
			},
		},
		{
			// Traefik, the Ingress controller of test/cluster's TestIngress, built from its Go module
			// by test/ingress (bin/traefik). Upstream's image runs /entrypoint.sh, which execs
			// traefik; this one runs the binary directly. Manifest: test/cluster/manifests/ingress.yaml.
			Name:       "docker.io/library/traefik:v3.6.12",
			Entrypoint: []string{"/usr/local/bin/traefik"},
			Env:        []string{defaultPath},
			Contents: []Content{
				{Src: filepath.Join(bin, "traefik"), Dst: "/usr/local/bin/traefik", Mode: 0o755},
				{Dst: "/etc/passwd", Data: passwd, Mode: 0o644},
				{Dst: "/etc/group", Data: group, Mode: 0o644},
				{Dst: "/tmp", Dir: true, Mode: 0o777 | fs.ModeSticky},
			},
		},
		{
			// The lab's TCP/UDP/HTTP server (test/labserver) as pods, for the disruption tests'
			// long-lived connections (test/cluster/disruption_test.go). bin/labserver must be a
			// static build: CGO_ENABLED=0 go build -o bin/labserver ./test/labserver.
			Name:       "vipgate.test/labserver:1",
			Entrypoint: []string{"/labserver"},
			Contents: []Content{
				{Src: filepath.Join(bin, "labserver"), Dst: "/labserver", Mode: 0o755},
			},
		},
	}
}

// iptablesNFT is Debian's iptables package as kube-proxy's iptables mode needs it: xtables-nft-multi
// with its libraries, the commands kube-proxy runs as links to it, and every extension in the
// host's xtables directory (libxt_comment, _conntrack, _mark, _statistic, _recent, _addrtype,
// libipt_MASQUERADE, _DNAT, _REJECT, ...), which it dlopens from the same path.
func iptablesNFT() []Content {
	const multi = "/usr/sbin/xtables-nft-multi"
	cs := []Content{
		{Src: multi, Dst: multi, Mode: 0o755},
		{Src: multi, Libs: true},
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, cmd := range []string{"", "-save", "-restore"} {
			cs = append(cs, Content{Dst: "/usr/sbin/" + fam + cmd, Link: "xtables-nft-multi"},
				Content{Dst: "/usr/sbin/" + fam + "-nft" + cmd, Link: "xtables-nft-multi"})
		}
	}
	exts, _ := filepath.Glob("/usr/lib/*-linux-gnu/xtables/*.so")
	for _, e := range exts {
		// A few need more libraries than xtables-nft-multi itself (libnetfilter_conntrack, libm).
		cs = append(cs, Content{Src: e, Dst: e, Mode: 0o644}, Content{Src: e, Libs: true})
	}
	return cs
}

// KubeVersionEnv selects the Kubernetes version the test images are for: kube-proxy's tag and the
// agnhost and busybox tags that version's e2e.test expects. Unset: DefaultKubeVersion. cluster.mk
// sets it when it builds the images of another version (`make k8s-images K8S_VERSION=v1.37.2`).
const KubeVersionEnv = "TEST_IMAGES_K8S_VERSION"

// DefaultKubeVersion is the project's test version (test/tools).
const DefaultKubeVersion = "v1.36.3"

// e2eImageTags are the agnhost and busybox tags of each version's e2e.test
// (k8s.io/kubernetes/test/utils/image/manifest.go); pause (3.10.2) is the same in both.
var e2eImageTags = map[string]struct{ agnhost, busybox string }{
	"v1.36.3": {agnhost: "2.63.0", busybox: "1.37.0-1"},
	"v1.37.2": {agnhost: "2.66.1", busybox: "1.37.0-2"},
}

// testImagesVersion is the version from KubeVersionEnv and its e2e image tags (the default
// version's for a version not in the table).
func testImagesVersion() (string, struct{ agnhost, busybox string }) {
	v := os.Getenv(KubeVersionEnv)
	if v == "" {
		v = DefaultKubeVersion
	}
	tags, ok := e2eImageTags[v]
	if !ok {
		tags = e2eImageTags[DefaultKubeVersion]
	}
	return v, tags
}
