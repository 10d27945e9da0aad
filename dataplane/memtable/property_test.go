package memtable_test

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/memtable"
	"github.com/vipgate/vipgate/proxy"
)

var (
	flagSteps = flag.Int("memtable.steps", 0, "steps of each random walk (default 75 per seed, 300 in all; or $VIPGATE_MEMTABLE_STEPS)")
	flagSeeds = flag.String("memtable.seeds", "", "comma-separated seeds of the walks (default 1,2,3,4; or $VIPGATE_MEMTABLE_SEEDS)")
)

// walkSteps is the number of steps of each walk: the flag, the environment, or def.
func walkSteps(def int) int {
	if *flagSteps > 0 {
		return *flagSteps
	}
	if n, err := strconv.Atoi(os.Getenv("VIPGATE_MEMTABLE_STEPS")); err == nil && n > 0 {
		return n
	}
	return def
}

func walkSeeds(def []uint64) []uint64 {
	s := *flagSeeds
	if s == "" {
		s = os.Getenv("VIPGATE_MEMTABLE_SEEDS")
	}
	if s == "" {
		return def
	}
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			panic(fmt.Sprintf("-memtable.seeds: %q is not a number", f))
		}
		out = append(out, n)
	}
	return out
}

// TestIncrementalSyncsGiveTheFullBuild: through random walks of Service changes, the transactions of
// every sync, applied in order to the in-memory kernel, leave
//
//   - exactly the table the proxier believes the kernel holds (its own Flatten), and
//   - the table a fresh proxier's full build of the same state gives, but for the unused endpoint
//     pickers (inUse says why they differ), and in any order of chains and sets (sorted),
//
// compared as FlatEqual does plus comments at every step, and as rendered nft text every
// renderEvery'th (checkTables).
//
// A transaction the kernel would refuse fails the walk too: the proxier would recover with a full
// sync, but a change that always fails is a change that always costs a full sync. Every 40th
// transaction or so is refused on purpose (memtable.Programmer.Fail) to walk the recovery path too:
// the next sync replaces the table. The walk found that changing an affinity timeout from one value
// to another always failed (TestAffinityTimeoutChange, now fixed).
func TestIncrementalSyncsGiveTheFullBuild(t *testing.T) {
	cfg := walkConfig()
	total := 0
	for _, seed := range walkSeeds([]uint64{1, 2, 3, 4}) {
		steps := walkSteps(75)
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			w := newWalk(seed)
			prog := &memtable.Programmer{}
			injected, maxChains, maxElements := 0, 0, 0
			// Its own generator: the walk is the same with failures injected or not (and the same
			// as TestWalkAgainstKernel's).
			fail := rand.New(rand.NewPCG(seed, 40))
			var ops opCounts
			prog.Fail = func(tx *dataplane.Tx) error {
				ops.count(tx)
				if !tx.Full && fail.IntN(40) == 0 {
					injected++
					return errors.New("injected failure")
				}
				return nil
			}
			p := proxy.NewProxier(hclog.NewNullLogger(), cfg, prog)
			st := w.state()
			for step := 0; step <= steps; step++ {
				if step > 0 {
					st = w.step()
				}
				n := injected
				if _, err := p.Sync(st); err != nil {
					if injected > n {
						// Injected: the kernel kept the previous table; the next sync replaces it.
						if _, err := p.Sync(st); err != nil {
							t.Fatalf("seed %d step %d: the full sync after an injected failure failed: %v\n%s", seed, step, err, w.report())
						}
					} else {
						t.Fatalf("seed %d step %d (%s): the kernel would refuse the sync: %v\n%s", seed, step, w.stepDesc, err, w.report())
					}
				}
				chains, elements := checkTables(t, step, fmt.Sprintf("seed %d step %d (%s)", seed, step, w.stepDesc), cfg, p, prog, st, w)
				maxChains, maxElements = max(maxChains, chains), max(maxElements, elements)
			}
			t.Logf("seed %d: %d steps, %d transactions applied, %d refused (%d injected); largest table %d chains, %d elements; %s",
				seed, steps, prog.Committed(), prog.Refused(), injected, maxChains, maxElements, ops)
			if prog.Refused() != injected {
				t.Errorf("refused %d transactions, injected %d", prog.Refused(), injected)
			}
		})
		total += steps
	}
	t.Logf("%d steps in all", total)
}

// opCounts counts what the walk's transactions did, to show what it exercised.
type opCounts struct{ full, addSets, addChains, flushChains, delElements, addElements, delChains, delSets, purges int }

func (c *opCounts) count(tx *dataplane.Tx) {
	c.full += b2i(tx.Full)
	if tx.Full {
		return
	}
	c.addSets += len(tx.AddSets)
	c.addChains += len(tx.AddChains)
	c.flushChains += len(tx.FlushChains)
	c.delElements += len(tx.DelElements)
	c.addElements += tx.NumAddElements()
	c.delChains += len(tx.DelChains)
	c.delSets += len(tx.DelSets)
	c.purges += len(tx.Purges)
}

func (c opCounts) String() string {
	return fmt.Sprintf("%d full transactions; in the others +%d sets, +%d chains, %d chains flushed, -%d/+%d elements, -%d chains, -%d sets, %d purges",
		c.full, c.addSets, c.addChains, c.flushChains, c.delElements, c.addElements, c.delChains, c.delSets, c.purges)
}

// checkTables compares the in-memory kernel's tables with the proxier's belief and with a fresh
// proxier's full build of st (at times applied to a second in-memory kernel, which must accept it).
// Tables are compared as FlatEqual does and their comments too; every renderEvery'th step, and on
// any difference, as rendered nft text.
// It returns the size of the larger table: chains, and elements.
func checkTables(t *testing.T, step int, at string, cfg proxy.Config, p *proxy.Proxier, prog *memtable.Programmer, st *cluster.State, w *walk) (chains, elements int) {
	t.Helper()
	// The fresh build goes through a second in-memory kernel every renderEvery'th step (and
	// through prog itself after every full sync of the walk); else it is only built.
	render := step%renderEvery == 0
	var freshMem *memtable.Programmer
	var freshProg dataplane.Programmer = discard{}
	if render {
		freshMem = &memtable.Programmer{}
		freshProg = freshMem
	}
	fresh := proxy.NewProxier(hclog.NewNullLogger(), cfg, freshProg)
	if _, err := fresh.Sync(st); err != nil {
		t.Fatalf("%s: the kernel would refuse a full build of the state: %v\n%s", at, err, w.report())
	}
	for _, f := range families {
		mem := prog.Table(f, "vipgate")
		if mem == nil {
			t.Fatalf("%s: no IPv%d table in memory", at, f)
		}
		n := 0
		for _, els := range mem.Elements {
			n += len(els)
		}
		chains, elements = max(chains, len(mem.Chains)), max(elements, n)
		// The proxier's own view: what it will diff the next sync against.
		own := p.Flatten(f)
		if own == nil {
			t.Fatalf("%s: the proxier has no IPv%d ruleset", at, f)
		}
		if why := differ(mem, own, render); why != "" {
			t.Fatalf("%s, IPv%d: the kernel's table is not what the proxier believes it is: %s\n%s", at, f, why, w.report())
		}
		want := fresh.Flatten(f)
		if freshMem != nil {
			if why := differ(freshMem.Table(f, "vipgate"), want, false); why != "" {
				t.Fatalf("%s, IPv%d: a full build's transaction does not give the full build: %s\n%s", at, f, why, w.report())
			}
		}
		if why := differ(inUse(mem), inUse(want), render); why != "" {
			t.Fatalf("%s, IPv%d: the kernel's table is not what a full build of the same state gives: %s\n%s", at, f, why, w.report())
		}
	}
	return chains, elements
}

// discard accepts every transaction.
type discard struct{}

func (discard) Apply(*dataplane.Tx) error { return nil }

// renderEvery: how often the tables are compared as text as well (rendering a Maglev map's
// thousands of elements costs more than the rest of a step).
const renderEvery = 10

// differ says how a and b differ ("" if they do not): their program (FlatEqual), their comments,
// and, if render, their text.
func differ(a, b *dataplane.Flat, render bool) string {
	ok, why := dataplane.FlatEqual(a, b)
	if ok {
		why = sameComments(a, b)
	}
	if why == "" && !render {
		return ""
	}
	ta, tb := dataplane.RenderString(sorted(a)), dataplane.RenderString(sorted(b))
	if ta == tb && why == "" {
		return ""
	}
	if why == "" {
		why = "the texts differ"
	}
	return why + ":\n" + textDiff(ta, tb, 40)
}

// sameComments compares what FlatEqual does not: the comments of chains, rules and sets.
func sameComments(a, b *dataplane.Flat) string {
	for n, x := range a.Chains {
		y := b.Chains[n]
		if x.Comment != y.Comment {
			return fmt.Sprintf("chain %s: comment %q vs %q", n, x.Comment, y.Comment)
		}
		for i := range x.Rules {
			if x.Rules[i].Comment != y.Rules[i].Comment {
				return fmt.Sprintf("chain %s rule %d: comment %q vs %q", n, i, x.Rules[i].Comment, y.Rules[i].Comment)
			}
		}
	}
	for n, x := range a.Sets {
		if y := b.Sets[n]; x.Comment != y.Comment {
			return fmt.Sprintf("set %s: comment %q vs %q", n, x.Comment, y.Comment)
		}
	}
	return ""
}

// report is a failure's reproduction: the steps taken.
func (w *walk) report() string {
	var b strings.Builder
	b.WriteString("steps so far (replay with -memtable.seeds and -memtable.steps):\n")
	start := max(0, len(w.log)-15)
	if start > 0 {
		fmt.Fprintf(&b, "  ... %d earlier steps\n", start)
	}
	for i := start; i < len(w.log); i++ {
		fmt.Fprintf(&b, "  %d: %s\n", i+1, w.log[i])
	}
	return b.String()
}

// TestKernelRules: the in-memory kernel refuses what the kernel refuses, with its errno, and leaves
// the table as it was. (kernel_test.go runs the same cases against the kernel.)
func TestKernelRules(t *testing.T) {
	for _, c := range ruleCases() {
		t.Run(c.name, func(t *testing.T) {
			prog := &memtable.Programmer{}
			for i, tx := range c.setup {
				if err := prog.Apply(tx); err != nil {
					t.Fatalf("setup transaction %d: %v", i, err)
				}
			}
			before := prog.Table(cluster.IPv4, "t")
			err := prog.Apply(c.tx)
			if c.errno == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
			} else {
				if !errors.Is(err, c.errno) {
					t.Fatalf("got %v, want %v", err, c.errno)
				}
				after := prog.Table(cluster.IPv4, "t")
				if (before == nil) != (after == nil) {
					t.Fatalf("a refused transaction created or deleted the table")
				}
				if before != nil {
					if ok, why := dataplane.FlatEqual(before, after); !ok {
						t.Fatalf("a refused transaction changed the table: %s", why)
					}
				}
			}
			if c.check != nil {
				c.check(t, prog.Table(cluster.IPv4, "t"))
			}
		})
	}
}

// TestOtherFamilyElement: memtable refuses an element of the other family, which the kernel takes
// cut to the table's address length (TestKernelRulesInNetns' cases cannot hold it: the two differ).
func TestOtherFamilyElement(t *testing.T) {
	prog := &memtable.Programmer{}
	for _, c := range ruleCases()[:1] {
		if err := prog.Apply(c.tx); err != nil {
			t.Fatal(err)
		}
	}
	err := prog.Apply(&dataplane.Tx{Family: cluster.IPv4, Table: "t", Sets: ruleCases()[0].tx.Sets,
		AddElements: []dataplane.Element{{Set: "a", Addr: mustAddr("2001:db8::1")}}})
	var me *memtable.Error
	if err == nil || errors.As(err, &me) {
		t.Fatalf("got %v, want memtable's own refusal (not the kernel's)", err)
	}
}

// ruleCase is one kernel rule: transactions that set a table up, one more, and the errno the kernel
// answers it with (0: accepted).
type ruleCase struct {
	name  string
	setup []*dataplane.Tx
	tx    *dataplane.Tx
	errno syscall.Errno
	check func(t *testing.T, f *dataplane.Flat)
}

func ruleCases() []ruleCase {
	vmap := &dataplane.Set{Name: "vm", Kind: dataplane.KindProtoPortVmap}
	addrs := &dataplane.Set{Name: "a", Kind: dataplane.KindAddr}
	ranges := &dataplane.Set{Name: "r", Kind: dataplane.KindPrefix}
	aff := &dataplane.Set{Name: "aff", Kind: dataplane.KindAffinity, Timeout: 60e9}
	sets := map[string]*dataplane.Set{"vm": vmap, "a": addrs, "r": ranges, "aff": aff}
	base := &dataplane.Chain{Name: "pre", Type: dataplane.NATType, Hook: dataplane.HookPrerouting, Priority: dataplane.PriorityDstNAT}
	x := &dataplane.Chain{Name: "x"}
	y := &dataplane.Chain{Name: "y"}
	tx := func(full bool) *dataplane.Tx {
		return &dataplane.Tx{Family: cluster.IPv4, Table: "t", Full: full, Sets: sets}
	}
	jump := func(to string) dataplane.Rule {
		return dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActJump, Chain: to}}
	}
	lookupA := dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: "a"}}, Action: dataplane.Action{Kind: dataplane.ActReturn}}
	a1 := dataplane.Element{Set: "a", Addr: mustAddr("192.0.2.1")}
	el := func(port uint16, chain string) dataplane.Element {
		if chain == "" {
			return dataplane.Element{Set: "vm", Proto: 6, Port: port, Verdict: dataplane.VerdictDrop}
		}
		return dataplane.Element{Set: "vm", Proto: 6, Port: port, Verdict: dataplane.VerdictGoto, Chain: chain}
	}
	pfx := func(p string) dataplane.Element { return dataplane.Element{Set: "r", Prefix: mustPrefix(p)} }
	with := func(t *dataplane.Tx, f func(*dataplane.Tx)) *dataplane.Tx { f(t); return t }
	// setup: a table with the three sets, chains pre (base) -> x, and y.
	setup := with(tx(true), func(t *dataplane.Tx) {
		t.AddSets = []*dataplane.Set{vmap, addrs, ranges, aff}
		pre := *base
		pre.Rules = []dataplane.Rule{jump("x"), {Action: dataplane.Action{Kind: dataplane.ActVmapProtoPort, Map: "vm"}}}
		xc := *x
		xc.Rules = []dataplane.Rule{lookupA}
		t.AddChains = []*dataplane.Chain{&pre, &xc, y}
		t.AddElements = []dataplane.Element{a1, el(80, "y"), pfx("198.51.100.0/24")}
	})
	return []ruleCase{
		{name: "a full replacement from nothing", tx: setup},
		{name: "no table", tx: with(tx(false), func(t *dataplane.Tx) { t.AddElements = []dataplane.Element{a1} }), errno: syscall.ENOENT},
		{name: "element of a missing set", setup: []*dataplane.Tx{with(tx(true), func(t *dataplane.Tx) { t.AddChains = []*dataplane.Chain{y} })},
			tx: with(tx(false), func(t *dataplane.Tx) { t.AddElements = []dataplane.Element{a1} }), errno: syscall.ENOENT},
		{name: "the same element again", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) { t.AddElements = []dataplane.Element{a1, el(80, "y")} })},
		{name: "a key again with other data", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) { t.AddElements = []dataplane.Element{el(80, "")} }), errno: syscall.EEXIST},
		{name: "a key deleted and added with other data", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) {
				t.DelElements = []dataplane.Element{el(80, "y")}
				t.AddElements = []dataplane.Element{el(80, "")}
			})},
		{name: "deleting a missing element", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) { t.DelElements = []dataplane.Element{el(81, "y")} }), errno: syscall.ENOENT},
		{name: "an overlapping interval", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) { t.AddElements = []dataplane.Element{pfx("198.51.100.128/25")} }), errno: syscall.EEXIST},
		{name: "the same interval again", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) { t.AddElements = []dataplane.Element{pfx("198.51.100.0/24")} })},
		{name: "an adjacent interval", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) { t.AddElements = []dataplane.Element{pfx("198.51.101.0/24")} })},
		{name: "deleting a chain a rule jumps to", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) { t.DelChains = []string{"x"} }), errno: syscall.EBUSY},
		{name: "deleting a chain an element goes to", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) { t.DelChains = []string{"y"} }), errno: syscall.EBUSY},
		{name: "deleting a chain and the element that goes to it", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) {
				t.DelElements = []dataplane.Element{el(80, "y")}
				t.DelChains = []string{"y"}
			})},
		{name: "deleting a set a rule looks up", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) { t.DelSets = []string{"a"} }), errno: syscall.EBUSY},
		{name: "deleting a set after flushing its rule", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) {
				xc := *x
				t.FlushChains = []*dataplane.Chain{&xc}
				t.DelSets = []string{"a"}
			})},
		{name: "a jump to a missing chain", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) {
				yc := *y
				yc.Rules = []dataplane.Rule{jump("nowhere")}
				t.FlushChains = []*dataplane.Chain{&yc}
			}), errno: syscall.ENOENT},
		{name: "an element going to a missing chain", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) { t.AddElements = []dataplane.Element{el(81, "nowhere")} }), errno: syscall.ENOENT},
		{name: "a loop of jumps", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) {
				yc := *y
				yc.Rules = []dataplane.Rule{jump("x")}
				xc := *x
				xc.Rules = []dataplane.Rule{lookupA, jump("y")}
				t.FlushChains = []*dataplane.Chain{&yc, &xc}
			}), errno: syscall.EMLINK},
		{name: "a loop through a verdict element", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) {
				yc := *y
				yc.Rules = []dataplane.Rule{{Action: dataplane.Action{Kind: dataplane.ActVmapProtoPort, Map: "vm"}}}
				t.FlushChains = []*dataplane.Chain{&yc}
			}), errno: syscall.EMLINK},
		{name: "a chain added again keeps its rules", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) {
				xc := *x
				xc.Rules = []dataplane.Rule{{Action: dataplane.Action{Kind: dataplane.ActReturn}}}
				t.AddChains = []*dataplane.Chain{&xc}
			}),
			check: func(t *testing.T, f *dataplane.Flat) {
				if n := len(f.Chains["x"].Rules); n != 2 {
					t.Errorf("chain x has %d rules, want its old one and the new one", n)
				}
			}},
		{name: "a set added again with another timeout", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) {
				a2 := *aff
				a2.Timeout = 120e9
				t.AddSets = []*dataplane.Set{&a2}
			}),
			check: func(t *testing.T, f *dataplane.Flat) {
				if d := f.Sets["aff"].Timeout; d != 120e9 {
					t.Errorf("timeout %v, want the new one, 2m", d)
				}
			}},
		{name: "masquerade reached from the prerouting hook", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) {
				xc := *x
				xc.Rules = []dataplane.Rule{{Action: dataplane.Action{Kind: dataplane.ActMasquerade}}}
				t.FlushChains = []*dataplane.Chain{&xc}
			}), errno: syscall.EOPNOTSUPP},
		{name: "a jump to a base chain", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) {
				yc := *y
				yc.Rules = []dataplane.Rule{jump("pre")}
				t.FlushChains = []*dataplane.Chain{&yc}
			}), errno: syscall.EOPNOTSUPP},
		{name: "a hairpin lookup in an address set", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) {
				yc := *y
				yc.Rules = []dataplane.Rule{{Matches: []dataplane.Match{{Kind: dataplane.MatchHairpin, Set: "a"}}, Action: dataplane.Action{Kind: dataplane.ActReturn}}}
				t.FlushChains = []*dataplane.Chain{&yc}
			})},
		{name: "a verdict map lookup in a plain set", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) {
				yc := *y
				yc.Rules = []dataplane.Rule{{Action: dataplane.Action{Kind: dataplane.ActVmapProtoPort, Map: "a"}}}
				t.FlushChains = []*dataplane.Chain{&yc}
			}), errno: syscall.EINVAL},
		{name: "an endpoint map lookup in a verdict map", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) {
				yc := *y
				yc.Rules = []dataplane.Rule{{Action: dataplane.Action{Kind: dataplane.ActDNATProtoPortMap, Map: "vm", Value: 1}}}
				t.FlushChains = []*dataplane.Chain{&yc}
			}), errno: syscall.EINVAL},
		{name: "a purge of a missing map", setup: []*dataplane.Tx{setup},
			tx: with(tx(false), func(t *dataplane.Tx) { t.Purges = []dataplane.AffinityPurge{{Set: "gone"}} }), errno: syscall.ENOENT},
	}
}

func mustAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }
func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// TestAffinityTimeoutChange is the smallest walk that failed: one ClusterIP Service with session
// affinity whose timeout changes (3h to 1m), nothing else. The engine diffed the changed affinity
// map as a deletion and an addition of the same name, but the netlink edge sends additions first
// and deletions last (Tx): the NEWSET updated the existing map in place, then the DELSET of that
// same map found it bound to the affinity chain's rules, unchanged and not flushed, and the kernel
// refused the whole batch with EBUSY (TestAffinityTimeoutChangeInNetns). Every edit of a Service's
// sessionAffinityConfig timeout cost a failed sync and a full one. Now a timeout other than the
// default is part of the map's name (proxy.affinitySetName): a change is a new map.
func TestAffinityTimeoutChange(t *testing.T) {
	prog := &memtable.Programmer{}
	affinityTimeoutChange(t, prog, true, func() *dataplane.Flat { return prog.Table(cluster.IPv4, "vipgate") })
}

// affinityTimeoutChange runs TestAffinityTimeoutChange's two syncs through prog, and compares the
// table that read returns with a full build.
// comments says whether read gives the comments too (memtable does; the kernel's table, read back,
// has no chain comments, which compareWithKernel does not compare either).
func affinityTimeoutChange(t *testing.T, prog dataplane.Programmer, comments bool, read func() *dataplane.Flat) {
	t.Helper()
	cfg := walkConfig()
	cfg.Families = []cluster.Family{cluster.IPv4}
	p := proxy.NewProxier(hclog.NewNullLogger(), cfg, prog)
	key := cluster.ServiceKey{Namespace: "walk", Name: "sticky"}
	svc := &cluster.Service{Key: key, Type: cluster.TypeClusterIP, ClusterIPs: []netip.Addr{mustAddr("10.96.0.30")},
		Ports: []cluster.ServicePort{{Name: "p0", Protocol: cluster.TCP, Port: 80}}, AffinityTimeout: 3 * time.Hour}
	slices := []*cluster.EndpointSlice{{Namespace: "walk", Name: "sticky-1", Service: key, Family: cluster.IPv4,
		Ports:     []cluster.EndpointPort{{Name: "p0", Protocol: cluster.TCP, Port: 8080}},
		Endpoints: []cluster.Endpoint{{Addresses: []netip.Addr{mustAddr("10.244.1.10")}, Ready: true, Serving: true, NodeName: "node1"}}}}
	st := &cluster.State{Services: map[cluster.ServiceKey]*cluster.Service{key: svc}, EndpointSlices: map[cluster.ServiceKey][]*cluster.EndpointSlice{key: slices}}
	if _, err := p.Sync(st); err != nil {
		t.Fatalf("first sync: %v", err)
	}
	changed := *svc
	changed.AffinityTimeout = time.Minute
	st = &cluster.State{Services: map[cluster.ServiceKey]*cluster.Service{key: &changed}, EndpointSlices: st.EndpointSlices}
	rep, err := p.Sync(st)
	if err != nil {
		var txs []string
		for _, tx := range rep.Txs {
			txs = append(txs, tx.String())
		}
		t.Fatalf("changing the affinity timeout from 3h to 1m: the kernel would refuse the sync: %v\ntransactions: %v", err, txs)
	}
	rs, _, err := proxy.BuildRuleset(cfg, cluster.IPv4, st)
	if err != nil {
		t.Fatal(err)
	}
	got, want := inUse(read()), inUse(rs.Flatten())
	why := differ(got, want, false)
	if !comments {
		_, why = dataplane.FlatEqual(got, want)
	}
	if why != "" {
		t.Fatalf("after the timeout change, the table is not a full build's: %s", why)
	}
}
