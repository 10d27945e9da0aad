package explain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/speaker"
)

// This file is `vipgate explain --service NS/NAME` and `--vip ADDR`: both halves of a VIP in one
// report. The speaker's half (who owns or advertises each VIP, why, to which peers) comes from the
// speaker's own deciders (speaker.ExplainVIPs: offline from the manifests, every speaker assumed
// alive) or from the running agent's admin endpoint (/explain, its live decisions); the
// dataplane's half is Trace, for a packet from a client to each VIP port.

// DefaultClient4 and DefaultClient6 are the synthetic clients of the traces: addresses outside the
// cluster, arriving on an interface.
var (
	DefaultClient4 = netip.MustParseAddr("203.0.113.254")
	DefaultClient6 = netip.MustParseAddr("2001:db8:ffff::fe")
)

// ServiceOptions says what to explain, and from what.
type ServiceOptions struct {
	Query speaker.ExplainQuery
	// Config and Manifests: offline, the config's node (a NodeConfig) and the manifests. Without
	// Manifests: live, Admin is the agent's admin endpoint and the traces read the kernel's table.
	Config             any
	Manifests          string
	AllowWorldWritable bool
	Admin              netip.AddrPort
	Table              string
	// Client4 and Client6 are the traces' client addresses (invalid: DefaultClient4, 6).
	Client4, Client6 netip.Addr
}

// ServiceReport is what `vipgate explain --service/--vip` prints: as JSON, or in words (WriteText).
type ServiceReport struct {
	// Query is "service NS/NAME" or "vip ADDR".
	Query string `json:"query"`
	// Mode is "offline" (manifests and config) or "live" (the running agent and kernel).
	Mode string `json:"mode"`
	// Node is the node whose view and ruleset this is.
	Node string `json:"node"`
	// Notes say what the report assumes or cannot know.
	Notes []string    `json:"notes,omitempty"`
	VIPs  []VIPReport `json:"vips"`
}

// VIPReport is one VIP: how the speakers announce it, and what the ruleset does with its ports.
type VIPReport struct {
	speaker.VIPExplanation
	Ports []PortReport `json:"ports"`
}

// PortReport is the trace of a new connection from the client to one VIP port.
type PortReport struct {
	Service  string `json:"service"`
	Port     uint16 `json:"port"`
	Protocol string `json:"protocol"`
	// Outcome and Summary are the trace's (DNAT, DROP, REJECT, ACCEPT, ...).
	Outcome  string      `json:"outcome"`
	Summary  string      `json:"summary"`
	Backends []Candidate `json:"backends"`
	// Trace is the whole trace: the rules the packet meets (Steps) and why.
	Trace *Report `json:"trace"`
}

// ExplainService explains the VIPs of o.Query: offline with o.Manifests, else live.
func ExplainService(o ServiceOptions) (*ServiceReport, error) {
	rep := &ServiceReport{VIPs: []VIPReport{}}
	if o.Query.Service != (cluster.ServiceKey{}) {
		rep.Query = "service " + o.Query.Service.String()
	} else {
		rep.Query = "vip " + o.Query.VIP.String()
	}
	var (
		spk   speaker.Explanation
		topts = Options{Table: o.Table, Config: o.Config}
		err   error
	)
	if o.Manifests != "" {
		rep.Mode = "offline"
		node, ok := o.Config.(*cluster.NodeConfig)
		if !ok {
			return nil, errors.New("--service and --vip with --manifests need --config with a NodeConfig (the node whose view and ruleset are explained)")
		}
		off, err := LoadOffline(node, o.Manifests, o.AllowWorldWritable, "")
		if err != nil {
			return nil, err
		}
		if spk, err = speaker.ExplainVIPs(speaker.ExplainInput{State: off.State, Query: o.Query, Self: node.NodeName,
			Speakers: offlineSpeakers(node, off.State)}, false); err != nil {
			return nil, err
		}
		rep.Notes = append(rep.Notes,
			"offline: every speaker is assumed alive and hearing a majority (the membership is not known from manifests), and no link is down",
			fmt.Sprintf("offline: the traces are of the ruleset rendered for %s; the speakers are the config's speaker.members, else the Nodes of the manifests", node.NodeName))
		topts.Manifests, topts.AllowWorldWritable, topts.off = o.Manifests, o.AllowWorldWritable, off
	} else {
		rep.Mode = "live"
		if spk, err = FetchSpeaker(o.Admin, o.Query, 5*time.Second); err != nil {
			return nil, err
		}
		rep.Notes = append(rep.Notes, "live: the speaker's decisions from its admin endpoint at "+o.Admin.String()+"; the traces are of this host's kernel table")
	}
	rep.Node = spk.Node
	rep.Notes = append(rep.Notes, spk.Notes...)
	for _, v := range spk.VIPs {
		vr := VIPReport{VIPExplanation: v, Ports: []PortReport{}}
		client := cmpAddr(o.Client4, DefaultClient4)
		if v.IP.Is6() {
			client = cmpAddr(o.Client6, DefaultClient6)
		}
		for _, sp := range v.Services {
			for _, p := range sp.Ports {
				t := topts
				t.Dst, t.Src = netip.AddrPortFrom(v.IP, p.Port), client
				if t.Proto = dataplane.ProtoNumber(cluster.Protocol(p.Protocol)); t.Proto == 0 {
					continue
				}
				tr, err := Trace(t)
				if err != nil {
					return nil, fmt.Errorf("tracing %s port %d/%s: %w", v.IP, p.Port, p.Protocol, err)
				}
				pr := PortReport{Service: sp.Service, Port: p.Port, Protocol: p.Protocol, Outcome: tr.Outcome, Summary: tr.Summary,
					Backends: tr.Candidates, Trace: tr}
				if pr.Backends == nil {
					pr.Backends = []Candidate{}
				}
				vr.Ports = append(vr.Ports, pr)
			}
		}
		rep.VIPs = append(rep.VIPs, vr)
	}
	return rep, nil
}

func cmpAddr(a, def netip.Addr) netip.Addr {
	if a.IsValid() {
		return a
	}
	return def
}

// offlineSpeakers are the speakers as the node would know them: the config's speaker.members,
// else the Nodes of the State that run a speaker (speaker.NodeMembers), and the node itself.
func offlineSpeakers(cfg *cluster.NodeConfig, st *cluster.State) []string {
	out := []string{cfg.NodeName}
	for _, m := range cfg.Speaker.Members {
		out = append(out, m.Name)
	}
	if len(cfg.Speaker.Members) == 0 {
		for n := range speaker.NodeMembers(st) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ExplainPath is the admin endpoint's path of the speaker's explanation (cmd/vipgate serves it).
const ExplainPath = "/explain"

// FetchSpeaker asks the agent's admin endpoint for its speaker's explanation of q.
func FetchSpeaker(admin netip.AddrPort, q speaker.ExplainQuery, timeout time.Duration) (speaker.Explanation, error) {
	host := admin.Addr()
	if host.IsUnspecified() {
		host = netip.IPv6Loopback()
		if admin.Addr().Is4() {
			host = netip.AddrFrom4([4]byte{127, 0, 0, 1})
		}
	}
	v := url.Values{}
	if q.Service != (cluster.ServiceKey{}) {
		v.Set("service", q.Service.String())
	} else {
		v.Set("vip", q.VIP.String())
	}
	u := "http://" + netip.AddrPortFrom(host, admin.Port()).String() + ExplainPath + "?" + v.Encode()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return speaker.Explanation{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return speaker.Explanation{}, fmt.Errorf("asking the agent at %s (is vipgate node running here, with this metricsBindAddress?): %w", admin, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return speaker.Explanation{}, fmt.Errorf("reading %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return speaker.Explanation{}, fmt.Errorf("%s: %s: %s", u, resp.Status, strings.TrimSpace(string(body)))
	}
	var e speaker.Explanation
	if err := json.Unmarshal(body, &e); err != nil {
		return speaker.Explanation{}, fmt.Errorf("decoding %s: %w", u, err)
	}
	return e, nil
}

// ParseQuery reads --service NS/NAME or --vip ADDR (exactly one).
func ParseQuery(service, vip string) (speaker.ExplainQuery, error) {
	var q speaker.ExplainQuery
	switch {
	case service != "" && vip != "":
		return q, errors.New("give --service or --vip, not both")
	case service != "":
		ns, name, ok := strings.Cut(service, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return q, fmt.Errorf("--service %q: want NAMESPACE/NAME", service)
		}
		q.Service = cluster.ServiceKey{Namespace: ns, Name: name}
	default:
		a, err := netip.ParseAddr(vip)
		if err != nil {
			return q, fmt.Errorf("--vip %q: %w", vip, err)
		}
		q.VIP = a.Unmap()
	}
	return q, nil
}
