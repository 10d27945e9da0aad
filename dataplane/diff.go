package dataplane

import (
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"strings"

	"github.com/vipgate/vipgate/cluster"
)

// Tx is one atomic change to one family's table: what the netlink edge sends as a single batch. The
// edge applies it in this order, which keeps every reference valid at every step:
//
//  1. (Full only) replace the whole table: add, delete and re-create it.
//  2. Add sets; create new chains (empty); flush chains whose rules change.
//  3. Add the rules of new and changed chains.
//  4. Delete stale elements, then add new ones (a changed map value is a delete plus an add).
//  5. Flush, then delete, chains that are gone; then delete sets that are gone.
type Tx struct {
	Family cluster.Family
	Table  string
	// Full replaces the table wholesale (first sync, or recovery after a failure).
	Full        bool
	AddSets     []*Set
	AddChains   []*Chain
	FlushChains []*Chain // existing chains whose rules are replaced by these
	DelElements []Element
	// AddElements are the elements to add; a full sync of the proxier also adds those of
	// addParts. Read them all through AddedElements and NumAddElements.
	AddElements []Element
	DelChains   []string
	DelSets     []string
	// Purges are done after the transaction: clients of endpoints that left, in affinity maps.
	Purges []AffinityPurge
	// Sets holds the kind of every set elements refer to (needed to encode them).
	Sets map[string]*Set
	// addParts are the parts a full sync of the proxier adds, whose elements are added too (after
	// AddElements), less the duplicates each one lists. A full sync of 10,000 Services adds
	// ~146,000 elements: as Elements they took 24 MiB, alive until the batch was acknowledged and
	// at the sync's peak, while the parts hold them packed anyway (compact.go).
	addParts []addedPart
	nAdd     int // the elements of addParts, less their duplicates
}

// addedPart is a part whose elements a transaction adds: all but the skip'th (in order, ascending),
// elements of sharable sets another part added first.
type addedPart struct {
	p    *Part
	skip []int32
}

// NumAddElements is the number of elements the transaction adds.
func (t *Tx) NumAddElements() int { return len(t.AddElements) + t.nAdd }

// AddedElements yields the elements the transaction adds, in the order the batch adds them.
func (t *Tx) AddedElements() iter.Seq[Element] {
	return func(yield func(Element) bool) {
		for _, e := range t.AddElements {
			if !yield(e) {
				return
			}
		}
		for _, ap := range t.addParts {
			skip := ap.skip
			// Read in place rather than through allElements: no closures per part.
			pp, els := ap.p.packed, ap.p.Elements
			n := len(els)
			var r packedReader
			if pp != nil {
				r, n = pp.elementReader()
			}
			for i := range n {
				var e Element
				if pp != nil {
					e = r.next()
				} else {
					e = els[i]
				}
				if len(skip) > 0 && int(skip[0]) == i {
					skip = skip[1:]
				} else if !yield(e) {
					return
				}
			}
		}
	}
}

// AddedParts lists, in order, the parts whose elements the transaction adds after AddElements
// (DiffOptions.AddParts), less the elements of sharable sets an earlier part added.
func (t *Tx) AddedParts() []*Part {
	out := make([]*Part, len(t.addParts))
	for i, ap := range t.addParts {
		out[i] = ap.p
	}
	return out
}

// AffinityPurge asks for the clients an affinity map remembers with an endpoint address not in Keep
// to be forgotten: the endpoints they were sent to left the Service port (kube-proxy deletes the
// departed endpoint's set). Affinity maps are written by packets, so only the kernel knows these
// clients; the programmer reads the map once the transaction is in.
type AffinityPurge struct {
	Set  string
	Keep []netip.Addr
}

// affinityEndpoints lists, per affinity map, the endpoint addresses the chain's rules send new
// clients to.
func affinityEndpoints(c *Chain) map[string][]netip.Addr {
	var out map[string][]netip.Addr
	for _, r := range c.Rules {
		if r.Action.Kind == ActAffinityDNAT {
			if out == nil {
				out = map[string][]netip.Addr{}
			}
			out[r.Action.Set] = append(out[r.Action.Set], r.Action.Addr)
		}
	}
	return out
}

// AffinityPurges returns the purges a changed affinity chain needs: for each map it keeps, the
// endpoints it no longer sends clients to.
func AffinityPurges(old, new *Chain) []AffinityPurge {
	before := affinityEndpoints(old)
	var out []AffinityPurge
	for set, keep := range affinityEndpoints(new) {
		for _, a := range before[set] {
			if !slices.Contains(keep, a) {
				out = append(out, AffinityPurge{Set: set, Keep: keep})
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b AffinityPurge) int { return strings.Compare(a.Set, b.Set) })
	return out
}

// Empty says whether the transaction changes nothing.
func (t *Tx) Empty() bool {
	return !t.Full && len(t.AddSets) == 0 && len(t.AddChains) == 0 && len(t.FlushChains) == 0 &&
		len(t.DelElements) == 0 && t.NumAddElements() == 0 && len(t.DelChains) == 0 && len(t.DelSets) == 0 &&
		len(t.Purges) == 0
}

// String summarises the transaction for logs.
func (t *Tx) String() string {
	return fmt.Sprintf("family=IPv%d full=%v +sets=%d +chains=%d ~chains=%d -elements=%d +elements=%d -chains=%d -sets=%d purges=%d",
		t.Family, t.Full, len(t.AddSets), len(t.AddChains), len(t.FlushChains), len(t.DelElements), t.NumAddElements(), len(t.DelChains), len(t.DelSets), len(t.Purges))
}

func rulesEqual(a, b []Rule) bool {
	return slices.EqualFunc(a, b, func(x, y Rule) bool {
		return x.Action == y.Action && x.Comment == y.Comment && slices.Equal(x.Matches, y.Matches)
	})
}

func chainEqual(a, b *Chain) bool {
	return a.Name == b.Name && a.Type == b.Type && a.Hook == b.Hook && a.Priority == b.Priority && rulesEqual(a.Rules, b.Rules)
}

// diffState accumulates one sync's changes for one family.
type diffState struct {
	tx *Tx
	// refs counts the elements of sharable sets (the proxier's, compact.go); without it elemRefs
	// does.
	refs        *ElementRefs
	elemRefs    map[Element]int
	sharedRefs  map[string]int
	sharedDelta map[string]int
	sets        map[string]*Set
	// sharable are DiffOptions.Sharable's sets.
	sharable map[string]bool
	// lazyAdds: the parts added from nothing are listed in the transaction's addParts instead of
	// their elements in AddElements (a full sync: nothing is deleted, so no addition cancels out in
	// finish).
	lazyAdds bool
	// sharedChain and neighbours are DiffOptions'.
	sharedChain func(name string) *Chain
	neighbours  func(shared map[string]int) []string
}

// Diff accumulates one sync's changes to one family's table into a transaction: each part's old
// and new version in turn (Part), then Finish. Elements of the sharable sets (DiffOptions.Sharable)
// and shared chains (Part.Uses) are reference counted across the parts, in counts the caller keeps
// from one sync to the next (DiffOptions). DiffRulesets is a Diff of two whole rulesets.
type Diff struct{ d diffState }

// DiffOptions are the counts and indexes a Diff updates, which its caller keeps between syncs, and
// how it lists what it adds.
type DiffOptions struct {
	// Sharable are the sets in which two parts may legitimately hold the same element (the node's:
	// a pod IP and port in the hairpin set, a ClusterIP in two Services' ClusterIP set). Elements
	// there are reference counted; every other element has exactly one owner.
	Sharable []string
	// Refs counts the elements of sharable sets held by the parts (nil: a fresh map of Elements).
	Refs *ElementRefs
	// SharedRefs counts, per shared chain, the parts that use it; a chain at 0 exists unused.
	SharedRefs map[string]int
	// Sets indexes the table's sets by name (the netlink edge needs their kinds); the Diff adds
	// and removes the parts' sets.
	Sets map[string]*Set
	// AddParts lists the parts added from nothing in the transaction instead of their elements
	// (Tx.AddedElements reads them from the packed parts when the batch is encoded): for a full
	// sync, where nothing is deleted, so no addition cancels out. Parts is how many parts it will
	// add, to size the list at once.
	AddParts bool
	Parts    int
	// SharedChain builds the shared chain a part's Uses names, when the first part uses it: the
	// role's (the node's pickers: proxy). Needed only if parts use shared chains.
	SharedChain func(name string) *Chain
	// Neighbours, on a full sync, names the shared chains to create unused besides those in use
	// (shared: their reference counts), sorted and none of them in use: a role's policy of chains
	// it is likely to need soon (the node's neighbouring pickers: proxy's neighbourPickers).
	Neighbours func(shared map[string]int) []string
}

// NewDiff returns a Diff that adds to tx.
func NewDiff(tx *Tx, o DiffOptions) *Diff {
	// Small enough to inline: a caller's Diff then needs no allocation of its own.
	return &Diff{d: newDiffState(tx, o)}
}

// SharableSets is a set of set names, as Part.CountElements takes them.
func SharableSets(names []string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

func newDiffState(tx *Tx, o DiffOptions) diffState {
	d := diffState{tx: tx, refs: o.Refs, sharedRefs: o.SharedRefs, sets: o.Sets, lazyAdds: o.AddParts,
		sharedChain: o.SharedChain, neighbours: o.Neighbours, sharable: SharableSets(o.Sharable)}
	if o.Refs == nil {
		d.elemRefs = map[Element]int{}
	}
	if d.sharedRefs == nil {
		d.sharedRefs = map[string]int{}
	}
	if d.sets == nil {
		d.sets = map[string]*Set{}
	}
	if o.AddParts && o.Parts > 0 {
		tx.addParts = slices.Grow(tx.addParts, o.Parts)
	}
	return d
}

// Part adds to the transaction what turns part old into part new. Either may be nil.
func (d *Diff) Part(old, new *Part) { d.d.diffPart(old, new) }

// Finish turns the shared chains' reference changes into chain additions and deletions, drops the
// element changes that cancel out, and on a full sync adds the unused shared chains
// DiffOptions.Neighbours names. Call it once, after the last Part.
func (d *Diff) Finish() { d.d.finish() }

// diffPart adds to the transaction what turns part old into part new. Either may be nil.
func (d *diffState) diffPart(old, new *Part) {
	if new == nil {
		new = &Part{}
	}
	if old == nil || (len(old.Chains) == 0 && len(old.Sets) == 0 && old.NumElements() == 0 && len(old.Uses) == 0) {
		d.addPart(new)
		return
	}
	oldChains := make(map[string]*Chain, len(old.Chains))
	for _, c := range old.Chains {
		oldChains[c.Name] = c
	}
	newChains := make(map[string]bool, len(new.Chains))
	for _, c := range new.Chains {
		newChains[c.Name] = true
		if oc, ok := oldChains[c.Name]; !ok {
			d.tx.AddChains = append(d.tx.AddChains, c)
		} else if !chainEqual(oc, c) {
			d.tx.FlushChains = append(d.tx.FlushChains, c)
			d.tx.Purges = append(d.tx.Purges, AffinityPurges(oc, c)...)
		}
	}
	for _, c := range old.Chains {
		if !newChains[c.Name] {
			d.tx.DelChains = append(d.tx.DelChains, c.Name)
		}
	}

	oldSets := make(map[string]*Set, len(old.Sets))
	for _, s := range old.Sets {
		oldSets[s.Name] = s
	}
	newSets := make(map[string]bool, len(new.Sets))
	for _, s := range new.Sets {
		newSets[s.Name] = true
		d.sets[s.Name] = s
		if os, ok := oldSets[s.Name]; !ok {
			d.tx.AddSets = append(d.tx.AddSets, s)
		} else if *os != *s {
			// A changed affinity timeout: the set is re-created (its clients are forgotten).
			d.tx.DelSets = append(d.tx.DelSets, s.Name)
			d.tx.AddSets = append(d.tx.AddSets, s)
		}
	}
	for _, s := range old.Sets {
		if !newSets[s.Name] {
			d.tx.DelSets = append(d.tx.DelSets, s.Name)
			delete(d.sets, s.Name)
		}
	}

	oldEls := make(map[Element]struct{}, old.NumElements())
	for e := range old.AllElements() {
		oldEls[e] = struct{}{}
	}
	newEls := make(map[Element]struct{}, new.NumElements())
	for e := range new.AllElements() {
		newEls[e] = struct{}{}
	}
	for e := range oldEls {
		if _, ok := newEls[e]; ok {
			continue
		}
		if d.sharable[e.Set] && d.ref(e, -1) > 0 {
			continue
		}
		d.tx.DelElements = append(d.tx.DelElements, e)
	}
	for e := range newEls {
		if _, ok := oldEls[e]; ok {
			continue
		}
		if d.sharable[e.Set] && d.ref(e, 1) > 1 {
			continue
		}
		d.tx.AddElements = append(d.tx.AddElements, e)
	}

	for _, u := range old.Uses {
		if !slices.Contains(new.Uses, u) {
			d.delta(u, -1)
		}
	}
	for _, u := range new.Uses {
		if !slices.Contains(old.Uses, u) {
			d.delta(u, 1)
		}
	}
}

// addPart is diffPart from nothing: the full-sync fast path, without the maps a real diff needs.
func (d *diffState) addPart(p *Part) {
	d.tx.AddChains = append(d.tx.AddChains, p.Chains...)
	for _, s := range p.Sets {
		d.sets[s.Name] = s
		d.tx.AddSets = append(d.tx.AddSets, s)
	}
	if d.lazyAdds {
		ap := addedPart{p: p}
		i := int32(0)
		for e := range p.AllElements() {
			if d.sharable[e.Set] && d.ref(e, 1) > 1 {
				ap.skip = append(ap.skip, i)
			}
			i++
		}
		if n := int(i) - len(ap.skip); n > 0 {
			d.tx.addParts = append(d.tx.addParts, ap)
			d.tx.nAdd += n
		}
	} else {
		for e := range p.AllElements() {
			if d.sharable[e.Set] && d.ref(e, 1) > 1 {
				continue
			}
			d.tx.AddElements = append(d.tx.AddElements, e)
		}
	}
	for _, u := range p.Uses {
		d.delta(u, 1)
	}
}

// delta changes the reference count of shared chain n by delta, in this sync's changes (made on
// first use: most incremental syncs change none).
func (d *diffState) delta(n string, delta int) {
	if d.sharedDelta == nil {
		d.sharedDelta = map[string]int{}
	}
	d.sharedDelta[n] += delta
}

// ref adds delta to the number of parts that hold e, an element of a sharable set, and returns the
// new number; an element no part holds is forgotten.
func (d *diffState) ref(e Element, delta int) int {
	if d.refs != nil {
		return d.refs.add(e, delta)
	}
	n := d.elemRefs[e] + delta
	if n <= 0 {
		delete(d.elemRefs, e)
	} else {
		d.elemRefs[e] = n
	}
	return n
}

// shared builds shared chain n (DiffOptions.SharedChain).
func (d *diffState) shared(n string) *Chain {
	if d.sharedChain == nil {
		panic(fmt.Sprintf("dataplane: a part uses shared chain %q, but the diff has no DiffOptions.SharedChain", n))
	}
	return d.sharedChain(n)
}

// addNeighbours gives a full sync the unused shared chains the role asks for (DiffOptions.Neighbours),
// at reference count 0, as a chain that fell out of use.
func (d *diffState) addNeighbours() {
	for _, n := range d.neighbours(d.sharedRefs) {
		d.tx.AddChains = append(d.tx.AddChains, d.shared(n))
		d.sharedRefs[n] = 0
	}
}

// finish turns the shared-chain reference changes into chain additions and deletions, and removes
// element changes that cancel out (an element deleted by one Service and added by another).
func (d *diffState) finish() {
	names := make([]string, 0, len(d.sharedDelta))
	for n := range d.sharedDelta {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		before, exists := d.sharedRefs[n]
		after := before + d.sharedDelta[n]
		if !exists && after > 0 {
			d.tx.AddChains = append(d.tx.AddChains, d.shared(n))
		}
		// A picker that falls out of use stays (at reference count 0, still in sharedRefs): adding
		// it back would be a rule with a jump, which makes the kernel re-validate the whole table,
		// and Services often move between the same few endpoint counts. A full sync drops the
		// unused ones. (Adding it again while it exists would append a second rule to the chain,
		// one more binding of the endpoint map on every flap.)
		if exists || after > 0 {
			d.sharedRefs[n] = max(after, 0)
		}
	}
	clear(d.sharedDelta)
	if d.tx.Full && d.neighbours != nil {
		d.addNeighbours()
	}
	if len(d.tx.DelElements) > 0 && len(d.tx.AddElements) > 0 {
		adds := make(map[Element]int, len(d.tx.AddElements))
		for i, e := range d.tx.AddElements {
			adds[e] = i
		}
		drop := map[int]bool{}
		dels := d.tx.DelElements[:0]
		for _, e := range d.tx.DelElements {
			if i, ok := adds[e]; ok && !drop[i] {
				drop[i] = true
				continue
			}
			dels = append(dels, e)
		}
		d.tx.DelElements = dels
		if len(drop) > 0 {
			out := d.tx.AddElements[:0]
			for i, e := range d.tx.AddElements {
				if !drop[i] {
					out = append(out, e)
				}
			}
			d.tx.AddElements = out
		}
	}
}
