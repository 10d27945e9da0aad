package symreturn

import (
	"fmt"
	"strings"
)

// ctDirReply is IP_CT_DIR_REPLY, what `ct direction reply` compares with.
const ctDirReply = 1

// Hooks of the table: prerouting marks new connections and restores the mark of forwarded
// replies before their routing decision; output (a route chain, which routes a packet again when
// its mark changed) restores it on what the host answers itself.
const (
	chainPrerouting = "prerouting"
	chainOutput     = "output"
)

// nftRule is one rule of the table, as data: the renderer (nft text) and the encoder (netlink
// expressions, kernel.go) read the same value.
type nftRule struct {
	chain string
	// iifname set: `iifname IIF ct state new ct mark set ct mark & ~Mask | Mark` (remember where a
	// new connection came in; only new ones: a packet spoofed into the interface cannot take an
	// existing connection's replies there). Empty: `ct direction reply ct mark & Mask == Mark meta
	// mark set meta mark & ~Mask | Mark` (route its replies by that interface's table).
	iifname string
	mark    uint32
	mask    uint32
	comment string
}

// nftRules are the plan's rules, prerouting's then output's.
func (p Plan) nftRules() []nftRule {
	var out []nftRule
	for _, ifc := range p.Interfaces {
		out = append(out, nftRule{chain: chainPrerouting, iifname: ifc.Name, mark: ifc.Mark, mask: p.Mask, comment: "new connection from " + ifc.Name})
	}
	for _, chain := range []string{chainPrerouting, chainOutput} {
		for _, ifc := range p.Interfaces {
			out = append(out, nftRule{chain: chain, mark: ifc.Mark, mask: p.Mask, comment: "reply to " + ifc.Name})
		}
	}
	return out
}

func (r nftRule) text() string {
	// nft's own form of `& ^mask | mark`: it lists the and-mask with the set bits in (the same
	// operation, as the or sets them anyway), so the text equals `nft list table`'s.
	keep := ^r.mask | r.mark
	if r.iifname != "" {
		return fmt.Sprintf("iifname %q ct state new ct mark set ct mark & 0x%08x | 0x%08x comment %q", r.iifname, keep, r.mark, r.comment)
	}
	return fmt.Sprintf("ct direction reply ct mark & 0x%08x == 0x%08x meta mark set meta mark & 0x%08x | 0x%08x comment %q", r.mask, r.mark, keep, r.mark, r.comment)
}

// Render is the plan's table as `nft -f` text, as `nft list table` prints it (empty for a plan
// that opts nothing in).
func (p Plan) Render() string {
	if !p.Enabled() {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", p.Table)
	for i, ch := range []struct{ name, typ string }{{chainPrerouting, "filter"}, {chainOutput, "route"}} {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "\tchain %s {\n\t\ttype %s hook %s priority mangle; policy accept;\n", ch.name, ch.typ, ch.name)
		for _, r := range p.nftRules() {
			if r.chain == ch.name {
				fmt.Fprintf(&b, "\t\t%s\n", r.text())
			}
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}
