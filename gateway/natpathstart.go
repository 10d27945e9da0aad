package gateway

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/maglev"
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
func startNATPath(cfg *cluster.GatewayConfig, o RuntimeOptions, log hclog.Logger) (*NATPath, *natPathStatus, error) {
	st := &natPathStatus{}
	// The flow hash's seed, for the family's tables (their jhash rules) and the program alike.
	seed, warn, err := HashSeed(cfg, o.MemberKeyFile, o.ReadKeys)
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
		SNATPortMin: nf.SNATPortMin, SNATPortMax: nf.SNATPortMax, HashSeed: seed, DenySources: cfg.ClusterCIDRs,
		Attach: natpath.AttachMode(nf.Attach)})
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
	log.Info("NAT fast path on", "devices", strings.Join(nf.Devices, ","), "masquerade", !noSNAT, "attach", cmp.Or(nf.Attach, "auto"))
	return &NATPath{Path: p, Devices: nf.Devices, NoSNAT: noSNAT, SNATPortMin: nf.SNATPortMin, SNATPortMax: nf.SNATPortMax}, st, nil
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
func (s *natPathStatus) set(rep *SyncReport) {
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

// HashSeed is the flow hash's seed: derived from the first key of hashKeyFile, else of the
// membership key file (memberKeyFile: --member-key-file, else speaker.memberKeyFile), which the
// gateways of a group share, read with readKeys; else the public default, with a warning for
// /status (anyone can then compute which slot and masquerade port a flow of theirs gets). A named
// key file that cannot be read is an error, not a fallback: the other gateways, which read it,
// would disagree on every flow's slot.
func HashSeed(cfg *cluster.GatewayConfig, memberKeyFile string, readKeys func(string) ([][]byte, error)) (seed uint32, warning string, err error) {
	path, what := cfg.HashKeyFile, "hashKeyFile"
	if path == "" {
		path, what = cmp.Or(memberKeyFile, cfg.Speaker.MemberKeyFile), "the membership key file"
	}
	if path == "" {
		return maglev.DefaultHashSeed, "the public default (no hashKeyFile or membership key file): anyone can predict each flow's backend and masquerade port", nil
	}
	keys, err := readKeys(path)
	if err == nil && len(keys) == 0 {
		err = errors.New("no key")
	}
	if err != nil {
		return 0, "", fmt.Errorf("flow hash seed: %s %s: %w", what, path, err)
	}
	return maglev.DeriveHashSeed(keys[0]), "", nil
}
