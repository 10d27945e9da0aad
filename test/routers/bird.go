package routers

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BIRD is a BIRD 2 daemon running in a namespace with its own control socket.
type BIRD struct {
	Netns  string
	Dir    string // temp dir with bird.conf, bird.ctl and bird.log
	Socket string
	cmd    *exec.Cmd
	done   chan struct{}
}

// StartBIRD writes config to a temp dir and runs `bird -f` inside netns with a private control
// socket, waits until it answers, and stops it when the test ends.
func StartBIRD(t testing.TB, netns, config string) *BIRD {
	t.Helper()
	dir := t.TempDir()
	b := &BIRD{Netns: netns, Dir: dir, Socket: filepath.Join(dir, "bird.ctl"), done: make(chan struct{})}
	conf := filepath.Join(dir, "bird.conf")
	if err := os.WriteFile(conf, []byte(config), 0o644); err != nil {
		t.Fatalf("writing BIRD config: %v", err)
	}
	logf, err := os.Create(filepath.Join(dir, "bird.log"))
	if err != nil {
		t.Fatalf("creating BIRD log: %v", err)
	}
	argv := InNetns(netns, "bird", "-f", "-c", conf, "-s", b.Socket, "-P", filepath.Join(dir, "bird.pid"))
	b.cmd = exec.Command(argv[0], argv[1:]...)
	b.cmd.Stdout, b.cmd.Stderr = logf, logf
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("starting BIRD in %s: %v", netns, err)
	}
	go func() { _ = b.cmd.Wait(); logf.Close(); close(b.done) }()
	t.Cleanup(func() {
		b.Stop()
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "bird.log"))
			t.Logf("BIRD log (%s):\n%s", netns, log)
		}
	})
	err = WaitFor(10*time.Second, func() (bool, error) {
		select {
		case <-b.done:
			return false, fmt.Errorf("bird exited")
		default:
		}
		_, err := b.Birdc("show", "status")
		return err == nil, err
	})
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "bird.log"))
		t.Fatalf("BIRD did not start: %v\n%s", err, log)
	}
	return b
}

// Stop kills BIRD and waits for it to exit. Safe to call twice.
func (b *BIRD) Stop() {
	select {
	case <-b.done:
		return
	default:
	}
	_ = b.cmd.Process.Kill()
	<-b.done
}

// Birdc runs a birdc command against this BIRD and returns its output.
func (b *BIRD) Birdc(args ...string) (string, error) {
	return Run("birdc", append([]string{"-s", b.Socket}, args...)...)
}

// Established reports whether the BGP protocol whose neighbor is addr is Established.
func (b *BIRD) Established(addr netip.Addr) (bool, error) {
	out, err := b.Birdc("show", "protocols", "all")
	if err != nil {
		return false, err
	}
	var state string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[0] == "BGP" && f[1] == "state:":
			state = f[2]
		case len(f) >= 3 && f[0] == "Neighbor" && f[1] == "address:":
			if a, err := netip.ParseAddr(f[2]); err == nil && a == addr {
				return state == "Established", nil
			}
		}
	}
	return false, fmt.Errorf("no BGP protocol with neighbor %s", addr)
}

// Routes returns the best route of every prefix in BIRD's tables (`show route all`).
func (b *BIRD) Routes() ([]Route, error) {
	out, err := b.Birdc("show", "route", "all")
	if err != nil {
		return nil, err
	}
	return parseBIRDRoutes(out)
}

// RoutesFrom returns the routes BIRD learned from one protocol (session), best or not.
func (b *BIRD) RoutesFrom(protocol string) ([]Route, error) {
	out, err := b.Birdc("show", "route", "protocol", protocol, "all")
	if err != nil {
		return nil, err
	}
	return parseBIRDRoutes(out)
}

// Count returns how many routes BIRD has (`show route count`), cheaper than Routes for big tables.
func (b *BIRD) Count() (int, error) {
	out, err := b.Birdc("show", "route", "count")
	if err != nil {
		return 0, err
	}
	// "2002 of 2002 routes for 2002 networks in table master4" per table.
	total := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[1] == "of" && f[3] == "routes" {
			n, err := strconv.Atoi(f[0])
			if err != nil {
				return 0, fmt.Errorf("parsing %q: %w", line, err)
			}
			total += n
		}
	}
	return total, nil
}

// parseBIRDRoutes reads `birdc show route all`. A route starts at a line beginning with its prefix;
// an alternative path of the same prefix starts with blanks and is skipped (the first is the best);
// its attributes are tab-indented "BGP.name: value" lines.
func parseBIRDRoutes(out string) ([]Route, error) {
	var routes []Route
	var cur *Route
	skip := false
	flush := func() {
		if cur != nil {
			cur.Communities = normCommunities(cur.Communities)
			cur.LargeCommunities = normCommunities(cur.LargeCommunities)
			routes = append(routes, *cur)
			cur = nil
		}
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "" || strings.HasPrefix(line, "BIRD ") || strings.HasPrefix(line, "Table "):
			continue
		case line[0] != ' ' && line[0] != '\t':
			flush()
			skip = false
			pfx, err := netip.ParsePrefix(strings.Fields(line)[0])
			if err != nil {
				return nil, fmt.Errorf("parsing route line %q: %w", line, err)
			}
			cur = &Route{Prefix: pfx}
		case line[0] == ' ':
			// Another path for the same prefix.
			skip = true
		case cur != nil && !skip:
			key, val, ok := strings.Cut(strings.TrimSpace(line), ": ")
			if !ok {
				key, val = strings.TrimSuffix(strings.TrimSpace(line), ":"), ""
			}
			switch key {
			case "BGP.next_hop":
				if f := strings.Fields(val); len(f) > 0 {
					cur.NextHop, _ = netip.ParseAddr(f[0])
				}
			case "BGP.local_pref":
				n, _ := strconv.ParseUint(val, 10, 32)
				cur.LocalPref = uint32(n)
			case "BGP.as_path":
				cur.ASPath = strings.Join(strings.Fields(val), " ")
			case "BGP.community":
				cur.Communities = parseBIRDTuples(val)
			case "BGP.large_community":
				cur.LargeCommunities = parseBIRDTuples(val)
			}
		}
	}
	flush()
	sortRoutes(routes)
	return routes, sc.Err()
}

// parseBIRDTuples turns "(65000,100) (65535,0)" or "(65000, 1, 2)" into "65000:100", "65000:1:2".
func parseBIRDTuples(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ")") {
		part = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(part), "("))
		if part == "" {
			continue
		}
		fields := strings.Split(part, ",")
		for i := range fields {
			fields[i] = strings.TrimSpace(fields[i])
		}
		out = append(out, strings.Join(fields, ":"))
	}
	return out
}

// BIRDPeer is one BGP session in a BIRD config made by BIRDConfig.
type BIRDPeer struct {
	Name     string // protocol name
	Local    netip.Addr
	LocalASN uint32
	Neighbor netip.Addr
	PeerASN  uint32
	Password string // TCP MD5
	// Passive makes BIRD wait for the speaker to connect.
	Passive bool
}

// BIRDConfig renders a BIRD 2 config that learns every route from the peers and exports none.
// Sessions are "direct" (next hop on the shared link) for iBGP too, so no IGP is needed. BIRD's
// default "graceful restart aware" makes it a graceful restart helper.
func BIRDConfig(routerID netip.Addr, peers ...BIRDPeer) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "router id %s;\nlog stderr all;\nprotocol device {}\n", routerID)
	for _, p := range peers {
		ch := "ipv4"
		if p.Neighbor.Is6() {
			ch = "ipv6"
		}
		fmt.Fprintf(&sb, "protocol bgp %s {\n  local %s as %d;\n  neighbor %s as %d;\n  direct;\n  hold time 9;\n  connect retry time 1;\n",
			p.Name, p.Local, p.LocalASN, p.Neighbor, p.PeerASN)
		if p.Password != "" {
			fmt.Fprintf(&sb, "  password %q;\n", p.Password)
		}
		if p.Passive {
			sb.WriteString("  passive on;\n")
		}
		fmt.Fprintf(&sb, "  %s { import all; export none; };\n}\n", ch)
	}
	return sb.String()
}

// NextHops lists the next hops of prefix in BIRD's table (every path: several with ECMP), sorted.
func (b *BIRD) NextHops(prefix string) []string {
	out, _ := b.Birdc("show", "route", "for", prefix, "all")
	var hops []string
	for _, m := range birdVia.FindAllStringSubmatch(out, -1) {
		hops = append(hops, m[1])
	}
	slices.Sort(hops)
	return slices.Compact(hops)
}

var birdVia = regexp.MustCompile(`via ([0-9a-fA-F.:]+)`)
