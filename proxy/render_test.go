package proxy

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/tablenames"
)

// updateGolden rewrites the golden files: go test ./proxy -run TestRender -update
var updateGolden = registerUpdateFlag()

// registerUpdateFlag defines -update unless another test file of the package already did.
func registerUpdateFlag() *bool {
	if f := flag.Lookup("update"); f != nil {
		v := f.Value.String() == "true"
		return &v
	}
	return flag.Bool("update", false, "rewrite golden files in testdata/")
}

// rdCases are the rulesets rendered to golden files: subsets of the flow-test fixture.
var rdCases = []struct {
	name string
	svcs []string // Service names from trFixture; nil: only the fixed base
	all  bool
}{
	{name: "base"},
	{name: "clusterip", svcs: []string{"web"}},
	{name: "nodeport", svcs: []string{"np", "np6"}},
	{name: "lb-local-source-ranges", svcs: []string{"lb-local", "lb-fw"}},
	{name: "affinity", svcs: []string{"affinity"}},
	{name: "no-endpoints", svcs: []string{"empty", "lb-local-none", "itp-local-none"}},
	{name: "all", all: true},
}

func rdServices(names []string, all bool) []trService {
	var out []trService
	for _, s := range trFixture() {
		if all || slices.Contains(names, s.svc.Key.Name) {
			out = append(out, s)
		}
	}
	return out
}

func rdFamilyName(f cluster.Family) string { return fmt.Sprintf("ipv%d", f) }

// TestRenderGolden renders every case for both families and compares with testdata/render/.
func TestRenderGolden(t *testing.T) {
	for _, tc := range rdCases {
		for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
			t.Run(tc.name+"/"+rdFamilyName(fam), func(t *testing.T) {
				f := trFlat(t, fam, false, rdServices(tc.svcs, tc.all))
				var b strings.Builder
				if err := dataplane.Render(&b, f); err != nil {
					t.Fatalf("Render: %v", err)
				}
				got := b.String()
				path := filepath.Join("testdata", "render", tc.name+"."+rdFamilyName(fam)+".nft")
				if *updateGolden {
					if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
						t.Fatal(err)
					}
					return
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("reading golden file (run with -update to create it): %v", err)
				}
				if diff := cmp.Diff(string(want), got); diff != "" {
					t.Errorf("%s differs (-want +got); run with -update if the change is intended:\n%s", path, diff)
				}
			})
		}
	}
}

// TestRenderDeterministic: the same ruleset renders the same, whatever the order of its elements.
func TestRenderDeterministic(t *testing.T) {
	f := trFlat(t, cluster.IPv4, false, rdServices(nil, true))
	first := dataplane.RenderString(f)
	for _, els := range f.Elements {
		slices.Reverse(els)
	}
	if diff := cmp.Diff(first, dataplane.RenderString(f)); diff != "" {
		t.Errorf("rendering depends on element order (-first +second):\n%s", diff)
	}
}

// TestRenderSpelling pins the nft spelling of each match and action kind (model.go's comments).
func TestRenderSpelling(t *testing.T) {
	f4 := trFlat(t, cluster.IPv4, false, rdServices(nil, true))
	f6 := trFlat(t, cluster.IPv6, false, rdServices(nil, true))
	cases := []struct {
		f    *dataplane.Flat
		rule dataplane.Rule
		want string
	}{
		{f4, dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchCtStateNew}}, Action: dataplane.Action{Kind: dataplane.ActJump, Chain: tablenames.ChainServices}}, "ct state new jump services"},
		{f4, dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchCtStatusDNAT}, {Kind: dataplane.MatchHairpin, Set: SetHairpin}}, Action: dataplane.Action{Kind: dataplane.ActMasquerade}},
			"ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random"},
		{f6, dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchDaddrInSet, Set: SetClusterIPs}, {Kind: dataplane.MatchSaddrNotInSet, Set: SetClusterCIDRs}}, Action: dataplane.Action{Kind: dataplane.ActGoto, Chain: ChainMarkForMasquerade}},
			"ip6 daddr @cluster-ips ip6 saddr != @cluster-cidrs goto mark-for-masquerade"},
		{f4, dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchSaddrInSet, Set: SetClusterCIDRs}}, Action: dataplane.Action{Kind: dataplane.ActReturn}, Comment: `say "hi"`},
			`ip saddr @cluster-cidrs return comment "say 'hi'"`},
		{f4, dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchSaddrInPrefix, Prefix: netip.MustParsePrefix("10.0.0.0/8")}}, Action: dataplane.Action{Kind: dataplane.ActDrop}}, "ip saddr 10.0.0.0/8 drop"},
		{f4, dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchFibSaddrLocal}}, Action: dataplane.Action{Kind: dataplane.ActReject}}, "fib saddr type local reject"},
		{f4, dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchMarkAny, Value: 0x4000}}, Action: dataplane.Action{Kind: dataplane.ActMasqClearMark, Value: 0x4000}},
			"meta mark & 0x4000 != 0 meta mark set meta mark ^ 0x4000 masquerade fully-random"},
		{f4, dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchMarkAny, Value: 0x4000}}, Action: dataplane.Action{Kind: dataplane.ActMasqClearMark, Value: 0x4000, Port: 1024, PortMax: 60999}},
			"meta mark & 0x4000 != 0 meta mark set meta mark ^ 0x4000 meta l4proto { tcp, udp, sctp } masquerade to :1024-60999 fully-random"},
		{f4, dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActMarkSet, Value: 0x4000}}, "meta mark set meta mark | 0x4000"},
		{f4, dataplane.Rule{Matches: []dataplane.Match{{Kind: dataplane.MatchNumgenZero, Value: 3}}, Action: dataplane.Action{Kind: dataplane.ActGoto, Chain: dataplane.ChainReject}}, "numgen random mod 3 == 0 goto reject-chain"},
		{f4, dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActVmapTuple, Map: tablenames.MapServiceIPs}}, "ip daddr . meta l4proto . th dport vmap @service-ips"},
		{f4, dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActVmapProtoPort, Map: MapServiceNodePorts}}, "meta l4proto . th dport vmap @service-nodeports"},
		{f4, dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActDNATTupleMap, Map: MapEndpoints, Value: 2}},
			"dnat ip addr . port to ip daddr . meta l4proto . th dport . numgen random mod 2 map @endpoints"},
		{f6, dataplane.Rule{Action: dataplane.Action{Kind: dataplane.ActDNATProtoPortMap, Map: MapNodePortEndpoints, Value: 5}},
			"dnat ip6 addr . port to meta l4proto . th dport . numgen random mod 5 map @nodeport-endpoints"},
	}
	for _, tc := range cases {
		got, err := dataplane.RuleText(tc.f, tc.rule)
		if err != nil {
			t.Errorf("RuleText(%+v): %v", tc.rule, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("RuleText(%+v) (-want +got):\n%s", tc.rule, diff)
		}
	}
	// Affinity DNAT, in both families, as found in the affinity chains.
	for _, f := range []*dataplane.Flat{f4, f6} {
		var found bool
		for _, c := range f.Chains {
			for _, r := range c.Rules {
				if r.Action.Kind != dataplane.ActAffinityDNAT {
					continue
				}
				found = true
				got, err := dataplane.RuleText(f, dataplane.Rule{Action: r.Action}) // the action alone; matches are spelt above
				if err != nil {
					t.Fatal(err)
				}
				ip, addr := "ip", r.Action.Addr.String()
				if f.Family == cluster.IPv6 {
					ip, addr = "ip6", "["+addr+"]"
				}
				want := fmt.Sprintf("update @%s { %s saddr : %s } meta l4proto { tcp, udp, sctp } dnat %s to %s:%d", r.Action.Set, ip, r.Action.Addr, ip, addr, r.Action.Port)
				if got != want {
					t.Errorf("affinity DNAT: got %q, want %q", got, want)
				}
			}
		}
		if !found {
			t.Errorf("IPv%d fixture has no affinity DNAT rule", f.Family)
		}
	}
}

// TestRenderErrors: what nft could not load, or what would lose meaning, is an error.
func TestRenderErrors(t *testing.T) {
	cases := []struct {
		name string
		edit func(f *dataplane.Flat)
		want string
	}{
		{"unknown match", func(f *dataplane.Flat) {
			f.Chains[tablenames.ChainServices].Rules[0].Matches = []dataplane.Match{{Kind: 99}}
		}, "unknown match kind 99"},
		{"unknown action", func(f *dataplane.Flat) {
			f.Chains[tablenames.ChainServices].Rules[0].Action = dataplane.Action{Kind: 99}
		}, "unknown action kind 99"},
		{"unknown set kind", func(f *dataplane.Flat) { f.Sets[SetHairpin].Kind = 99 }, "unknown set kind 99"},
		{"missing chain", func(f *dataplane.Flat) {
			f.Chains[tablenames.ChainServices].Rules[0].Action = dataplane.Action{Kind: dataplane.ActGoto, Chain: "gone"}
		}, `missing chain "gone"`},
		{"missing set", func(f *dataplane.Flat) {
			delete(f.Sets, SetClusterCIDRs)
			delete(f.Elements, SetClusterCIDRs)
		}, `missing set "cluster-cidrs"`},
		{"element of the wrong family", func(f *dataplane.Flat) {
			f.Elements[SetClusterIPs] = append(f.Elements[SetClusterIPs], dataplane.Element{Set: SetClusterIPs, Addr: trNodeIP6})
		}, "does not belong in a table of family ip"},
		{"element of an undeclared set", func(f *dataplane.Flat) { f.Elements["nope"] = []dataplane.Element{{Set: "nope"}} }, `undeclared set "nope"`},
		{"vmap element without verdict", func(f *dataplane.Flat) {
			f.Elements[tablenames.MapServiceIPs] = append(f.Elements[tablenames.MapServiceIPs], dataplane.Element{Set: tablenames.MapServiceIPs, Addr: trNodeIP4, Proto: dataplane.ProtoTCP, Port: 1})
		}, "unknown verdict kind 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := trFlat(t, cluster.IPv4, false, rdServices(nil, true))
			tc.edit(f)
			err := dataplane.Render(&strings.Builder{}, f)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Render error %v, want one containing %q", err, tc.want)
			}
			if s := dataplane.RenderString(f); !strings.Contains(s, "!render-error:") {
				t.Errorf("RenderString does not flag the error:\n%s", s)
			}
		})
	}
}

// TestRenderLoadsInKernel checks every rendered case with `nft -c -f` and then loads it for real, in a
// network namespace of its own (`nft -c` misses what the kernel only checks at commit, such as a dnat
// reachable from a filter chain).
func TestRenderLoadsInKernel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (creates a network namespace)")
	}
	nft, err := exec.LookPath("nft")
	if err != nil {
		t.Skip("nft not installed")
	}
	ns := fmt.Sprintf("vgt%d-render", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	dir := t.TempDir()
	for _, tc := range rdCases {
		for _, fam := range []cluster.Family{cluster.IPv4, cluster.IPv6} {
			for _, masqAll := range []bool{false, true} {
				name := fmt.Sprintf("%s/%s/masqueradeAll=%v", tc.name, rdFamilyName(fam), masqAll)
				t.Run(name, func(t *testing.T) {
					f := trFlat(t, fam, masqAll, rdServices(tc.svcs, tc.all))
					path := filepath.Join(dir, strings.ReplaceAll(name, "/", "_")+".nft")
					if err := os.WriteFile(path, []byte(dataplane.RenderString(f)), 0o644); err != nil {
						t.Fatal(err)
					}
					for _, args := range [][]string{{"-c", "-f", path}, {"-f", path}} {
						out, err := exec.Command("ip", append([]string{"netns", "exec", ns, nft}, args...)...).CombinedOutput()
						if err != nil {
							t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
						}
					}
					family := map[cluster.Family]string{cluster.IPv4: "ip", cluster.IPv6: "ip6"}[fam]
					out, err := exec.Command("ip", "netns", "exec", ns, nft, "list", "table", family, f.Table).CombinedOutput()
					if err != nil {
						t.Fatalf("nft list table: %v\n%s", err, out)
					}
					// Every chain and set made it into the kernel.
					for n := range f.Chains {
						if !strings.Contains(string(out), "chain "+n+" {") {
							t.Errorf("kernel table lacks chain %s", n)
						}
					}
					for n := range f.Sets {
						if !strings.Contains(string(out), " "+n+" {") {
							t.Errorf("kernel table lacks set %s", n)
						}
					}
					if out, err := exec.Command("ip", "netns", "exec", ns, nft, "delete", "table", family, f.Table).CombinedOutput(); err != nil {
						t.Fatalf("nft delete table: %v\n%s", err, out)
					}
				})
			}
		}
	}
}
