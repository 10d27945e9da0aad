package memtable_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/dptest"
	"github.com/vipgate/vipgate/dataplane/memtable"
	"github.com/vipgate/vipgate/proxy"
)

// TestKernelRulesInNetns: the kernel answers each of TestKernelRules' transactions as the in-memory
// kernel does (accepted, or refused with the same errno), in a throwaway network namespace; and
// after each case both hold the same table.
func TestKernelRulesInNetns(t *testing.T) {
	_, fd := dptest.Netns(t)
	kern := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	t.Cleanup(func() { kern.Close() })
	for _, c := range ruleCases() {
		t.Run(c.name, func(t *testing.T) {
			if err := kern.DeleteTable(cluster.IPv4, "t"); err != nil {
				t.Fatalf("clearing the table: %v", err)
			}
			mem := &memtable.Programmer{}
			for i, tx := range c.setup {
				if err := kern.Apply(tx); err != nil {
					t.Fatalf("setup transaction %d: the kernel refused it: %v", i, err)
				}
				if err := mem.Apply(tx); err != nil {
					t.Fatalf("setup transaction %d: memtable refused it: %v", i, err)
				}
			}
			kerr, merr := kern.Apply(c.tx), mem.Apply(c.tx)
			switch {
			case c.errno == 0 && kerr != nil:
				t.Errorf("the kernel refused it: %v (memtable: %v)", kerr, merr)
			case c.errno != 0 && !errors.Is(kerr, c.errno):
				t.Errorf("the kernel answered %v, the case expects %v (memtable: %v)", kerr, c.errno, merr)
			}
			compareWithKernel(t, "after the case", kern, mem, []cluster.Family{cluster.IPv4}, "t")
		})
	}
}

// compareWithKernel fails when the kernel's table and the in-memory one differ (FlatEqual: comments
// are not compared, the kernel does not keep a chain's).
func compareWithKernel(t *testing.T, at string, kern *dataplane.NetlinkProgrammer, mem *memtable.Programmer, fams []cluster.Family, table string) {
	t.Helper()
	for _, f := range fams {
		live, err := kern.ReadTable(f, table)
		var nf *dataplane.TableNotFoundError
		if errors.As(err, &nf) {
			live, err = nil, nil
		}
		if err != nil {
			t.Fatalf("%s: reading the IPv%d table: %v", at, f, err)
		}
		m := mem.Table(f, table)
		if (live == nil) != (m == nil) {
			t.Fatalf("%s, IPv%d: the kernel has the table: %v, memtable: %v", at, f, live != nil, m != nil)
		}
		if live == nil {
			continue
		}
		if !slices.Equal(live.ChainOrder, m.ChainOrder) || !slices.Equal(live.SetOrder, m.SetOrder) {
			t.Errorf("%s, IPv%d: the kernel lists chains %v and sets %v, memtable %v and %v", at, f, live.ChainOrder, live.SetOrder, m.ChainOrder, m.SetOrder)
		}
		if ok, why := dataplane.FlatEqual(live, m); !ok {
			t.Fatalf("%s, IPv%d: the kernel's table and memtable's differ: %s\n--- kernel:\n%s\n--- memtable:\n%s", at, f, why,
				dataplane.RenderString(sorted(live)), dataplane.RenderString(sorted(m)))
		}
	}
}

// TestWalkAgainstKernel takes the property test's walk (seed 1) once through the kernel: every
// transaction goes to the kernel and to memtable, and after every step the two tables are the same,
// and the kernel accepted exactly what memtable accepted.
func TestWalkAgainstKernel(t *testing.T) {
	_, fd := dptest.Netns(t)
	kern := &dataplane.NetlinkProgrammer{NetNSFd: fd}
	t.Cleanup(func() { kern.Close() })
	seeds := walkSeeds([]uint64{1})
	steps := walkSteps(60)
	cfg := walkConfig()
	for _, seed := range seeds {
		for _, f := range families {
			if err := kern.DeleteTable(f, "vipgate"); err != nil {
				t.Fatal(err)
			}
		}
		mem := &memtable.Programmer{}
		both := &tee{kern: kern, mem: mem}
		p := proxy.NewProxier(hclog.NewNullLogger(), cfg, both)
		w := newWalk(seed)
		st := w.state()
		for step := 0; step <= steps; step++ {
			if step > 0 {
				st = w.step()
			}
			at := fmt.Sprintf("seed %d step %d (%s)", seed, step, w.stepDesc)
			if _, err := p.Sync(st); err != nil {
				t.Logf("%s: sync failed in both: %v", at, err)
				if _, err := p.Sync(st); err != nil {
					t.Fatalf("%s: the full sync after a failure failed: %v", at, err)
				}
			}
			if both.disagree != "" {
				t.Fatalf("%s: %s\n%s", at, both.disagree, w.report())
			}
			compareWithKernel(t, at, kern, mem, families, "vipgate")
		}
		t.Logf("seed %d: %d steps, %d transactions, %d refused by both", seed, steps, mem.Committed()+mem.Refused(), mem.Refused())
	}
}

// tee applies every transaction to the kernel and to memtable, and notes when one accepts what the
// other refuses (or refuses it with another errno).
type tee struct {
	kern     *dataplane.NetlinkProgrammer
	mem      *memtable.Programmer
	disagree string
}

func (b *tee) Apply(tx *dataplane.Tx) error {
	kerr := b.kern.Apply(tx)
	merr := b.mem.Apply(tx)
	var me *memtable.Error
	switch {
	case (kerr == nil) != (merr == nil):
		b.disagree = fmt.Sprintf("the kernel answered %v, memtable %v, to %s", kerr, merr, tx)
	case errors.As(merr, &me) && !errors.Is(kerr, me.Errno):
		b.disagree = fmt.Sprintf("the kernel answered %v, memtable %v (another errno), to %s", kerr, merr, tx)
	}
	return kerr
}

// TestAffinityTimeoutChangeInNetns: the kernel refuses TestAffinityTimeoutChange's second sync as
// memtable does.
func TestAffinityTimeoutChangeInNetns(t *testing.T) {
	_, fd := dptest.Netns(t)
	kern := &dataplane.NetlinkProgrammer{NetNSFd: fd, Decode: proxy.DecodeOptions()}
	t.Cleanup(func() { kern.Close() })
	affinityTimeoutChange(t, kern, false, func() *dataplane.Flat {
		f, err := kern.ReadTable(cluster.IPv4, "vipgate")
		if err != nil {
			t.Fatal(err)
		}
		return f
	})
}
