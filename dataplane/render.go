package dataplane

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vipgate/vipgate/cluster"
)

// This file renders a Flat table in `nft -f` syntax: what `vipgate render` prints, what the golden
// files hold, and what `nft -c -f` checks in the tests. Each match and action kind has exactly the
// meaning documented in model.go; an unknown kind, an element of the wrong family or a reference to a
// chain or set the table does not hold is an error, never a guess.

// Render writes f as one `table <family> <name> { ... }` block in `nft -f` syntax. Sets come first in
// f.SetOrder, then chains in f.ChainOrder; elements are sorted, so the output is stable.
func Render(w io.Writer, f *Flat) error {
	bw := bufio.NewWriter(w)
	err := render(bw, f)
	if ferr := bw.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("writing ruleset: %w", ferr)
	}
	return err
}

// RenderString renders f into a string. If f cannot be rendered (see Render), the text up to the
// failure is followed by a line starting with "!render-error:", which nft refuses to parse, so a broken
// rendering can never be loaded by mistake.
func RenderString(f *Flat) string {
	var b strings.Builder
	if err := Render(&b, f); err != nil {
		fmt.Fprintf(&b, "\n!render-error: %v\n", err)
	}
	return b.String()
}

// nftFamily is the nft spelling of what depends on the IP family.
type nftFamily struct {
	table    string // "ip" / "ip6": table family and payload protocol
	addrType string // "ipv4_addr" / "ipv6_addr"
	// netdev: the table is of the netdev family, its packets of this IP family (gateway_netdev.go).
	netdev bool
}

// tableFamily is the nft keyword of the table's family.
func (f nftFamily) tableFamily() string {
	if f.netdev {
		return "netdev"
	}
	return f.table
}

func familyOf(f cluster.Family) (nftFamily, error) {
	if isNetdev(f) {
		fam, err := familyOf(ipFamily(f))
		fam.netdev = true
		return fam, err
	}
	switch f {
	case cluster.IPv4:
		return nftFamily{table: "ip", addrType: "ipv4_addr"}, nil
	case cluster.IPv6:
		return nftFamily{table: "ip6", addrType: "ipv6_addr"}, nil
	}
	return nftFamily{}, fmt.Errorf("unknown IP family %d", f)
}

func render(w *bufio.Writer, f *Flat) error {
	if f == nil {
		return fmt.Errorf("rendering: no ruleset")
	}
	fam, err := familyOf(f.Family)
	if err != nil {
		return fmt.Errorf("rendering table %q: %w", f.Table, err)
	}
	if f.Table == "" {
		return fmt.Errorf("rendering: table has no name")
	}
	fmt.Fprintf(w, "table %s %s {\n", fam.tableFamily(), f.Table)
	for _, name := range orderedNames(f.SetOrder, f.Sets) {
		if err := renderSet(w, f, fam, f.Sets[name]); err != nil {
			return fmt.Errorf("rendering table %s %s: %w", fam.tableFamily(), f.Table, err)
		}
	}
	// Elements of sets the table does not declare would be lost silently: refuse them.
	for name, els := range f.Elements {
		if _, ok := f.Sets[name]; !ok && len(els) > 0 {
			return fmt.Errorf("rendering table %s %s: %d elements for undeclared set %q", fam.tableFamily(), f.Table, len(els), name)
		}
	}
	for _, name := range orderedNames(f.ChainOrder, f.Chains) {
		if err := renderChain(w, f, fam, f.Chains[name]); err != nil {
			return fmt.Errorf("rendering table %s %s: %w", fam.tableFamily(), f.Table, err)
		}
	}
	w.WriteString("}\n")
	return nil
}

// orderedNames returns the names of m in the given order, followed (sorted) by any that the order
// misses, so nothing in the table is left out of the rendering.
func orderedNames[V any](order []string, m map[string]V) []string {
	out := make([]string, 0, len(m))
	seen := make(map[string]bool, len(m))
	for _, n := range order {
		if _, ok := m[n]; ok && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	var rest []string
	for n := range m {
		if !seen[n] {
			rest = append(rest, n)
		}
	}
	slices.Sort(rest)
	return append(out, rest...)
}

// setDecl returns the keyword (set or map) and the declaration lines of a set kind.
func setDecl(fam nftFamily, s *Set) (keyword string, lines []string, err error) {
	a := fam.addrType
	switch s.Kind {
	case KindAddr:
		return "set", []string{"type " + a}, nil
	case KindPrefix:
		return "set", []string{"type " + a, "flags interval"}, nil
	case KindTupleVmap:
		return "map", []string{"type " + a + " . inet_proto . inet_service : verdict"}, nil
	case KindProtoPortVmap:
		return "map", []string{"type inet_proto . inet_service : verdict"}, nil
	case KindTupleEndpoints:
		// `typeof`, not `type ... . mark`: nft types `numgen random mod N` as a plain integer and
		// refuses to look it up in a map keyed by mark.
		return "map", []string{fmt.Sprintf("typeof %[1]s daddr . meta l4proto . th dport . numgen random mod 1 : %[1]s daddr . th dport", fam.table)}, nil
	case KindProtoPortEndpoints:
		return "map", []string{fmt.Sprintf("typeof meta l4proto . th dport . numgen random mod 1 : %s daddr . th dport", fam.table)}, nil
	case KindTupleAddr:
		return "map", []string{fmt.Sprintf("typeof %[1]s daddr . meta l4proto . th dport . numgen random mod 1 : %[1]s daddr", fam.table)}, nil
	case KindHairpin:
		return "set", []string{"type " + a + " . " + a + " . inet_proto . inet_service"}, nil
	}
	if d := setKindDescs[s.Kind]; d != nil { // kinds.go
		keyword, lines := d.decl(fam, s)
		return keyword, lines, nil
	}
	return "", nil, fmt.Errorf("set %q: unknown set kind %d", s.Name, s.Kind)
}

// setDeclGateway is setDecl with the gateway connection table's maps first (gateway_conntable.go).
func setDeclGateway(fam nftFamily, s *Set) (string, []string, error) {
	if lines, ok := gatewaySetDecl(fam, s); ok {
		return "map", lines, nil
	}
	return setDecl(fam, s)
}

func renderSet(w *bufio.Writer, f *Flat, fam nftFamily, s *Set) error {
	keyword, lines, err := setDeclGateway(fam, s)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\t%s %s {\n", keyword, s.Name)
	for _, l := range lines {
		fmt.Fprintf(w, "\t\t%s\n", l)
	}
	if s.Comment != "" {
		fmt.Fprintf(w, "\t\tcomment %s\n", quote(s.Comment))
	}
	els := slices.Clone(f.Elements[s.Name])
	slices.SortFunc(els, compareElements)
	if len(els) > 0 {
		if setKindDynamic(s.Kind) {
			return fmt.Errorf("set %q: a dynamic affinity map has no static elements", s.Name)
		}
		w.WriteString("\t\telements = {\n")
		for _, e := range els {
			text, err := elementText(f, fam, s, e)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "\t\t\t%s,\n", text)
		}
		w.WriteString("\t\t}\n")
	}
	w.WriteString("\t}\n")
	return nil
}

// compareElements orders elements by key, then data, for stable output.
func compareElements(a, b Element) int {
	return cmp.Or(
		a.Addr.Compare(b.Addr),
		a.Addr2.Compare(b.Addr2),
		a.Prefix.Addr().Compare(b.Prefix.Addr()),
		cmp.Compare(a.Prefix.Bits(), b.Prefix.Bits()),
		cmp.Compare(a.Proto, b.Proto),
		cmp.Compare(a.Port, b.Port),
		cmp.Compare(a.Index, b.Index),
		cmp.Compare(a.Verdict, b.Verdict),
		strings.Compare(a.Chain, b.Chain),
		a.DataAddr.Compare(b.DataAddr),
		cmp.Compare(a.DataPort, b.DataPort),
	)
}

// addrText checks that a is a valid address of the table's family and formats it.
func addrText(fam nftFamily, a netip.Addr) (string, error) {
	if !a.IsValid() {
		return "", fmt.Errorf("missing address")
	}
	a = a.Unmap()
	if (fam.table == "ip") != a.Is4() {
		return "", fmt.Errorf("address %s does not belong in a table of family %s", a, fam.table)
	}
	return a.String(), nil
}

func prefixText(fam nftFamily, p netip.Prefix) (string, error) {
	if !p.IsValid() {
		return "", fmt.Errorf("missing prefix")
	}
	if _, err := addrText(fam, p.Addr()); err != nil {
		return "", err
	}
	return p.Masked().String(), nil
}

// verdictText is the nft spelling of a verdict stored in a verdict map.
func verdictText(f *Flat, e Element) (string, error) {
	switch e.Verdict {
	case VerdictGoto:
		if err := needChain(f, e.Chain); err != nil {
			return "", err
		}
		return "goto " + e.Chain, nil
	case VerdictDrop:
		return "drop", nil
	case VerdictReject:
		// A verdict map cannot hold reject itself: it goes to the chain that rejects.
		c := cmp.Or(e.Chain, ChainReject)
		if err := needChain(f, c); err != nil {
			return "", err
		}
		return "goto " + c, nil
	}
	return "", fmt.Errorf("unknown verdict kind %d", e.Verdict)
}

func needChain(f *Flat, name string) error {
	if _, ok := f.Chains[name]; !ok {
		return fmt.Errorf("reference to missing chain %q", name)
	}
	return nil
}

// elementText formats one element of set s.
func elementText(f *Flat, fam nftFamily, s *Set, e Element) (string, error) {
	wrap := func(err error) error { return fmt.Errorf("set %q element %+v: %w", s.Name, e, err) }
	proto := ProtoName(e.Proto)
	port := strconv.Itoa(int(e.Port))
	switch s.Kind {
	case KindAddr:
		a, err := addrText(fam, e.Addr)
		if err != nil {
			return "", wrap(err)
		}
		return a, nil
	case KindPrefix:
		p, err := prefixText(fam, e.Prefix)
		if err != nil {
			return "", wrap(err)
		}
		return p, nil
	case KindTupleVmap, KindProtoPortVmap:
		v, err := verdictText(f, e)
		if err != nil {
			return "", wrap(err)
		}
		if s.Kind == KindProtoPortVmap {
			return proto + " . " + port + " : " + v, nil
		}
		a, err := addrText(fam, e.Addr)
		if err != nil {
			return "", wrap(err)
		}
		return a + " . " + proto + " . " + port + " : " + v, nil
	case KindTupleAddr:
		d, err := addrText(fam, e.DataAddr)
		if err != nil {
			return "", wrap(err)
		}
		a, err := addrText(fam, e.Addr)
		if err != nil {
			return "", wrap(err)
		}
		return a + " . " + proto + " . " + port + " . " + strconv.FormatUint(uint64(e.Index), 10) + " : " + d, nil
	case KindTupleEndpoints, KindProtoPortEndpoints:
		d, err := addrText(fam, e.DataAddr)
		if err != nil {
			return "", wrap(err)
		}
		data := d + " . " + strconv.Itoa(int(e.DataPort))
		key := proto + " . " + port + " . " + strconv.FormatUint(uint64(e.Index), 10)
		if s.Kind == KindProtoPortEndpoints {
			return key + " : " + data, nil
		}
		a, err := addrText(fam, e.Addr)
		if err != nil {
			return "", wrap(err)
		}
		return a + " . " + key + " : " + data, nil
	case KindHairpin:
		a, err := addrText(fam, e.Addr)
		if err != nil {
			return "", wrap(err)
		}
		a2, err := addrText(fam, e.Addr2)
		if err != nil {
			return "", wrap(err)
		}
		return a + " . " + a2 + " . " + proto + " . " + port, nil
	}
	if t, ok, err := gatewayElementText(fam, s, e); ok { // gateway_conntable.go
		if err != nil {
			return "", wrap(err)
		}
		return t, nil
	}
	return "", wrap(fmt.Errorf("unknown set kind %d", s.Kind))
}

func renderChain(w *bufio.Writer, f *Flat, fam nftFamily, c *Chain) error {
	fmt.Fprintf(w, "\tchain %s {\n", c.Name)
	if c.Comment != "" {
		fmt.Fprintf(w, "\t\tcomment %s\n", quote(c.Comment))
	}
	if c.IsBase() {
		if c.Type == "" {
			return fmt.Errorf("base chain %q has no type", c.Name)
		}
		dev, err := chainDevicesText(fam, c)
		if err != nil {
			return fmt.Errorf("base chain %q: %w", c.Name, err)
		}
		fmt.Fprintf(w, "\t\ttype %s hook %s%s priority %d; policy accept;\n", c.Type, c.Hook, dev, c.Priority)
	}
	for i, r := range c.Rules {
		text, err := ruleText(f, fam, r)
		if err != nil {
			return fmt.Errorf("chain %q rule %d: %w", c.Name, i, err)
		}
		fmt.Fprintf(w, "\t\t%s\n", text)
	}
	w.WriteString("\t}\n")
	return nil
}

// RuleText renders one rule of table f in nft syntax (as it appears inside a chain block).
func RuleText(f *Flat, r Rule) (string, error) {
	fam, err := familyOf(f.Family)
	if err != nil {
		return "", err
	}
	return ruleText(f, fam, r)
}

func ruleText(f *Flat, fam nftFamily, r Rule) (string, error) {
	parts := make([]string, 0, len(r.Matches)+2)
	for _, m := range r.Matches {
		s, err := matchText(f, fam, m)
		if err != nil {
			return "", err
		}
		parts = append(parts, s)
	}
	s, err := actionText(f, fam, r.Action)
	if err != nil {
		return "", err
	}
	parts = append(parts, s)
	if r.Comment != "" {
		parts = append(parts, "comment "+quote(r.Comment))
	}
	return strings.Join(parts, " "), nil
}

// needSet checks that f declares set name with one of the given kinds.
func needSet(f *Flat, name string, kinds ...SetKind) error {
	s, ok := f.Sets[name]
	if !ok {
		return fmt.Errorf("reference to missing set %q", name)
	}
	if !slices.Contains(kinds, s.Kind) {
		return fmt.Errorf("set %q has kind %d, want one of %v", name, s.Kind, kinds)
	}
	return nil
}

// addrSetKinds are the sets an address can be looked up in.
var addrSetKinds = []SetKind{KindAddr, KindPrefix, KindAffinity}

func matchText(f *Flat, fam nftFamily, m Match) (string, error) {
	ip := fam.table
	switch m.Kind {
	case MatchCtStateNew:
		return "ct state new", nil
	case MatchCtStatusDNAT:
		return "ct status dnat", nil
	case MatchDaddrInSet:
		return ip + " daddr @" + m.Set, needSet(f, m.Set, addrSetKinds...)
	case MatchSaddrInSet:
		return ip + " saddr @" + m.Set, needSet(f, m.Set, addrSetKinds...)
	case MatchSaddrNotInSet:
		return ip + " saddr != @" + m.Set, needSet(f, m.Set, addrSetKinds...)
	case MatchSaddrInPrefix:
		p, err := prefixText(fam, m.Prefix)
		if err != nil {
			return "", fmt.Errorf("saddr match: %w", err)
		}
		return ip + " saddr " + p, nil
	case MatchFibSaddrLocal:
		return "fib saddr type local", nil
	case MatchMarkAny:
		return fmt.Sprintf("meta mark & %#x != 0", m.Value), nil
	case MatchHairpin:
		return fmt.Sprintf("%[1]s saddr . %[1]s daddr . meta l4proto . th dport @%s", ip, m.Set), needSet(f, m.Set, KindHairpin)
	case MatchNumgenZero:
		if m.Value == 0 {
			return "", fmt.Errorf("numgen modulus 0")
		}
		return fmt.Sprintf("numgen random mod %d == 0", m.Value), nil
	case MatchFragment:
		return fragmentText(fam), nil // gateway_netdev.go
	case MatchPktTypeHost:
		return "meta pkttype host", nil // gateway_netdev.go
	}
	return "", fmt.Errorf("unknown match kind %d", m.Kind)
}

func actionText(f *Flat, fam nftFamily, a Action) (string, error) {
	ip := fam.table
	tuple := ip + " daddr . meta l4proto . th dport"
	switch a.Kind {
	case ActJump:
		return "jump " + a.Chain, needChain(f, a.Chain)
	case ActGoto:
		return "goto " + a.Chain, needChain(f, a.Chain)
	case ActReturn:
		return "return", nil
	case ActDrop:
		return "drop", nil
	case ActReject:
		return "reject", nil
	case ActMarkSet:
		return fmt.Sprintf("meta mark set meta mark | %#x", a.Value), nil
	case ActMasqClearMark:
		return fmt.Sprintf("meta mark set meta mark ^ %#x masquerade fully-random", a.Value), nil
	case ActMasquerade:
		return "masquerade fully-random", nil
	case ActVmapTuple:
		return tuple + " vmap @" + a.Map, needSet(f, a.Map, KindTupleVmap)
	case ActVmapProtoPort:
		return "meta l4proto . th dport vmap @" + a.Map, needSet(f, a.Map, KindProtoPortVmap)
	case ActDNATTupleMap, ActDNATProtoPortMap:
		if a.Value == 0 {
			return "", fmt.Errorf("numgen modulus 0")
		}
		key, kind := tuple, KindTupleEndpoints
		if a.Kind == ActDNATProtoPortMap {
			key, kind = "meta l4proto . th dport", KindProtoPortEndpoints
		}
		return fmt.Sprintf("dnat %s addr . port to %s . numgen random mod %d map @%s", ip, key, a.Value, a.Map), needSet(f, a.Map, kind)
	}
	if d := actionKindDescs[a.Kind]; d != nil { // kinds.go
		return d.text(f, fam, a)
	}
	return gatewayActionText(f, fam, a) // gateway_ir.go; unknown kinds fail there
}

// quote makes s an nft string literal. nft strings cannot escape a double quote, and comments are
// limited to 128 bytes by the kernel.
func quote(s string) string {
	return `"` + commentText(s) + `"`
}
