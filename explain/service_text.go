package explain

import (
	"fmt"
	"io"
	"strings"

	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/speaker"
)

// WriteText prints the report in words: per VIP, the L2 owner and every speaker's part, the BGP
// routes and their peers, then each port's trace (the rules met, the backends and their shares).
func (r *ServiceReport) WriteText(w io.Writer) {
	fmt.Fprintf(w, "explain:  %s (%s, as node %s sees it)\n", r.Query, r.Mode, r.Node)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note:     %s\n", n)
	}
	if len(r.VIPs) == 0 {
		fmt.Fprintln(w, "\nno LoadBalancer IP to explain")
	}
	for _, v := range r.VIPs {
		writeVIP(w, v)
	}
}

func writeVIP(w io.Writer, v VIPReport) {
	fmt.Fprintf(w, "\nVIP %s", v.IP)
	if v.Pool != "" {
		fmt.Fprintf(w, "  (pool %s)", v.Pool)
	}
	fmt.Fprintln(w)
	for _, s := range v.Services {
		var ports []string
		for _, p := range s.Ports {
			ports = append(ports, fmt.Sprintf("%d/%s", p.Port, p.Protocol))
		}
		fmt.Fprintf(w, "  Service %s (externalTrafficPolicy %s), ports %s\n", s.Service, s.ExternalTrafficPolicy, strings.Join(ports, " "))
	}
	if v.NotAnnounced != "" {
		fmt.Fprintf(w, "  NOT ANNOUNCED: %s\n", v.NotAnnounced)
	}
	if l2 := v.L2; l2 != nil {
		writeL2(w, l2)
	}
	if b := v.BGP; b != nil {
		writeBGP(w, b)
	}
	for _, p := range v.Ports {
		writePort(w, p)
	}
}

func writeL2(w io.Writer, l2 *speaker.L2Explanation) {
	ads := ""
	if len(l2.Advertisements) > 0 {
		ads = " (L2Advertisements " + strings.Join(l2.Advertisements, ", ") + ")"
	}
	switch {
	case l2.Owner != "":
		fmt.Fprintf(w, "  L2:  owner %s%s\n", l2.Owner, ads)
	default:
		fmt.Fprintf(w, "  L2:  no owner%s\n", ads)
	}
	if l2.Reason != "" {
		label := "reason"
		if l2.Problem {
			label = "PROBLEM"
		}
		fmt.Fprintf(w, "       %s: %s\n", label, l2.Reason)
	}
	if l2.Preference != "" {
		fmt.Fprintf(w, "       %s\n", l2.Preference)
	}
	if l2.Owner != "" {
		if len(l2.Interfaces) > 0 {
			fmt.Fprintf(w, "       answers ARP/NDP on %s, announces a takeover on %s\n", strings.Join(l2.Interfaces, ", "), strings.Join(l2.Announce, ", "))
		}
		if l2.InterfacesNote != "" {
			fmt.Fprintf(w, "       interfaces: %s\n", l2.InterfacesNote)
		}
	}
	for _, n := range l2.Nodes {
		mark := "-"
		switch {
		case n.Owner:
			mark = "OWNER"
		case n.Candidate:
			mark = "candidate"
		}
		score := ""
		if n.Score != 0 {
			score = fmt.Sprintf(" [weight %d]", n.Score)
		}
		fmt.Fprintf(w, "       %-16s %-9s %s%s\n", n.Node, mark, n.Reason, score)
	}
}

func writeBGP(w io.Writer, b *speaker.BGPExplanation) {
	if len(b.Advertisements) == 0 {
		fmt.Fprintf(w, "  BGP: not advertised: %s\n", b.Reason)
		return
	}
	fmt.Fprintf(w, "  BGP: (BGPAdvertisements %s)\n", strings.Join(b.Advertisements, ", "))
	for _, n := range b.Nodes {
		if !n.Advertised {
			fmt.Fprintf(w, "       %-16s %-9s %s\n", n.Node, "-", strings.Join(n.Reasons, "; "))
			continue
		}
		fmt.Fprintf(w, "       %-16s %-9s %s\n", n.Node, "advertises", strings.Join(n.Reasons, "; "))
		for _, rt := range n.Routes {
			var attrs []string
			if rt.LocalPref != 0 {
				attrs = append(attrs, fmt.Sprintf("localPref %d", rt.LocalPref))
			}
			if len(rt.Communities) > 0 {
				attrs = append(attrs, "communities "+strings.Join(rt.Communities, ","))
			}
			if len(rt.LargeCommunities) > 0 {
				attrs = append(attrs, "large communities "+strings.Join(rt.LargeCommunities, ","))
			}
			if rt.ASPathPrepend != 0 {
				attrs = append(attrs, fmt.Sprintf("AS path prepend %d (eBGP)", rt.ASPathPrepend))
			}
			fmt.Fprintf(w, "         route %s %s\n", rt.Prefix, strings.Join(attrs, ", "))
			for _, p := range rt.Peers {
				state := ""
				if p.State != "" {
					state = " (" + p.State + ")"
				}
				kind := "iBGP"
				if p.MyASN != p.PeerASN {
					kind = "eBGP"
				}
				fmt.Fprintf(w, "           -> peer %s %s AS %d, %s%s\n", p.Name, p.Address, p.PeerASN, kind, state)
			}
		}
	}
}

func writePort(w io.Writer, p PortReport) {
	tr := p.Trace
	fmt.Fprintf(w, "  port %d/%s of %s: %s %s -> %s, table %s (%s)\n", p.Port, p.Protocol, p.Service, tr.Protocol, tr.Source, tr.Dest, tr.Table, tr.Ruleset)
	// The rules that matched and acted; the JSON has every rule tried.
	shown := 0
	for _, s := range tr.Steps {
		switch s.Kind {
		case dataplane.StepRule, dataplane.StepMatch, dataplane.StepRandomTaken, dataplane.StepRouting:
			fmt.Fprintf(w, "       %s\n", s)
			shown++
		}
	}
	if shown < len(tr.Steps) {
		fmt.Fprintf(w, "       (the rules that matched: %d of %d steps; --output json has every one)\n", shown, len(tr.Steps))
	}
	fmt.Fprintf(w, "       result: %s\n", p.Summary)
	for _, c := range p.Backends {
		share := "share unknown"
		if c.Probability > 0 {
			share = fmt.Sprintf("%5.1f%%", 100*c.Probability)
		}
		masq := "source kept"
		if c.Masquerade {
			masq = "masqueraded: " + c.MasqueradeReason
		}
		fmt.Fprintf(w, "         -> %-24s %s  %s\n", c.Endpoint, share, masq)
	}
	for _, y := range tr.Why {
		fmt.Fprintf(w, "       why: %s\n", y)
	}
	for _, rj := range tr.Rejected {
		fmt.Fprintf(w, "       rejected: %s %s: %s\n", rj.Kind, rj.Object, rj.Reason)
	}
}
