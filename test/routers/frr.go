package routers

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// frrDir is where Debian's frr package installs its daemons.
const frrDir = "/usr/lib/frr"

// FRR is a set of FRR daemons (zebra, bgpd, and bfdd when configured) running in one namespace.
//
// Debian's frr package expects one instance per host (/etc/frr, /run/frr, TCP vty ports, the
// bfdd control socket). Each daemon here is run directly in the foreground with every per-instance
// path moved into a private directory: -f config file, -i pid file, -z zebra API socket,
// --vty_socket directory, -P 0 (no TCP vty), and for bfdd --bfdctl. The daemons drop privileges to
// the frr user, so that directory is world-accessible. vtysh talks to them with --vty_socket.
type FRR struct {
	Netns string
	Dir   string
	procs []*exec.Cmd
	dones []chan struct{}
}

// FRRConfig holds the config of each daemon; an empty BFDD means bfdd is not started.
type FRRConfig struct {
	Zebra, BGPD, BFDD string
}

// StartFRR starts zebra, bgpd and (when cfg.BFDD is set) bfdd in netns, waits until bgpd answers
// vtysh, and stops them when the test ends.
func StartFRR(t testing.TB, netns string, cfg FRRConfig) *FRR {
	t.Helper()
	dir, err := os.MkdirTemp("", "vgfrr")
	if err != nil {
		t.Fatalf("creating FRR dir: %v", err)
	}
	// The daemons run as user frr and create their sockets and pid files here.
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatalf("chmod FRR dir: %v", err)
	}
	f := &FRR{Netns: netns, Dir: dir}
	t.Cleanup(func() {
		f.Stop()
		if t.Failed() {
			for _, d := range []string{"zebra", "bgpd", "bfdd"} {
				if log, err := os.ReadFile(filepath.Join(dir, d+".log")); err == nil {
					t.Logf("FRR %s log (%s):\n%s", d, netns, lastLines(string(log), 60))
				}
			}
		}
		os.RemoveAll(dir)
	})
	if cfg.Zebra == "" {
		cfg.Zebra = "hostname rtr\n"
	}
	daemons := []struct{ name, conf string }{{"zebra", cfg.Zebra}, {"bgpd", cfg.BGPD}}
	if cfg.BFDD != "" {
		daemons = append(daemons, struct{ name, conf string }{"bfdd", cfg.BFDD})
	}
	for i, d := range daemons {
		conf := filepath.Join(dir, d.name+".conf")
		if err := os.WriteFile(conf, []byte(d.conf), 0o644); err != nil {
			t.Fatalf("writing %s config: %v", d.name, err)
		}
		args := []string{filepath.Join(frrDir, d.name),
			"-f", conf, "-i", filepath.Join(dir, d.name+".pid"), "-z", filepath.Join(dir, "zserv.api"),
			"--vty_socket", dir, "-P", "0", "--log", "file:" + filepath.Join(dir, d.name+".log")}
		if d.name == "bfdd" {
			args = append(args, "--bfdctl", filepath.Join(dir, "bfdd.sock"))
		}
		argv := InNetns(netns, args...)
		cmd := exec.Command(argv[0], argv[1:]...)
		out, err := os.Create(filepath.Join(dir, d.name+".out"))
		if err != nil {
			t.Fatalf("creating %s output: %v", d.name, err)
		}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting %s in %s: %v", d.name, netns, err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); out.Close(); close(done) }()
		f.procs, f.dones = append(f.procs, cmd), append(f.dones, done)
		if i == 0 {
			// bgpd and bfdd connect to zebra; give it its socket first.
			sock := filepath.Join(dir, "zserv.api")
			if err := WaitFor(10*time.Second, func() (bool, error) {
				_, err := os.Stat(sock)
				return err == nil, err
			}); err != nil {
				t.Fatalf("zebra did not create %s: %v", sock, err)
			}
		}
	}
	err = WaitFor(15*time.Second, func() (bool, error) {
		_, err := f.Vtysh("show bgp summary")
		if err == nil && cfg.BFDD != "" {
			_, err = f.Vtysh("show bfd peers")
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("FRR did not start in %s: %v", netns, err)
	}
	return f
}

// Stop kills the daemons (in reverse order) and waits for them. Safe to call twice.
func (f *FRR) Stop() {
	for i := len(f.procs) - 1; i >= 0; i-- {
		select {
		case <-f.dones[i]:
			continue
		default:
		}
		_ = f.procs[i].Process.Kill()
		<-f.dones[i]
	}
}

// Vtysh runs one or more commands through vtysh against this instance.
func (f *FRR) Vtysh(cmds ...string) (string, error) {
	args := []string{"--vty_socket", f.Dir}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out, err := Run("vtysh", args...)
	if err == nil && strings.Contains(out, "failed to connect to any daemons") {
		err = fmt.Errorf("vtysh: %s", strings.TrimSpace(out))
	}
	return out, err
}

// Established reports whether bgpd's session with neighbor is Established.
func (f *FRR) Established(neighbor netip.Addr) (bool, error) {
	out, err := f.Vtysh(fmt.Sprintf("show bgp neighbors %s json", neighbor))
	if err != nil {
		return false, err
	}
	var m map[string]struct {
		BGPState string `json:"bgpState"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		return false, fmt.Errorf("parsing neighbor JSON: %w: %s", err, out)
	}
	n, ok := m[neighbor.String()]
	if !ok {
		return false, fmt.Errorf("no neighbor %s in %s", neighbor, out)
	}
	return n.BGPState == "Established", nil
}

// FRRNeighbor is what bgpd reports about one neighbor ("show bgp neighbors json").
type FRRNeighbor struct {
	BGPState string `json:"bgpState"`
	// ConnectionsEstablished and ConnectionsDropped count the sessions that reached Established
	// and the Established sessions that were lost, since bgpd started.
	ConnectionsEstablished int    `json:"connectionsEstablished"`
	ConnectionsDropped     int    `json:"connectionsDropped"`
	LastResetDueTo         string `json:"lastResetDueTo"`
}

// Neighbors returns bgpd's view of every neighbor, by address.
func (f *FRR) Neighbors() (map[netip.Addr]FRRNeighbor, error) {
	out, err := f.Vtysh("show bgp neighbors json")
	if err != nil {
		return nil, err
	}
	var m map[string]FRRNeighbor
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		return nil, fmt.Errorf("parsing neighbors JSON: %w: %s", err, out)
	}
	res := make(map[netip.Addr]FRRNeighbor, len(m))
	for k, v := range m {
		if a, err := netip.ParseAddr(k); err == nil {
			res[a] = v
		}
	}
	return res, nil
}

// FRRBFDPeer is one bfdd session ("show bfd peers json").
type FRRBFDPeer struct {
	Peer   string `json:"peer"`
	Local  string `json:"local"`
	Status string `json:"status"`
	// ID is bfdd's discriminator for the session, RemoteID the one it learned from the peer.
	ID       uint32 `json:"id"`
	RemoteID uint32 `json:"remote-id"`
}

// BFDPeers lists bfdd's sessions.
func (f *FRR) BFDPeers() ([]FRRBFDPeer, error) {
	out, err := f.Vtysh("show bfd peers json")
	if err != nil {
		return nil, err
	}
	var peers []FRRBFDPeer
	if err := json.Unmarshal([]byte(out), &peers); err != nil {
		return nil, fmt.Errorf("parsing BFD JSON: %w: %s", err, out)
	}
	return peers, nil
}

// BFDUp reports whether bfdd's session with peer is up.
func (f *FRR) BFDUp(peer netip.Addr) (bool, error) {
	out, err := f.Vtysh("show bfd peers json")
	if err != nil {
		return false, err
	}
	var peers []struct {
		Peer   string `json:"peer"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &peers); err != nil {
		return false, fmt.Errorf("parsing BFD JSON: %w: %s", err, out)
	}
	for _, p := range peers {
		if a, err := netip.ParseAddr(p.Peer); err == nil && a == peer {
			return p.Status == "up", nil
		}
	}
	return false, fmt.Errorf("no BFD peer %s", peer)
}

// frrPath is one path of a prefix in FRR's JSON ("show bgp <afi> unicast <prefix> json").
type frrPath struct {
	Bestpath *struct {
		Overall bool `json:"overall"`
	} `json:"bestpath"`
	ASPath struct {
		String string `json:"string"`
	} `json:"aspath"`
	LocPrf    *uint32 `json:"locPrf"`
	Community *struct {
		String string `json:"string"`
	} `json:"community"`
	LargeCommunity *struct {
		String string `json:"string"`
	} `json:"largeCommunity"`
	Nexthops []struct {
		IP    string `json:"ip"`
		Scope string `json:"scope"`
	} `json:"nexthops"`
}

func (p frrPath) route(prefix netip.Prefix) Route {
	r := Route{Prefix: prefix}
	if p.ASPath.String != "Local" {
		r.ASPath = p.ASPath.String
	}
	if p.LocPrf != nil {
		r.LocalPref = *p.LocPrf
	}
	if p.Community != nil {
		r.Communities = normCommunities(strings.Fields(p.Community.String))
	}
	if p.LargeCommunity != nil {
		r.LargeCommunities = normCommunities(strings.Fields(p.LargeCommunity.String))
	}
	for _, nh := range p.Nexthops {
		if nh.Scope == "" || nh.Scope == "global" {
			r.NextHop, _ = netip.ParseAddr(nh.IP)
			break
		}
	}
	return r
}

// Routes returns the best path of every prefix in bgpd's IPv4 and IPv6 unicast tables, with
// communities. FRR 8.4 has no "detail json" for a whole table, so the prefixes come from
// "show bgp <afi> unicast json" and their details from one vtysh run with a
// "show bgp <afi> unicast <prefix> json" per prefix.
func (f *FRR) Routes() ([]Route, error) {
	var cmds []string
	for _, afi := range []string{"ipv4", "ipv6"} {
		out, err := f.Vtysh(fmt.Sprintf("show bgp %s unicast json", afi))
		if err != nil {
			return nil, err
		}
		var table struct {
			Routes map[string]json.RawMessage `json:"routes"`
		}
		if err := json.Unmarshal([]byte(out), &table); err != nil {
			return nil, fmt.Errorf("parsing %s table JSON: %w: %s", afi, err, out)
		}
		for p := range table.Routes {
			cmds = append(cmds, fmt.Sprintf("show bgp %s unicast %s json", afi, p))
		}
	}
	if len(cmds) == 0 {
		return nil, nil
	}
	out, err := f.Vtysh(cmds...)
	if err != nil {
		return nil, err
	}
	var routes []Route
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var detail struct {
			Prefix string    `json:"prefix"`
			Paths  []frrPath `json:"paths"`
		}
		if err := dec.Decode(&detail); err != nil {
			return nil, fmt.Errorf("parsing prefix JSON: %w", err)
		}
		if detail.Prefix == "" {
			continue // withdrawn between the two vtysh runs
		}
		prefix, err := netip.ParsePrefix(detail.Prefix)
		if err != nil {
			return nil, fmt.Errorf("parsing prefix %q: %w", detail.Prefix, err)
		}
		if best, ok := bestPath(detail.Paths); ok {
			routes = append(routes, best.route(prefix))
		}
	}
	sortRoutes(routes)
	return routes, nil
}

func bestPath(paths []frrPath) (frrPath, bool) {
	for _, p := range paths {
		if p.Bestpath != nil && p.Bestpath.Overall {
			return p, true
		}
	}
	if len(paths) > 0 {
		return paths[0], true
	}
	return frrPath{}, false
}

// FRRPeer is one BGP session in a bgpd config made by FRRBGPConfig.
type FRRPeer struct {
	Neighbor netip.Addr
	PeerASN  uint32
	Password string
	// BFDProfile, when set, enables BFD for the session with this bfdd profile.
	BFDProfile string
	// EBGPMultihop allows the eBGP peer to be more than one hop away; with BFD, bgpd then asks
	// bfdd for a multi-hop session (RFC 5883).
	EBGPMultihop bool
}

// FRRBGPConfig renders a bgpd config that accepts every route from the peers (no eBGP policy
// requirement) and retries connections every second.
func FRRBGPConfig(routerID netip.Addr, asn uint32, peers ...FRRPeer) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "frr defaults traditional\nhostname rtr\n!\nrouter bgp %d\n bgp router-id %s\n no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n", asn, routerID)
	for _, p := range peers {
		n := p.Neighbor.String()
		fmt.Fprintf(&sb, " neighbor %s remote-as %d\n neighbor %s timers connect 1\n", n, p.PeerASN, n)
		if p.Password != "" {
			fmt.Fprintf(&sb, " neighbor %s password %s\n", n, p.Password)
		}
		if p.EBGPMultihop {
			fmt.Fprintf(&sb, " neighbor %s ebgp-multihop 255\n", n)
		}
		if p.BFDProfile != "" {
			fmt.Fprintf(&sb, " neighbor %s bfd profile %s\n", n, p.BFDProfile)
		}
	}
	for _, afi := range []string{"ipv4", "ipv6"} {
		fmt.Fprintf(&sb, " address-family %s unicast\n", afi)
		for _, p := range peers {
			if p.Neighbor.Is4() == (afi == "ipv4") {
				fmt.Fprintf(&sb, "  neighbor %s activate\n", p.Neighbor)
			}
		}
		sb.WriteString(" exit-address-family\n")
	}
	sb.WriteString("exit\n")
	return sb.String()
}

// FRRBFDConfig renders a bfdd config with one profile.
func FRRBFDConfig(profile string, receive, transmit time.Duration, multiplier int) string {
	return fmt.Sprintf("bfd\n profile %s\n  receive-interval %d\n  transmit-interval %d\n  detect-multiplier %d\n exit\n!\nexit\n",
		profile, receive.Milliseconds(), transmit.Milliseconds(), multiplier)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
