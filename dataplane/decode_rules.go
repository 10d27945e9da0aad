package dataplane

import (
	"fmt"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipgate/vipgate/cluster"
)

// google/nftables v0.3.0 decodes a rule's expressions by name and silently skips the names it does
// not know — among them "dup", the gateway's routed forwarding. A rule read that way would be missing
// an expression, and the decoder could prove a wrong shape (a "lookup; drop" rule that lost its dup).
// So the rules are dumped once more here, raw, and each rule's expression list is checked against
// its names: every skipped "dup" is decoded and put back in place, and any other skipped name is an
// error naming the rule.

// goDecodedExprs are the expression names google/nftables v0.3.0 decodes (expr.exprFromName).
var goDecodedExprs = map[string]bool{
	"ct": true, "range": true, "meta": true, "cmp": true, "counter": true, "objref": true, "payload": true,
	"lookup": true, "immediate": true, "bitwise": true, "redir": true, "nat": true, "limit": true,
	"quota": true, "dynset": true, "log": true, "exthdr": true, "match": true, "target": true,
	"connlimit": true, "queue": true, "flow_offload": true, "reject": true, "masq": true, "hash": true,
	"cthelper": true, "synproxy": true, "ctexpect": true, "secmark": true, "cttimeout": true, "fib": true,
	"numgen": true, "notrack": true,
}

// rawExpr is one expression of a rule as the kernel lists it: its name and its attributes.
type rawExpr struct {
	name string
	data []byte
}

// dumpRuleExprs lists the raw expressions of every rule of table, by chain and rule handle.
func dumpRuleExprs(c *netlink.Conn, f cluster.Family, table string) (map[string]map[uint64][]rawExpr, error) {
	msg, err := nfMsg(f, unix.NFT_MSG_GETRULE, []netlink.Attribute{{Type: unix.NFTA_RULE_TABLE, Data: []byte(table + "\x00")}})
	if err != nil {
		return nil, err
	}
	out := map[string]map[uint64][]rawExpr{}
	err = dumpEach(c, msg, func(ad *netlink.AttributeDecoder) error {
		var chain string
		var handle uint64
		var exprs []rawExpr
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_RULE_CHAIN:
				chain = ad.String()
			case unix.NFTA_RULE_HANDLE:
				handle = ad.Uint64()
			case unix.NFTA_RULE_EXPRESSIONS:
				ad.Nested(func(list *netlink.AttributeDecoder) error {
					for list.Next() {
						list.Nested(func(el *netlink.AttributeDecoder) error {
							var x rawExpr
							for el.Next() {
								switch el.Type() {
								case unix.NFTA_EXPR_NAME:
									x.name = el.String()
								case unix.NFTA_EXPR_DATA:
									x.data = el.Bytes()
								}
							}
							exprs = append(exprs, x)
							return el.Err()
						})
					}
					return list.Err()
				})
			}
		}
		if err := ad.Err(); err != nil {
			return fmt.Errorf("decoding rule: %w", err)
		}
		if out[chain] == nil {
			out[chain] = map[uint64][]rawExpr{}
		}
		out[chain][handle] = exprs
		return nil
	})
	return out, err
}

// completeRuleExprs puts back the expressions google/nftables skipped in the rules of kt (see above).
func completeRuleExprs(kt *KernelTable, raw map[string]map[uint64][]rawExpr) error {
	fam := byte(tableFamily(kt.Family))
	for chain, rules := range kt.Rules {
		for _, r := range rules {
			names, ok := raw[chain][r.Handle]
			if !ok {
				return fmt.Errorf("chain %s rule (handle %d): not in the raw rule dump", chain, r.Handle)
			}
			var full []expr.Any
			j := 0
			for _, x := range names {
				switch {
				case goDecodedExprs[x.name]:
					if j >= len(r.Exprs) {
						return fmt.Errorf("chain %s rule (handle %d): expression %q missing from the decoded rule", chain, r.Handle, x.name)
					}
					full = append(full, r.Exprs[j])
					j++
				case x.name == "dup":
					d := &expr.Dup{}
					if err := expr.Unmarshal(fam, x.data, d); err != nil {
						return fmt.Errorf("chain %s rule (handle %d): decoding dup: %w", chain, r.Handle, err)
					}
					full = append(full, d)
				case x.name == "fwd" && isNetdev(kt.Family):
					d, err := decodeFwd(x.data)
					if err != nil {
						return fmt.Errorf("chain %s rule (handle %d): decoding fwd: %w", chain, r.Handle, err)
					}
					full = append(full, d)
				default:
					return fmt.Errorf("chain %s rule (handle %d): expression %q is not one vipgate uses", chain, r.Handle, x.name)
				}
			}
			if j != len(r.Exprs) {
				return fmt.Errorf("chain %s rule (handle %d): %d expressions decoded, %d listed", chain, r.Handle, len(r.Exprs), j)
			}
			r.Exprs = full
		}
	}
	return nil
}
