package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// kubeProxyIPTablesRules is what kube-proxy's iptables mode writes with iptables-restore, one rule
// of each kind (its proxier's matches and targets: comment, conntrack, mark/MARK, statistic, recent,
// addrtype, MASQUERADE --random-fully, DNAT, REJECT).
const kubeProxyIPTablesRules = `*filter
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-SERVICES
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m comment --comment "ns/svc has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-EXTERNAL-SERVICES -m addrtype --dst-type LOCAL -p tcp -m comment --comment "ns/svc has no endpoints" -m tcp --dport 30001 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-SVC-X - [0:0]
:KUBE-SEP-A - [0:0]
:KUBE-SEP-B - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "ns/svc cluster IP" -m tcp --dport 80 -j KUBE-SVC-X
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-X ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m comment --comment "ns/svc cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-X -p tcp -m comment --comment "ns/svc" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-B --mask 255.255.255.255 --rsource -j KUBE-SEP-B
-A KUBE-SVC-X -m comment --comment "ns/svc -> 10.244.1.2:80" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-A
-A KUBE-SVC-X -m comment --comment "ns/svc -> 10.244.2.2:80" -j KUBE-SEP-B
-A KUBE-SEP-A -s 10.244.1.2/32 -m comment --comment "ns/svc" -j KUBE-MARK-MASQ
-A KUBE-SEP-A -p tcp -m comment --comment "ns/svc" -m recent --set --name KUBE-SEP-A --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.244.1.2:80
-A KUBE-SEP-B -p tcp -m comment --comment "ns/svc" -m tcp -j DNAT --to-destination 10.244.2.2:80
COMMIT
`

// TestKubeProxyImageIPTables builds the kube-proxy test image from the TestImages table (with a
// stand-in for kube-proxy), unpacks it and, in a network namespace of its own, loads kube-proxy's
// iptables-mode rules with the image's own iptables-restore and reads them back with its
// iptables-save: the binary, its libraries and the extensions it dlopens all came along, and this
// kernel's nf_tables xt compat takes every match and target kube-proxy uses.
func TestKubeProxyImageIPTables(t *testing.T) {
	if testing.Short() {
		t.Skip("runs programs in a chroot and a network namespace")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for chroot and network namespaces")
	}
	for _, p := range []string{"/usr/sbin/xtables-nft-multi", "/usr/sbin/nft", "/bin/busybox", "/usr/sbin/chroot", "/usr/bin/ldd"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("needs %s (Debian iptables, nftables, busybox-static; make test-images installs them)", p)
		}
	}
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "kube-proxy"), []byte("#!/bin/sh\necho kube-proxy \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	root := unpackTestImage(t, bin, "kube-proxy.tar")

	ns := fmt.Sprintf("vg%d-kpipt", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	inImage := func(stdin string, args ...string) (string, error) {
		cmd := exec.Command("ip", append([]string{"netns", "exec", ns, "chroot", root}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := inImage("", "iptables", "--version"); err != nil || !strings.Contains(out, "nf_tables") {
		t.Fatalf("iptables --version: %v\n%s", err, out)
	}
	if out, err := inImage(kubeProxyIPTablesRules, "iptables-restore", "--noflush", "-w", "5"); err != nil {
		t.Fatalf("iptables-restore: %v\n%s", err, out)
	}
	saved, err := inImage("", "iptables-save")
	if err != nil {
		t.Fatalf("iptables-save: %v\n%s", err, saved)
	}
	for _, want := range []string{"-m statistic --mode random --probability 0.5", "-m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-B",
		"-j MASQUERADE --random-fully", "-j DNAT --to-destination 10.244.1.2:80", "-m addrtype --dst-type LOCAL",
		"-m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT", "-j MARK --",
		"--reject-with icmp-port-unreachable"} {
		if !strings.Contains(saved, want) {
			t.Errorf("iptables-save lacks %q", want)
		}
	}
	if out, err := inImage("", "ip6tables", "-t", "nat", "-L", "-n"); err != nil {
		t.Errorf("ip6tables: %v\n%s", err, out)
	}
	if out, err := inImage("", "nft", "list", "ruleset"); err != nil || !strings.Contains(out, "KUBE-SVC-X") {
		t.Errorf("nft list ruleset (the image's nft sees the iptables-nft tables): %v\n%s", err, out)
	}
}

// unpackTestImage builds the TestImages entry written as file (e.g. "kube-proxy.tar") from bin and
// unpacks its layer into a directory.
func unpackTestImage(t *testing.T, bin, file string) string {
	t.Helper()
	var spec *Spec
	for _, s := range TestImages(bin) {
		if f, _ := archiveName(s.Name); f == file {
			spec = &s
		}
	}
	if spec == nil {
		t.Fatalf("no %s in TestImages", file)
	}
	opts := testOpts
	opts.Platform.Arch = runtime.GOARCH
	_, archive := build(t, *spec, opts)
	layout := extractArchive(t, archive)
	var index v1.IndexManifest
	if err := json.Unmarshal(readFile(t, filepath.Join(layout, "index.json")), &index); err != nil {
		t.Fatal(err)
	}
	var manifest v1.Manifest
	d := index.Manifests[0].Digest
	if err := json.Unmarshal(readFile(t, filepath.Join(layout, "blobs", d.Algorithm, d.Hex)), &manifest); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	l := manifest.Layers[0].Digest
	if out, err := exec.Command("tar", "-xzf", filepath.Join(layout, "blobs", l.Algorithm, l.Hex), "-C", root).CombinedOutput(); err != nil {
		t.Fatalf("unpacking the layer: %v\n%s", err, out)
	}
	return root
}
