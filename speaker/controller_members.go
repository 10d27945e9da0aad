package speaker

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/vipgate/vipgate/cluster"
)

// NodeMembers lists the Nodes of the State that run a speaker as members (every Node when the
// source does not know the speaker pods, State.SpeakerNodes nil): heartbeats go to the first IPv4
// address (else the first address) and are accepted from any of them. A Node without an address is
// left out.
func NodeMembers(st *cluster.State) map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	if st == nil {
		return out
	}
	for name, n := range st.Nodes {
		if st.SpeakerNodes != nil && !st.SpeakerNodes[name] {
			continue
		}
		addrs := slices.Clone(n.Addresses)
		slices.SortStableFunc(addrs, func(a, b netip.Addr) int { return cmp.Compare(a.BitLen(), b.BitLen()) })
		if len(addrs) > 0 {
			out[name] = addrs
		}
	}
	return out
}
