package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/test/lab"
)

// controlPlane measures what a user sees: `vipgate node --manifests DIR` runs in node1 with
// `background` synthetic Services in the directory; for each change a Service file is written (and
// awaited: the client's connections are refused, so it is programmed without endpoints), then its
// EndpointSlice file, and the time from that write (an atomic rename) to the first connection from
// the client through the ClusterIP to pod1 is taken.
func controlPlane(t *table, pl *packetLab, bin string, background, changes int) {
	what := fmt.Sprintf("EndpointSlice file written -> first connection through its ClusterIP, `vipgate node --manifests`, %s Services, p50 / p99 of %d",
		thousands(background+1), changes)
	dir, err := pl.controlPlaneDir("cp")
	if err != nil {
		t.fail(what, err)
		return
	}
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.fail(what, err)
		return
	}
	cfg := filepath.Join(dir, "node1.yaml")
	if err := os.WriteFile(cfg, []byte(nodeConfigYAML(pl.node)), 0o644); err != nil {
		t.fail(what, err)
		return
	}
	var bg bytes.Buffer
	for i := 0; i < background; i++ {
		svc, es := synthService(i, 10)
		bg.WriteString(serviceYAML(svc, 8080))
		bg.WriteString(sliceYAML(es))
	}
	if err := writeAtomic(manifests, "background.yaml", bg.Bytes()); err != nil {
		t.fail(what, err)
		return
	}
	proc, err := pl.l.Start(thisNode, filepath.Join(dir, "vipgate.log"), bin, "node", "--config", cfg, "--manifests", manifests, "--log-level", "warn")
	if err != nil {
		t.fail(what, err)
		return
	}
	defer proc.Stop()
	failf := func(format string, args ...any) {
		t.fail(what, fmt.Errorf(format+"; vipgate log: %s", append(args, oneLine(proc.Tail(5)))...))
	}

	lat, err := pl.probeChanges(changes, 254, func(svc *cluster.Service, _ *cluster.EndpointSlice) error {
		return writeAtomic(manifests, svc.Key.Name+"-service.yaml", []byte(serviceYAML(svc, 8080)))
	}, func(_ *cluster.Service, es *cluster.EndpointSlice) error {
		return writeAtomic(manifests, es.Service.Name+"-slice.yaml", []byte(sliceYAML(es)))
	})
	if err != nil {
		failf("%v", err)
		return
	}
	t.add(row{What: what, Vipgate: fmtDuration(quantile(lat, 0.5)) + " / " + fmtDuration(quantile(lat, 0.99)),
		Ref: "the file source waits for 50 ms of quiet before it reloads (fileDebounce)"})
}

// controlPlaneDir clears node1 (the packet tests left their table there; vipgate starts from a clean
// namespace) and makes a directory for one control-plane row, removed at exit.
func (pl *packetLab) controlPlaneDir(kind string) (string, error) {
	prog := &dataplane.NetlinkProgrammer{NetNSFd: int(pl.nodeF.Fd())}
	if err := prog.DeleteTable(cluster.IPv4, "vipgate"); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("vg%d-bench-%s-", os.Getpid(), kind))
	if err != nil {
		return "", err
	}
	atExit(func() { os.RemoveAll(dir) })
	return dir, nil
}

// probeChanges makes changes+1 probe Services (ClusterIP 10.96.<octet>.<1+i>, port 80, one endpoint:
// pod1:8080): addService makes the Service exist, and is awaited (the client's connections are
// refused: it is programmed without endpoints); then addSlice adds its EndpointSlice, and the time
// from addSlice's return to the client's first connection through the ClusterIP is taken. Change 0
// also waits for vipgate's first full sync, and is not counted.
func (pl *packetLab) probeChanges(changes int, octet byte, addService, addSlice func(*cluster.Service, *cluster.EndpointSlice) error) ([]time.Duration, error) {
	var lat []time.Duration
	for i := 0; i <= changes; i++ {
		ip := netip.AddrFrom4([4]byte{10, 96, octet, byte(1 + i)})
		svc := &cluster.Service{Key: cluster.ServiceKey{Namespace: benchNamespace, Name: fmt.Sprintf("probe-%d-%03d", octet, i)},
			Type: cluster.TypeClusterIP, ClusterIPs: []netip.Addr{ip}, Ports: []cluster.ServicePort{{Protocol: cluster.TCP, Port: 80}}}
		es := &cluster.EndpointSlice{Namespace: benchNamespace, Name: svc.Key.Name + "-abcde", Service: svc.Key, Family: cluster.IPv4,
			Ports:     []cluster.EndpointPort{{Protocol: cluster.TCP, Port: 8080}},
			Endpoints: []cluster.Endpoint{{Addresses: []netip.Addr{pl.pod.IPv4}, Ready: true, Serving: true, NodeName: thisNode}}}
		addr := netip.AddrPortFrom(ip, 80).String()
		timeout := "10s"
		if i == 0 {
			timeout = "30s"
		}
		if _, err := pl.waitConn(addr, "refused", timeout, func() error { return addService(svc, es) }); err != nil {
			return nil, fmt.Errorf("change %d: the Service without endpoints was not rejected: %w", i, err)
		}
		var added time.Time
		at, err := pl.waitConn(addr, "ok", "10s", func() error {
			err := addSlice(svc, es)
			added = time.Now()
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("change %d: no connection after the EndpointSlice was added: %w", i, err)
		}
		if i > 0 {
			lat = append(lat, at.Sub(added))
		}
	}
	return lat, nil
}

// waitConn runs the waitconn generator in the client namespace, calls action once it is probing and
// returns the time of the outcome it waited for.
func (pl *packetLab) waitConn(addr, until, timeout string, action func() error) (time.Time, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", pl.l.NS(lab.RoleClient), pl.self, "waitconn",
		"--addr", addr, "--until", until, "--timeout", timeout)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return time.Time{}, err
	}
	if err := cmd.Start(); err != nil {
		cancel()
		return time.Time{}, fmt.Errorf("starting waitconn: %w", err)
	}
	// On success the generator has already exited; on an error it must not probe on until its timeout.
	defer func() { cancel(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || sc.Text() != "ready" {
		return time.Time{}, fmt.Errorf("waitconn did not start: %q %s", sc.Text(), stderr.String())
	}
	if err := action(); err != nil {
		return time.Time{}, err
	}
	if !sc.Scan() {
		return time.Time{}, fmt.Errorf("waitconn ended without a result: %s", stderr.String())
	}
	line := sc.Text()
	if !strings.HasPrefix(line, until+" ") {
		return time.Time{}, fmt.Errorf("waiting for %s on %s: %s", until, addr, line)
	}
	ns, err := strconv.ParseInt(lastKV(line)["at"], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("waitconn: bad line %q", line)
	}
	return time.Unix(0, ns), nil
}

// writeAtomic writes name in dir through a dot-file and a rename: the file source ignores dot-files
// and never sees half a manifest.
func writeAtomic(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, name))
}

func nodeConfigYAML(n *lab.Node) string {
	return fmt.Sprintf(`apiVersion: vipgate.io/v1alpha1
kind: NodeConfig
nodeName: %s
nodeIPs: [%q]
clusterCIDRs: [%q]
serviceCIDRs: [%q]
healthzBindAddress: "127.0.0.1:10256"
metricsBindAddress: "127.0.0.1:10249"
`, n.Name, n.IPv4, lab.ClusterCIDRv4, lab.ServiceCIDRv4)
}

// serviceYAML is svc as a v1 Service manifest (the fields the synthetic generator sets).
func serviceYAML(svc *cluster.Service, targetPort int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: %s}\nspec:\n  type: %s\n", svc.Key.Name, svc.Key.Namespace, svc.Type)
	fmt.Fprintf(&b, "  clusterIP: %s\n  clusterIPs: [%s]\n  ipFamilies: [IPv4]\n  ports:\n", svc.ClusterIPs[0], svc.ClusterIPs[0])
	for _, p := range svc.Ports {
		fmt.Fprintf(&b, "    - {protocol: %s, port: %d, targetPort: %d", p.Protocol, p.Port, targetPort)
		if p.NodePort != 0 {
			fmt.Fprintf(&b, ", nodePort: %d", p.NodePort)
		}
		b.WriteString("}\n")
	}
	if svc.Type != cluster.TypeClusterIP {
		policy := "Cluster"
		if svc.ExternalPolicyLocal {
			policy = "Local"
		}
		fmt.Fprintf(&b, "  externalTrafficPolicy: %s\n", policy)
	}
	if svc.HealthCheckNodePort != 0 {
		fmt.Fprintf(&b, "  healthCheckNodePort: %d\n", svc.HealthCheckNodePort)
	}
	if svc.AffinityTimeout > 0 {
		fmt.Fprintf(&b, "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: %d}}\n", int(svc.AffinityTimeout.Seconds()))
	}
	if len(svc.LoadBalancerIPs) > 0 {
		b.WriteString("status:\n  loadBalancer:\n    ingress:\n")
		for _, ip := range svc.LoadBalancerIPs {
			fmt.Fprintf(&b, "      - {ip: %s}\n", ip)
		}
	}
	return b.String()
}

// sliceYAML is es as a discovery/v1 EndpointSlice manifest.
func sliceYAML(es *cluster.EndpointSlice) string {
	var b strings.Builder
	fmt.Fprintf(&b, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: %s\n  namespace: %s\n  labels: {kubernetes.io/service-name: %s}\naddressType: IPv4\nports:\n",
		es.Name, es.Namespace, es.Service.Name)
	for _, p := range es.Ports {
		fmt.Fprintf(&b, "  - {protocol: %s, port: %d}\n", p.Protocol, p.Port)
	}
	b.WriteString("endpoints:\n")
	for _, ep := range es.Endpoints {
		fmt.Fprintf(&b, "  - addresses: [%s]\n    nodeName: %s\n    conditions: {ready: %t, serving: %t, terminating: %t}\n",
			ep.Addresses[0], ep.NodeName, ep.Ready, ep.Serving, ep.Terminating)
	}
	return b.String()
}
