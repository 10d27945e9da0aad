package main

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/maglev"
	"github.com/vipgate/vipgate/gateway"
	"github.com/vipgate/vipgate/gateway/natpath"
)

// natPathStatus is the NAT fast path as /status and /metrics show it: why it is off, or the
// warnings of the last sync; the sync loop writes it, the admin endpoint reads it.
type natPathStatus struct {
	path *natpath.Path
	off  string // why the path is off ("": on, or not asked for)
	// seed warns about the flow hash's seed (the public default, or a key file that failed).
	seed string
	warn atomic.Pointer[[]string]
}

// startNATPath loads the NAT fast path cfg asks for (forwarding direct or nodePort, natFastPath
// on). A kernel that refuses it leaves the gateway without it, logged and on /status: the
// family's tables forward everything, as they do for what the path does not take.
func startNATPath(cfg *cluster.GatewayConfig, flags speakerFlags, log hclog.Logger) (*gateway.NATPath, *natPathStatus, error) {
	st := &natPathStatus{}
	// The flow hash's seed, for the family's tables (their jhash rules) and the program alike.
	seed, warn, err := gatewayHashSeed(cfg, flags)
	if err != nil {
		return nil, st, err
	}
	dataplane.SetGatewayHashSeed(seed)
	if st.seed = warn; warn != "" {
		log.Warn("flow hash seed", "warning", warn)
	}
	nf := cfg.NATFastPath
	if !nf.Enabled || (cfg.Forwarding != cluster.ForwardDirect && cfg.Forwarding != cluster.ForwardNodePort) {
		detachLeftovers(log, "the NAT fast path is off")
		return nil, st, nil
	}
	// A pod's address arriving from outside is spoofed: the pod networks are denied as sources.
	p, err := natpath.Load(natpath.Config{FlowEntries: nf.FlowTableSize, TCPTimeout: cfg.FlowTimeout,
		SNATPortMin: nf.SNATPortMin, SNATPortMax: nf.SNATPortMax, HashSeed: seed, DenySources: cfg.ClusterCIDRs})
	if err != nil {
		st.off = err.Error()
		log.Warn("no NAT fast path; the family's tables forward alone (conntrack)", "err", err)
		detachLeftovers(log, "the NAT fast path cannot be loaded")
		return nil, st, nil
	}
	st.path = p
	if p.Adopted {
		log.Info("NAT fast path: a previous run's flows go on (its flow table adopted)")
	}
	// Masquerade state that conntrackd replicates to the peer gateway stays in conntrack.
	noSNAT := len(cfg.SNATAddresses) > 0 || cfg.ConntrackSync.Enabled
	if !p.CanMasquerade && !noSNAT {
		log.Warn("NAT fast path: masqueraded VIP ports are left to conntrack (the kernel gives BPF no source address before Linux 6.7)")
		noSNAT = true
	}
	log.Info("NAT fast path on", "devices", strings.Join(nf.Devices, ","), "masquerade", !noSNAT)
	return &gateway.NATPath{Path: p, Devices: nf.Devices, NoSNAT: noSNAT, SNATPortMin: nf.SNATPortMin, SNATPortMax: nf.SNATPortMax}, st, nil
}

// detachLeftovers detaches a previous run's NAT fast path: left attached, it would go on
// forwarding the VIP ports it was last given.
func detachLeftovers(log hclog.Logger, why string) {
	if n, err := natpath.Cleanup(); err != nil {
		log.Warn("detaching a previous run's NAT fast path", "err", err)
	} else if n > 0 {
		log.Info("detached a previous run's NAT fast path", "why", why, "interfaces", n)
	}
}

// set records a sync's warnings.
func (s *natPathStatus) set(rep *gateway.SyncReport) {
	w := rep.NATPathWarnings
	s.warn.Store(&w)
}

func (s *natPathStatus) warnings() []string {
	var out []string
	if s.seed != "" {
		out = append(out, "flow hash seed: "+s.seed)
	}
	if s.off != "" {
		return append(out, "NAT fast path off: "+s.off)
	}
	p := s.warn.Load()
	if p == nil {
		return out
	}
	for _, w := range *p {
		out = append(out, "NAT fast path: "+w)
	}
	return out
}

// close lets go of the program, which stays attached (as the nftables tables stay) and keeps
// forwarding its flows; the next run adopts them (natpath.Load).
func (s *natPathStatus) close() {
	if s.path != nil {
		_ = s.path.Close()
	}
}

// collectors are the NAT fast path's metrics: on or off, and its packet counters.
func (s *natPathStatus) collectors() []prometheus.Collector {
	on := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "vipgate", Name: "gateway_nat_fast_path",
		Help: "1 while the NAT fast path (forwarding direct and nodePort: a tc BPF program) is loaded, else 0 (/status says why).",
	}, func() float64 {
		if s.path == nil {
			return 0
		}
		return 1
	})
	if s.path == nil {
		return []prometheus.Collector{on}
	}
	return []prometheus.Collector{on, natPathCounters{s.path}}
}

// natPathCounters exports the program's counters.
type natPathCounters struct{ p *natpath.Path }

var natPathPacketsDesc = prometheus.NewDesc("vipgate_gateway_nat_fast_path_packets_total",
	"Packets the NAT fast path took (new, forwarded, reply; icmp: ICMP errors about its flows, translated; frag: later fragments of IPv4 UDP datagrams, following their first) or left to the IP stack (no_backend, no_route: MTU or no usable next hop, snat_full: no free masquerade port, no_syn: a TCP packet of no flow it holds that opens none, clash: a new flow whose reply tuple a live flow holds, full: the established flow table was full); neigh: forwarded through the neighbour layer; martian: dropped, from a source no client can have (loopback, multicast, the pod networks...); window: a TCP RST or FIN outside the window, forwarded without ending its flow.",
	[]string{"what"}, nil)

func (c natPathCounters) Describe(ch chan<- *prometheus.Desc) { ch <- natPathPacketsDesc }

func (c natPathCounters) Collect(ch chan<- prometheus.Metric) {
	n, err := c.p.Counters()
	if err != nil {
		return
	}
	for what, v := range map[string]uint64{"new": n.New, "forwarded": n.Forwarded, "reply": n.Replies,
		"no_backend": n.NoBackend, "no_route": n.NoRoute, "snat_full": n.SNATFull, "neigh": n.Neigh, "no_syn": n.NoSYN, "clash": n.Clash,
		"icmp": n.ICMP, "frag": n.Frag, "martian": n.Martian, "full": n.Full, "window": n.Window} {
		ch <- prometheus.MustNewConstMetric(natPathPacketsDesc, prometheus.CounterValue, float64(v), what)
	}
}

// gatewayHashSeed is the flow hash's seed: derived from the first key of hashKeyFile, else of the
// membership key file (--member-key-file, else speaker.memberKeyFile), which the gateways of a
// group share; else the public default, with a warning for /status (anyone can then compute which
// slot and masquerade port a flow of theirs gets). A named key file that cannot be read is an
// error, not a fallback: the other gateways, which read it, would disagree on every flow's slot.
func gatewayHashSeed(cfg *cluster.GatewayConfig, flags speakerFlags) (seed uint32, warning string, err error) {
	path, what := cfg.HashKeyFile, "hashKeyFile"
	if path == "" {
		path, what = cmp.Or(flags.MemberKeyFile, cfg.Speaker.MemberKeyFile), "the membership key file"
	}
	if path == "" {
		return maglev.DefaultHashSeed, "the public default (no hashKeyFile or membership key file): anyone can predict each flow's backend and masquerade port", nil
	}
	keys, err := readMemberKeys(path)
	if err == nil && len(keys) == 0 {
		err = errors.New("no key")
	}
	if err != nil {
		return 0, "", fmt.Errorf("flow hash seed: %s %s: %w", what, path, err)
	}
	return maglev.DeriveHashSeed(keys[0]), "", nil
}
