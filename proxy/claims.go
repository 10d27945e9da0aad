package proxy

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// Entries (an IP, protocol and port, or a NodePort) that several Services claim go to one of them by
// a total order that does not depend on the order in which the Services arrived, so the holder is
// the same after every restart, resync or failed sync:
//
//  1. a cluster IP entry beats an external IP or LoadBalancer IP entry: a Service with
//     externalIPs: [10.96.0.10] can never take kube-dns's 10.96.0.10:53 (CVE-2020-8554);
//  2. between equals the oldest Service wins (cluster.ClaimOrder: creationTimestamp, then uid), never
//     the one whose name sorts first, which anyone creating Services could choose.
//
// The others are told (SyncReport.Conflicts) and get the entry as soon as its holder lets it go.

// claim is one Service's claim on an entry.
type claim struct {
	svc *cluster.Service
	// external is true for an external IP or LoadBalancer IP entry, false for a cluster IP entry or a
	// NodePort.
	external bool
}

// beats says whether claim a wins an entry over claim b.
func (a claim) beats(b claim) bool {
	if a.external != b.external {
		return !a.external
	}
	return cluster.ClaimOrder(a.svc, b.svc) < 0
}

// claimTable holds who claims each entry of one family's table and who holds it. Only the contested
// entries cost more than one map element.
type claimTable struct {
	owner map[entryKey]claim
	// others are the claims that lost a contested entry.
	others map[entryKey][]claim
	// lost lists, per Service, the entries it claims but does not hold.
	lost map[cluster.ServiceKey]map[entryKey]bool
}

func newClaimTable() *claimTable {
	return &claimTable{owner: map[entryKey]claim{}, others: map[entryKey][]claim{}, lost: map[cluster.ServiceKey]map[entryKey]bool{}}
}

// entryClaim is one entry a Service claims, and how.
type entryClaim struct {
	k entryKey
	c claim
}

// claimsOf appends to out the distinct entries of a Service's part with the kind of each (a Service
// whose external IP equals its own cluster IP claims the entry once, as a cluster IP), in the order
// of the part's entries. Most Services have a handful: a linear search, and a slice the caller
// reuses, where a map per Service was ~5 MiB of garbage in a full sync of 10,000 Services. Beyond
// smallClaims entries an index finds the duplicates, so a Service of many entries (ports x
// addresses, up to cluster.ServiceLimits) costs time linear in them, not quadratic.
func claimsOf(out []entryClaim, svc *cluster.Service, part *dataplane.Part) []entryClaim {
	start := len(out)
	var index map[entryKey]int
	for _, e := range part.Entries {
		k := entryKey{e.NodePort, e.Addr, e.Proto, e.Port}
		c := claim{svc: svc, external: !e.NodePort && !slices.Contains(svc.ClusterIPs, e.Addr)}
		i := -1
		switch {
		case index != nil:
			if j, ok := index[k]; ok {
				i = j
			}
		case len(out)-start > smallClaims:
			index = make(map[entryKey]int, len(part.Entries))
			for j := start; j < len(out); j++ {
				index[out[j].k] = j
			}
			if j, ok := index[k]; ok {
				i = j
			}
		default:
			if j := slices.IndexFunc(out[start:], func(x entryClaim) bool { return x.k == k }); j >= 0 {
				i = start + j
			}
		}
		switch {
		case i < 0:
			if index != nil {
				index[k] = len(out)
			}
			out = append(out, entryClaim{k, c})
		case out[i].c.external:
			out[i].c = c
		}
	}
	return out
}

// smallClaims is how many entries claimsOf searches linearly before it indexes them.
const smallClaims = 16

// add records c's claim on k and returns the Service that lost the entry to it, if it took it from
// one (nil otherwise).
func (t *claimTable) add(k entryKey, c claim) *cluster.Service {
	o, ok := t.owner[k]
	if !ok {
		t.owner[k] = c
		return nil
	}
	if o.svc.Key == c.svc.Key {
		// A Service's claims are withdrawn before it claims again; should one be left, the
		// new claim replaces it rather than losing to it.
		t.owner[k] = c
		return nil
	}
	if !c.beats(o) {
		t.others[k] = append(t.others[k], c)
		t.markLost(c.svc.Key, k)
		return nil
	}
	t.owner[k] = c
	t.others[k] = append(t.others[k], o)
	t.markLost(o.svc.Key, k)
	return o.svc
}

// remove withdraws key's claim on k and returns the Service that gets the entry now, if any.
func (t *claimTable) remove(k entryKey, key cluster.ServiceKey) *cluster.Service {
	if l := t.lost[key]; l != nil {
		delete(l, k)
		if len(l) == 0 {
			delete(t.lost, key)
		}
	}
	o, ok := t.owner[k]
	if !ok {
		return nil
	}
	if o.svc.Key != key {
		t.others[k] = slices.DeleteFunc(t.others[k], func(c claim) bool { return c.svc.Key == key })
		if len(t.others[k]) == 0 {
			delete(t.others, k)
		}
		return nil
	}
	rest := t.others[k]
	if len(rest) == 0 {
		delete(t.owner, k)
		return nil
	}
	best := 0
	for i, c := range rest {
		if c.beats(rest[best]) {
			best = i
		}
	}
	winner := rest[best]
	t.owner[k] = winner
	rest = slices.Delete(rest, best, best+1)
	if len(rest) == 0 {
		delete(t.others, k)
	} else {
		t.others[k] = rest
	}
	if l := t.lost[winner.svc.Key]; l != nil {
		delete(l, k)
		if len(l) == 0 {
			delete(t.lost, winner.svc.Key)
		}
	}
	return winner.svc
}

func (t *claimTable) markLost(key cluster.ServiceKey, k entryKey) {
	l := t.lost[key]
	if l == nil {
		l = map[entryKey]bool{}
		t.lost[key] = l
	}
	l[k] = true
}

// filter returns part without the entries its Service does not hold (and the elements that belong
// to them). part is not modified; it is returned as is when nothing is lost.
func (t *claimTable) filter(key cluster.ServiceKey, part *dataplane.Part) *dataplane.Part {
	lost := t.lost[key]
	if len(lost) == 0 || part == nil {
		return part
	}
	part = part.Unpacked() // the elements of a packed part are in its packed form
	np := *part
	np.Elements = nil
	for _, el := range part.Elements {
		if k, ok := elementEntry(el); ok && lost[k] {
			continue
		}
		np.Elements = append(np.Elements, el)
	}
	np.Entries = nil
	for _, e := range part.Entries {
		if !lost[entryKey{e.NodePort, e.Addr, e.Proto, e.Port}] {
			np.Entries = append(np.Entries, e)
		}
	}
	return &np
}

// conflicts describes every entry a Service claims but does not hold, sorted.
func (t *claimTable) conflicts() []cluster.Rejection {
	var out []cluster.Rejection
	for key, lost := range t.lost {
		for k := range lost {
			o := t.owner[k]
			what := fmt.Sprintf("%s %s", dataplane.ProtoName(k.proto), netipAddrPort(k))
			if k.nodePort {
				what = fmt.Sprintf("NodePort %s/%d", dataplane.ProtoName(k.proto), k.port)
			}
			var mine claim
			for _, c := range t.others[k] {
				if c.svc.Key == key {
					mine = c
				}
			}
			why := orderReason(o, mine)
			out = append(out, cluster.Rejection{Kind: "Service", Object: key.String(), Addr: k.addr,
				Reason: fmt.Sprintf("%s is held by Service %s (%s); not programmed for this Service", what, o.svc.Key, why)})
		}
	}
	slices.SortFunc(out, func(a, b cluster.Rejection) int {
		return cmp.Or(cmp.Compare(a.Object, b.Object), cmp.Compare(a.Reason, b.Reason))
	})
	return out
}

func netipAddrPort(k entryKey) string {
	if k.addr.Is6() {
		return fmt.Sprintf("[%s]:%d", k.addr, k.port)
	}
	return fmt.Sprintf("%s:%d", k.addr, k.port)
}

// orderReason says why claim o beat claim c, in the words of the rules above.
func orderReason(o, c claim) string {
	switch {
	case c.svc == nil:
		return "it claims it first"
	case !o.external && c.external:
		return "a cluster IP entry always wins over an external or LoadBalancer IP entry"
	case o.svc.Created.IsZero() != c.svc.Created.IsZero():
		return "it states its creationTimestamp and this Service does not"
	case !o.svc.Created.Equal(c.svc.Created):
		return "the oldest Service wins: it was created first"
	case o.svc.UID != c.svc.UID:
		return "the oldest Service wins: created in the same second, it has the smaller uid"
	}
	return "neither Service states its creationTimestamp or uid, so namespace/name decides"
}
