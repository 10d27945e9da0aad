package dataplane

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"net/netip"
	"slices"
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

// setDecl returns the keyword (set or map) and the declaration lines of a set kind (kinds.go).
func setDecl(fam nftFamily, s *Set) (keyword string, lines []string, err error) {
	d := setKindDescs[s.Kind]
	if d == nil {
		return "", nil, fmt.Errorf("set %q: unknown set kind %d", s.Name, s.Kind)
	}
	keyword, lines = d.decl(fam, s)
	return keyword, lines, nil
}

func renderSet(w *bufio.Writer, f *Flat, fam nftFamily, s *Set) error {
	keyword, lines, err := setDecl(fam, s)
	if err != nil {
		return err
	}
	if s.Kind == KindTupleAddr {
		if all, _ := connsMaps(f); all[s.Name] {
			lines = gatewayConnsDecl(fam)
		}
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
		if SetKindDynamic(s.Kind) {
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

// elementText formats one element of set s (its kind's text, kinds.go).
func elementText(f *Flat, fam nftFamily, s *Set, e Element) (string, error) {
	wrap := func(err error) error { return fmt.Errorf("set %q element %+v: %w", s.Name, e, err) }
	d := setKindDescs[s.Kind]
	if d == nil || d.text == nil {
		return "", wrap(fmt.Errorf("unknown set kind %d", s.Kind))
	}
	t, err := d.text(f, fam, s, e)
	if err != nil {
		return "", wrap(err)
	}
	return t, nil
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

// matchText is the nft spelling of match m (its kind's text, kinds.go).
func matchText(f *Flat, fam nftFamily, m Match) (string, error) {
	d := matchKindDescs[m.Kind]
	if d == nil {
		return "", fmt.Errorf("unknown match kind %d", m.Kind)
	}
	return d.text(f, fam, m)
}

// actionText is the nft spelling of action a (its kind's text, kinds.go).
func actionText(f *Flat, fam nftFamily, a Action) (string, error) {
	d := actionKindDescs[a.Kind]
	if d == nil {
		return "", fmt.Errorf("unknown action kind %d", a.Kind)
	}
	return d.text(f, fam, a)
}

// quote makes s an nft string literal. nft strings cannot escape a double quote, and comments are
// limited to 128 bytes by the kernel.
func quote(s string) string {
	return `"` + commentText(s) + `"`
}
