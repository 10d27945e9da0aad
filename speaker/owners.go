package speaker

import (
	"bytes"
	"crypto/sha256"
	"net/netip"
)

// OwnerCache remembers the rendezvous owner of every VIP across DecideL2 calls, so that a membership
// change costs hashes in proportion to what changed instead of VIPs × candidates:
//
//   - a candidate added: one hash per VIP of its candidate set (the newcomer against the owner's
//     cached hash);
//   - a candidate removed: only the VIPs it owned are computed again, over every candidate;
//   - nothing changed: no hash at all.
//
// The owner is exactly rendezvousOwner's (lowest sha256(node "#" ip), ties to the lower name), so
// nodes with and without the cache — and older versions — agree on every owner. Not safe for
// concurrent use: the caller's decision loop owns it.
type OwnerCache struct {
	gen  uint64
	sets map[string]*ownerSet
	// last is the previous call's decisions, for vipgate_l2_owner_changes_total (observeOwners).
	last []VIPDecision
}

// ownerSet is the owners of the VIPs that share one candidate set (a pool's candidates).
type ownerSet struct {
	gen   uint64
	cands map[string]bool
	vips  map[netip.Addr]*ownerEntry
}

type ownerEntry struct {
	gen   uint64
	ip    string
	owner string
	hash  [sha256.Size]byte
	stale bool
}

// NewOwnerCache returns an empty cache.
func NewOwnerCache() *OwnerCache { return &OwnerCache{sets: map[string]*ownerSet{}} }

// begin starts a DecideL2 call; end drops what the call did not use (pools and VIPs that went away).
func (c *OwnerCache) begin() { c.gen++ }

func (c *OwnerCache) end() {
	for k, s := range c.sets {
		if s.gen != c.gen {
			delete(c.sets, k)
			continue
		}
		for ip, e := range s.vips {
			if e.gen != c.gen {
				delete(s.vips, ip)
			}
		}
	}
}

// set returns the owners of candidate set key, brought up to date with cands (which the cache keeps:
// the caller must not change it afterwards).
func (c *OwnerCache) set(key string, cands map[string]bool) *ownerSet {
	s := c.sets[key]
	if s == nil {
		s = &ownerSet{cands: cands, vips: map[netip.Addr]*ownerEntry{}}
		c.sets[key] = s
	} else {
		s.update(cands)
	}
	s.gen = c.gen
	return s
}

// update applies the difference between the cached candidates and cands to every cached owner.
func (s *ownerSet) update(cands map[string]bool) {
	var added []string
	removed := map[string]bool{}
	for n := range cands {
		if !s.cands[n] {
			added = append(added, n)
		}
	}
	for n := range s.cands {
		if !cands[n] {
			removed[n] = true
		}
	}
	s.cands = cands
	if len(added) == 0 && len(removed) == 0 {
		return
	}
	// Many newcomers (a start-up, a partition healing): computing afresh costs no more.
	full := len(added) > len(cands)/2
	for _, e := range s.vips {
		if e.stale {
			continue
		}
		if full || removed[e.owner] {
			e.stale = true
			continue
		}
		for _, n := range added {
			h := ownerHash(n, e.ip)
			if lessOwner(h, n, e.hash, e.owner) {
				e.owner, e.hash = n, h
			}
		}
	}
}

// owner returns ip's owner among the set's candidates ("" if there is none).
func (s *ownerSet) owner(ip netip.Addr, gen uint64) string {
	e := s.vips[ip]
	if e == nil {
		e = &ownerEntry{ip: ip.String(), stale: true}
		s.vips[ip] = e
	}
	e.gen = gen
	if e.stale {
		e.owner, e.hash = rendezvous(s.cands, e.ip)
		e.stale = false
	}
	return e.owner
}

// ownerHash is the rendezvous weight of node for ip (MetalLB's sha256(node "#" ip)).
func ownerHash(node, ip string) [sha256.Size]byte {
	h := sha256.New()
	h.Write([]byte(node))
	h.Write([]byte{'#'})
	h.Write([]byte(ip))
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// lessOwner orders two candidates for one IP: the lower hash wins, a tie goes to the lower name;
// an empty best always loses.
func lessOwner(h [sha256.Size]byte, n string, best [sha256.Size]byte, bestName string) bool {
	if bestName == "" {
		return true
	}
	c := bytes.Compare(h[:], best[:])
	return c < 0 || (c == 0 && n < bestName)
}

// rendezvous is the full computation over every candidate.
func rendezvous(cands map[string]bool, ip string) (string, [sha256.Size]byte) {
	var best string
	var bestHash [sha256.Size]byte
	for n, ok := range cands {
		if !ok {
			continue
		}
		if h := ownerHash(n, ip); lessOwner(h, n, bestHash, best) {
			best, bestHash = n, h
		}
	}
	return best, bestHash
}
