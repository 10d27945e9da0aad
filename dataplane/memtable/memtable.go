// Package memtable is an in-memory nftables kernel for the engine's transactions: a
// dataplane.Programmer that applies each dataplane.Tx to a model of the table, in the order the
// netlink edge sends its messages (dataplane.Tx documents it), with the checks the kernel makes, and
// refuses a transaction as the kernel would: all of it or nothing, with the kernel's errno.
//
// The engine's tests used to record transactions or accept them blindly; whether every transaction
// of a sync, applied in order, leaves the table a full build of the same state gives, was checked
// only in a network namespace. Here it is checked in microseconds, so a property test can walk
// thousands of random changes (property_test.go), and the same walk against the kernel checks this
// model (kernel_test.go). knftables has its Fake and Cilium its FakeLBMaps for the same reason.
//
// What the model checks, as the kernel does (nf_tables_api.c):
//
//   - a batch that is not a full replacement needs its table (ENOENT);
//   - a set exists before its elements are added or deleted, and before a rule looks it up (ENOENT),
//     and a rule reads a verdict or data out of a map of that data type (EINVAL);
//   - a chain exists before a rule is added to it, flushed or deleted, and before a rule or a verdict
//     map element jumps or goes to it (ENOENT); never to a base chain (EOPNOTSUPP);
//   - adding a chain or set that exists changes nothing (NLM_F_CREATE without NLM_F_EXCL) but a set's
//     timeout, unless its hook or kind differs (EEXIST): a chain's rules stay, and the rules added
//     next are appended;
//   - a chain still referenced by a rule or an element is not deleted (EBUSY), nor a set a rule uses;
//   - an element whose key exists is accepted when its data is the same (the batch's NEWSETELEM has
//     NLM_F_CREATE, not NLM_F_EXCL: netlink_batch.go) and refused otherwise (EEXIST); an interval
//     that overlaps another (a prefix set) is refused (EEXIST); deleting a missing element fails
//     (ENOENT);
//   - at commit, the jumps (rules and verdict elements) form no loop (EMLINK), and a NAT action is only
//     reached from a nat base chain of a hook that allows it (EOPNOTSUPP).
//
// It also refuses, without an errno, what the kernel would accept but the engine never means: an
// address of the other family (the edge would cut it to the table's address length).
//
// What it does not model: the jump depth limit, reject's hooks, and the kinds of rule and set that
// only the gateway uses beyond their names (which chains and sets they refer to); the netdev tables
// not at all. Affinity maps are filled by packets, so here they stay empty and a purge only checks
// that its map exists.
package memtable

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"syscall"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
)

// Error is a refused transaction: the errno the kernel answers, and what it was refusing.
type Error struct {
	Errno syscall.Errno
	// What names the message the kernel refused ("adding rule 2 to chain x"), Why says why in words.
	What string
	Why  string
}

func (e *Error) Error() string {
	return fmt.Sprintf("nftables batch rejected: %s: %v (%s)", e.What, e.Errno, e.Why)
}

// Unwrap makes errors.Is(err, syscall.EBUSY) hold, as it does for the netlink edge's errors.
func (e *Error) Unwrap() error { return e.Errno }

// Programmer is the in-memory kernel. Its zero value holds no tables and accepts transactions.
type Programmer struct {
	// Fail, when set, is asked first about every transaction: an error it returns refuses the
	// transaction as the kernel would (nothing applied). Tests inject failures with it.
	Fail func(tx *dataplane.Tx) error

	mu        sync.Mutex
	tables    map[tableKey]*table
	committed int
	refused   int
}

// tableKey names a table as the kernel does: family and name.
type tableKey struct {
	family cluster.Family
	name   string
}

type table struct {
	chains     map[string]*chain
	chainOrder []string // creation order: the order the kernel lists them in
	sets       map[string]*set
	setOrder   []string
}

type chain struct {
	def   dataplane.Chain // without rules
	rules []dataplane.Rule
	// refs counts the rules and verdict elements that jump or go to it: the kernel's chain->use
	// less the chain's own rules.
	refs int
}

type set struct {
	def dataplane.Set
	// elems holds the elements, at the index of their key (Element.Key) in index: a list, so that
	// Table copies it in one piece.
	elems []dataplane.Element
	index map[dataplane.Element]int
	// refs counts the rules that look it up: a set bound to a rule is not deleted.
	refs int
}

// Committed and Refused count the transactions applied and refused.
func (p *Programmer) Committed() int { p.mu.Lock(); defer p.mu.Unlock(); return p.committed }

// Refused counts the transactions refused (Fail's included; not one whose purge failed after the
// commit, which counts as committed).
func (p *Programmer) Refused() int { p.mu.Lock(); defer p.mu.Unlock(); return p.refused }

// Apply applies tx atomically, or refuses it (an *Error for what the kernel refuses; the netlink
// edge's own error for what it would not encode) and leaves the table as it was. Purges run after
// the commit, as the netlink edge runs them: a purge that fails does not undo the transaction.
func (p *Programmer) Apply(tx *dataplane.Tx) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.Fail != nil {
		if err := p.Fail(tx); err != nil {
			p.refused++
			return err
		}
	}
	if tx.Family != cluster.IPv4 && tx.Family != cluster.IPv6 {
		p.refused++
		return fmt.Errorf("memtable models ip and ip6 tables only, not family %d", tx.Family)
	}
	k := tableKey{tx.Family, tx.Table}
	w := &work{tx: tx, t: p.tables[k], ownChains: map[string]bool{}, ownSets: map[string]bool{}}
	if err := w.apply(); err != nil {
		p.refused++
		return err
	}
	if p.tables == nil {
		p.tables = map[tableKey]*table{}
	}
	if w.t == nil {
		delete(p.tables, k)
	} else {
		p.tables[k] = w.t
	}
	p.committed++
	for _, pg := range tx.Purges {
		// The edge dumps the map, then deletes its stale clients: a map that is gone fails the dump.
		if w.t == nil || w.t.sets[pg.Set] == nil {
			return fmt.Errorf("removing clients of departed endpoints from affinity maps: reading map %s: %w", pg.Set, syscall.ENOENT)
		}
	}
	return nil
}

// Table returns family f's table name as the engine's model (nil if there is none): chains and
// sets in the order the kernel lists them (creation order: TestWalkAgainstKernel checks it),
// elements in no particular order (as a hash set's; FlatEqual and Render sort them). It is a
// copy: the caller may keep it. Comments are kept as the transactions gave them (the kernel keeps
// those of rules and sets, not of chains; dataplane.FlatEqual ignores them all).
func (p *Programmer) Table(f cluster.Family, name string) *dataplane.Flat {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.tables[tableKey{f, name}]
	if t == nil {
		return nil
	}
	out := &dataplane.Flat{Family: f, Table: name, Chains: make(map[string]*dataplane.Chain, len(t.chains)),
		Sets: make(map[string]*dataplane.Set, len(t.sets)), Elements: map[string][]dataplane.Element{},
		ChainOrder: slices.Clone(t.chainOrder), SetOrder: slices.Clone(t.setOrder)}
	for n, c := range t.chains {
		ch := c.def
		ch.Rules = slices.Clone(c.rules)
		for i := range ch.Rules {
			ch.Rules[i].Matches = slices.Clone(ch.Rules[i].Matches)
		}
		out.Chains[n] = &ch
	}
	for n, s := range t.sets {
		def := s.def
		out.Sets[n] = &def
		if len(s.elems) > 0 {
			out.Elements[n] = slices.Clone(s.elems)
		}
	}
	return out
}

// Tables lists the tables held, as nft names them ("ip vipgate"), sorted.
func (p *Programmer) Tables() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for k := range p.tables {
		fam := "ip"
		if k.family == cluster.IPv6 {
			fam = "ip6"
		}
		out = append(out, fam+" "+k.name)
	}
	slices.Sort(out)
	return out
}

// work is one transaction being applied: a copy-on-write view of the table, so that a refused
// transaction leaves the committed table untouched (the kernel aborts the whole batch).
type work struct {
	tx *dataplane.Tx
	t  *table
	// ownChains and ownSets: the chains and sets already copied for this transaction.
	ownChains, ownSets map[string]bool
	// created: the table was (re)created by this transaction.
	created bool
}

func refuse(errno syscall.Errno, what, why string, args ...any) error {
	return &Error{Errno: errno, What: what, Why: fmt.Sprintf(why, args...)}
}

// writable copies the table's maps once per transaction.
func (w *work) writable() {
	if w.created {
		return
	}
	old := w.t
	w.t = &table{chains: maps.Clone(old.chains), chainOrder: slices.Clone(old.chainOrder),
		sets: maps.Clone(old.sets), setOrder: slices.Clone(old.setOrder)}
	w.created = true
}

func (w *work) chainW(name string) *chain {
	c := w.t.chains[name]
	if c == nil || w.ownChains[name] {
		return c
	}
	w.writable()
	cp := *c
	cp.rules = slices.Clone(c.rules)
	w.t.chains[name] = &cp
	w.ownChains[name] = true
	return &cp
}

func (w *work) setW(name string) *set {
	s := w.t.sets[name]
	if s == nil || w.ownSets[name] {
		return s
	}
	w.writable()
	cp := *s
	cp.elems = slices.Clone(s.elems)
	cp.index = maps.Clone(s.index)
	w.t.sets[name] = &cp
	w.ownSets[name] = true
	return &cp
}

// apply follows the netlink edge's order (dataplane.Tx, netlink.go's encode).
func (w *work) apply() error {
	tx := w.tx
	if tx.Full {
		// Add, delete and re-create the table: whatever it held is gone.
		w.t = &table{chains: map[string]*chain{}, sets: map[string]*set{}}
		w.created = true
	} else if w.t == nil {
		if !w.sendsNothing() {
			return refuse(syscall.ENOENT, "table "+tx.Table, "no such table: a transaction other than a full one needs the table")
		}
		return nil
	}
	for _, s := range tx.AddSets {
		if err := w.addSet(s); err != nil {
			return err
		}
	}
	for _, c := range tx.AddChains {
		if err := w.addChain(c); err != nil {
			return err
		}
	}
	for _, c := range tx.FlushChains {
		if err := w.flushChain(c.Name, "flushing chain "+c.Name); err != nil {
			return err
		}
	}
	for _, list := range [][]*dataplane.Chain{tx.AddChains, tx.FlushChains} {
		for _, c := range list {
			for i, r := range c.Rules {
				if err := w.addRule(c.Name, i, r); err != nil {
					return err
				}
			}
		}
	}
	for _, e := range tx.DelElements {
		if err := w.delElement(e); err != nil {
			return err
		}
	}
	for e := range tx.AddedElements() {
		if err := w.addElement(e); err != nil {
			return err
		}
	}
	for _, n := range tx.DelChains {
		if err := w.flushChain(n, "flushing chain "+n+" before deleting it"); err != nil {
			return err
		}
	}
	for _, n := range tx.DelChains {
		if err := w.delChain(n); err != nil {
			return err
		}
	}
	for _, n := range tx.DelSets {
		if err := w.delSet(n); err != nil {
			return err
		}
	}
	return w.validate()
}

// sendsNothing says whether the edge's batch for tx would be empty (then it sends none).
func (w *work) sendsNothing() bool {
	tx := w.tx
	return len(tx.AddSets) == 0 && len(tx.AddChains) == 0 && len(tx.FlushChains) == 0 && len(tx.DelElements) == 0 &&
		tx.NumAddElements() == 0 && len(tx.DelChains) == 0 && len(tx.DelSets) == 0
}

func (w *work) addSet(s *dataplane.Set) error {
	what := "adding set " + s.Name
	if old := w.t.sets[s.Name]; old != nil {
		// NEWSET with NLM_F_CREATE and no NLM_F_EXCL: an existing set of the same shape keeps its
		// elements and takes the new timeout (as Linux 6.18 does, TestKernelRulesInNetns); another
		// shape is refused.
		if old.def.Kind != s.Kind {
			return refuse(syscall.EEXIST, what, "a set of that name exists with another kind (%d, not %d)", old.def.Kind, s.Kind)
		}
		if old.def.Timeout != s.Timeout {
			w.setW(s.Name).def.Timeout = s.Timeout
		}
		return nil
	}
	w.writable()
	w.t.sets[s.Name] = &set{def: *s, index: map[dataplane.Element]int{}}
	w.ownSets[s.Name] = true
	w.t.setOrder = append(w.t.setOrder, s.Name)
	return nil
}

func (w *work) addChain(c *dataplane.Chain) error {
	what := "adding chain " + c.Name
	if old := w.t.chains[c.Name]; old != nil {
		// NEWCHAIN with NLM_F_CREATE and no NLM_F_EXCL: an existing chain is kept, rules and all
		// (the rules of the transaction are appended to them); its hook cannot change.
		o := old.def
		if o.IsBase() != c.IsBase() || o.Type != c.Type || o.Hook != c.Hook || o.Priority != c.Priority {
			return refuse(syscall.EEXIST, what, "the chain exists with another type, hook or priority")
		}
		return nil
	}
	w.writable()
	def := *c
	def.Rules = nil
	w.t.chains[c.Name] = &chain{def: def}
	w.ownChains[c.Name] = true
	w.t.chainOrder = append(w.t.chainOrder, c.Name)
	return nil
}

// ruleChain is the chain rule r jumps or goes to ("" for none).
func ruleChain(r dataplane.Rule) string {
	if r.Action.Kind == dataplane.ActJump || r.Action.Kind == dataplane.ActGoto {
		return r.Action.Chain
	}
	return ""
}

// ruleSets lists the sets rule r looks up (or updates), with the kinds each may be (nil: any).
// The kernel checks only that a lookup which yields data (a verdict map's verdict, an endpoint
// map's address and port) is of a map whose data is of that type (nft_lookup_init: EINVAL); a
// plain lookup's key length it does not check against what the rule loaded (a hairpin lookup in an
// address set is accepted: TestKernelRulesInNetns), so neither does the model (render refuses it).
func ruleSets(r dataplane.Rule) []setRef {
	var out []setRef
	for _, m := range r.Matches {
		if m.Set != "" {
			out = append(out, setRef{name: m.Set})
		}
	}
	a := r.Action
	var kinds []dataplane.SetKind
	switch a.Kind {
	case dataplane.ActVmapTuple, dataplane.ActVmapProtoPort:
		kinds = verdictMaps
	case dataplane.ActDNATTupleMap, dataplane.ActDNATProtoPortMap, dataplane.ActAffinityRecall:
		kinds = dataMaps
	}
	if a.Map != "" {
		out = append(out, setRef{a.Map, kinds})
	}
	if a.Set != "" {
		ref := setRef{name: a.Set}
		if a.Kind == dataplane.ActAffinityRecall {
			ref.kinds = kinds
		}
		out = append(out, ref)
	}
	return out
}

// verdictMaps and dataMaps are the set kinds that are maps, of verdicts and of data.
var (
	verdictMaps = []dataplane.SetKind{dataplane.KindTupleVmap, dataplane.KindProtoPortVmap}
	dataMaps    = []dataplane.SetKind{dataplane.KindTupleEndpoints, dataplane.KindProtoPortEndpoints, dataplane.KindAffinity}
)

type setRef struct {
	name  string
	kinds []dataplane.SetKind
}

func (w *work) addRule(chainName string, i int, r dataplane.Rule) error {
	what := fmt.Sprintf("adding rule %d to chain %s", i, chainName)
	c := w.chainW(chainName)
	if c == nil {
		return refuse(syscall.ENOENT, what, "no such chain")
	}
	for _, ref := range ruleSets(r) {
		if _, known := w.tx.Sets[ref.name]; !known && !w.addsSet(ref.name) {
			// The edge encodes a set reference from the transaction's kinds: it fails before sending.
			return fmt.Errorf("chain %s rule %d: unknown set %q", chainName, i, ref.name)
		}
		s := w.t.sets[ref.name]
		if s == nil {
			return refuse(syscall.ENOENT, what, "the rule looks up set %s, which does not exist", ref.name)
		}
		if ref.kinds != nil && !slices.Contains(ref.kinds, s.def.Kind) {
			return refuse(syscall.EINVAL, what, "the rule reads data out of set %s of kind %d, which holds none of that type", ref.name, s.def.Kind)
		}
	}
	if target := ruleChain(r); target != "" {
		if err := w.refChain(target, what); err != nil {
			return err
		}
	}
	for _, ref := range ruleSets(r) {
		w.setW(ref.name).refs++
	}
	// A copy of the matches: the table outlives the transaction, whose rules the engine may share.
	r.Matches = slices.Clone(r.Matches)
	c.rules = append(c.rules, r)
	return nil
}

// addsSet says whether the transaction adds set n (the edge then references it by its ID).
func (w *work) addsSet(n string) bool {
	return slices.ContainsFunc(w.tx.AddSets, func(s *dataplane.Set) bool { return s.Name == n })
}

// refChain takes a reference on chain target for a jump, a goto or a verdict element.
func (w *work) refChain(target, what string) error {
	t := w.chainW(target)
	if t == nil {
		return refuse(syscall.ENOENT, what, "it jumps to chain %s, which does not exist", target)
	}
	if t.def.IsBase() {
		return refuse(syscall.EOPNOTSUPP, what, "it jumps to base chain %s", target)
	}
	t.refs++
	return nil
}

func (w *work) unrefChain(target string) {
	if t := w.chainW(target); t != nil {
		t.refs--
	}
}

func (w *work) flushChain(name, what string) error {
	c := w.chainW(name)
	if c == nil {
		return refuse(syscall.ENOENT, what, "no such chain")
	}
	for _, r := range c.rules {
		if target := ruleChain(r); target != "" {
			w.unrefChain(target)
		}
		for _, ref := range ruleSets(r) {
			if s := w.setW(ref.name); s != nil {
				s.refs--
			}
		}
	}
	c.rules = nil
	return nil
}

func (w *work) delChain(name string) error {
	what := "deleting chain " + name
	c := w.t.chains[name]
	if c == nil {
		return refuse(syscall.ENOENT, what, "no such chain")
	}
	if c.refs > 0 {
		return refuse(syscall.EBUSY, what, "%d rules or verdict elements still jump to it", c.refs)
	}
	w.writable()
	delete(w.t.chains, name)
	w.t.chainOrder = slices.DeleteFunc(w.t.chainOrder, func(n string) bool { return n == name })
	return nil
}

func (w *work) delSet(name string) error {
	what := "deleting set " + name
	s := w.t.sets[name]
	if s == nil {
		return refuse(syscall.ENOENT, what, "no such set")
	}
	if s.refs > 0 {
		return refuse(syscall.EBUSY, what, "%d rules still look it up", s.refs)
	}
	for _, e := range s.elems {
		if verdictChain(e) != "" {
			w.unrefChain(verdictChain(e))
		}
	}
	w.writable()
	delete(w.t.sets, name)
	w.t.setOrder = slices.DeleteFunc(w.t.setOrder, func(n string) bool { return n == name })
	return nil
}

// verdictChain is the chain a verdict element goes to ("" for none). A reject verdict is stored as
// a goto to the reject chain (dataplane.VerdictReject).
func verdictChain(e dataplane.Element) string {
	if e.Verdict == dataplane.VerdictGoto || e.Verdict == dataplane.VerdictReject {
		return e.Chain
	}
	return ""
}

// kernelData is what the kernel stores as an element's data, for comparing two elements of one key.
func kernelData(e dataplane.Element) dataplane.Element {
	d := dataplane.Element{DataAddr: e.DataAddr, DataPort: e.DataPort, Chain: verdictChain(e)}
	switch e.Verdict {
	case dataplane.VerdictGoto, dataplane.VerdictReject:
		d.Verdict = dataplane.VerdictGoto
	default:
		d.Verdict = e.Verdict
	}
	return d
}

// elementSet finds the set of an element, as the edge and then the kernel do.
func (w *work) elementSet(e dataplane.Element, what string) (*set, error) {
	kind, ok := w.tx.Sets[e.Set]
	if !ok {
		return nil, fmt.Errorf("element for unknown set %q", e.Set) // the edge's encoding error
	}
	s := w.setW(e.Set)
	if s == nil {
		return nil, refuse(syscall.ENOENT, what, "no such set")
	}
	if s.def.Kind != kind.Kind {
		return nil, refuse(syscall.EINVAL, what, "the set is of kind %d, the transaction encodes kind %d", s.def.Kind, kind.Kind)
	}
	if err := w.checkFamily(e, what); err != nil {
		return nil, err
	}
	return s, nil
}

// checkFamily refuses an element with an address of the other family. The kernel would not: the
// netlink edge writes the address into a key of the table's address length, so an IPv6 address in
// an IPv4 table is cut to its first 4 bytes and accepted (TestKernelRulesInNetns), a wrong element
// programmed without a word. The model refuses it, without an errno: the engine never means it.
func (w *work) checkFamily(e dataplane.Element, what string) error {
	want6 := w.tx.Family == cluster.IPv6
	for _, a := range []netip.Addr{e.Addr, e.Addr2, e.Prefix.Addr(), e.DataAddr} {
		if a.IsValid() && a.Is6() != want6 {
			return fmt.Errorf("%s: address %s is not of the table's family (the kernel would take a truncated key)", what, a)
		}
	}
	return nil
}

func (w *work) addElement(e dataplane.Element) error {
	what := fmt.Sprintf("adding element %+v to set %s", e, e.Set)
	s, err := w.elementSet(e, what)
	if err != nil {
		return err
	}
	k := e.Key()
	if i, ok := s.index[k]; ok {
		old := s.elems[i]
		if kernelData(old) != kernelData(e) {
			return refuse(syscall.EEXIST, what, "the key exists with other data (%+v)", old)
		}
		return nil // NLM_F_CREATE without NLM_F_EXCL: the same element again is accepted
	}
	if s.def.Kind == dataplane.KindPrefix {
		for _, o := range s.elems {
			if o.Prefix.Overlaps(e.Prefix) {
				return refuse(syscall.EEXIST, what, "the interval overlaps %s", o.Prefix)
			}
		}
	}
	if c := verdictChain(e); c != "" {
		if err := w.refChain(c, what); err != nil {
			return err
		}
	}
	s.index[k] = len(s.elems)
	s.elems = append(s.elems, e)
	return nil
}

func (w *work) delElement(e dataplane.Element) error {
	what := fmt.Sprintf("deleting element %+v from set %s", e, e.Set)
	s, err := w.elementSet(e, what)
	if err != nil {
		return err
	}
	k := e.Key()
	i, ok := s.index[k]
	if !ok {
		return refuse(syscall.ENOENT, what, "no such element")
	}
	old := s.elems[i]
	if c := verdictChain(old); c != "" {
		w.unrefChain(c)
	}
	// The last element takes the deleted one's place.
	last := len(s.elems) - 1
	if i != last {
		s.elems[i] = s.elems[last]
		s.index[s.elems[i].Key()] = i
	}
	s.elems = s.elems[:last]
	delete(s.index, k)
	return nil
}

// validate is the kernel's table validation at commit: no loop of jumps, NAT only where its hook
// allows it.
func (w *work) validate() error {
	if w.t == nil {
		return nil
	}
	// The chains each set's verdict elements go to, once: endpoint maps hold thousands of elements
	// and no verdict.
	goes := map[string][]string{}
	for n, s := range w.t.sets {
		seen := map[string]bool{}
		for _, e := range s.elems {
			if t := verdictChain(e); t != "" && !seen[t] {
				seen[t] = true
				goes[n] = append(goes[n], t)
			}
		}
	}
	edges := func(c *chain) []string {
		var out []string
		for _, r := range c.rules {
			if t := ruleChain(r); t != "" {
				out = append(out, t)
			}
			for _, ref := range ruleSets(r) {
				out = append(out, goes[ref.name]...)
			}
		}
		return out
	}
	// Loops: a depth-first walk over every chain, grey while on the walk's path.
	const white, grey, black = 0, 1, 2
	colour := map[string]int{}
	var visit func(n string) error
	visit = func(n string) error {
		colour[n] = grey
		c := w.t.chains[n]
		for _, t := range edges(c) {
			switch colour[t] {
			case grey:
				// The kernel finds a loop as a walk that goes too deep: EMLINK, not ELOOP.
				return refuse(syscall.EMLINK, "committing table "+w.tx.Table, "chain %s jumps back to %s: a loop", n, t)
			case white:
				if w.t.chains[t] == nil {
					continue
				}
				if err := visit(t); err != nil {
					return err
				}
			}
		}
		colour[n] = black
		return nil
	}
	names := slices.Sorted(maps.Keys(w.t.chains))
	for _, n := range names {
		if colour[n] == white {
			if err := visit(n); err != nil {
				return err
			}
		}
	}
	// NAT: every chain a base chain reaches is validated against that base chain's type and hook.
	for _, n := range names {
		base := w.t.chains[n]
		if !base.def.IsBase() {
			continue
		}
		seen := map[string]bool{}
		stack := []string{n}
		for len(stack) > 0 {
			cn := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if seen[cn] {
				continue
			}
			seen[cn] = true
			c := w.t.chains[cn]
			if c == nil {
				continue
			}
			for i, r := range c.rules {
				if hooks := natHooks(r.Action.Kind); hooks != nil {
					if base.def.Type != dataplane.NATType || !slices.Contains(hooks, base.def.Hook) {
						return refuse(syscall.EOPNOTSUPP, "committing table "+w.tx.Table,
							"chain %s rule %d NATs, and is reached from base chain %s (%s %s)", cn, i, n, base.def.Type, base.def.Hook)
					}
				}
			}
			stack = append(stack, edges(c)...)
		}
	}
	return nil
}

// natHooks lists the hooks a NAT action may run in (nft_nat_validate, nft_masq_validate); nil for
// an action that does not NAT.
func natHooks(k dataplane.ActionKind) []dataplane.Hook {
	switch k {
	case dataplane.ActMasquerade, dataplane.ActMasqClearMark:
		return []dataplane.Hook{dataplane.HookPostrouting}
	case dataplane.ActDNATTupleMap, dataplane.ActDNATProtoPortMap, dataplane.ActAffinityDNAT, dataplane.ActAffinityRecall,
		dataplane.ActDNATProtoPortJhashMap, dataplane.ActDNATSrcHashMap, dataplane.ActDNATProtoPortSrcHashMap, dataplane.ActDNATRoundRobin:
		return []dataplane.Hook{dataplane.HookPrerouting, dataplane.HookOutput}
	}
	return nil
}

var _ dataplane.Programmer = (*Programmer)(nil)
