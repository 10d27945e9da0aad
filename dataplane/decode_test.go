package dataplane

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"

	"github.com/vipgate/vipgate/cluster"
)

// TestRuleUserData: the comment record is the one nft writes and reads (libnftnl's udata, as
// google/nftables' userdata package spells it), and malformed userdata yields no comment.
func TestRuleUserData(t *testing.T) {
	ud := ruleUserData("hairpin")
	if want := userdata.AppendString(nil, userdata.TypeComment, "hairpin"); !bytes.Equal(ud, want) {
		t.Errorf("ruleUserData = %x, want %x", ud, want)
	}
	if c, ok := userDataComment(ud); !ok || c != "hairpin" {
		t.Errorf("userDataComment = %q, %v", c, ok)
	}
	if ud := ruleUserData(""); ud != nil {
		t.Errorf("no comment: %x", ud)
	}
	// An overlong comment is cut as render.go cuts it.
	long := strings.Repeat("é", 100)
	if c, ok := userDataComment(ruleUserData(long)); !ok || `"`+c+`"` != quote(long) {
		t.Errorf("overlong comment: %q, %v; want %s", c, ok, quote(long))
	}
	// Another record before the comment is skipped.
	other := append([]byte{7, 2, 'a', 'b'}, ud...)
	if c, ok := userDataComment(other); !ok || c != "hairpin" {
		t.Errorf("after another record: %q, %v", c, ok)
	}
	for _, bad := range [][]byte{nil, {0}, {0, 5, 'a'}, {7, 9, 1, 2}} {
		if c, ok := userDataComment(bad); ok {
			t.Errorf("userDataComment(%x) = %q", bad, c)
		}
	}
}

// TestDecodeRuleUnknownShape exercises the pure decoder without a kernel.
func TestDecodeRuleUnknownShape(t *testing.T) {
	kt := &KernelTable{Family: cluster.IPv4, Name: "vipgate",
		Chains: []*nftables.Chain{{Name: "services"}},
		Rules: map[string][]*nftables.Rule{"services": {{Handle: 7, Exprs: []expr.Any{
			&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept},
		}}}},
	}
	_, err := DecodeTable(kt, DecodeOptions{})
	if err == nil || !strings.Contains(err.Error(), "chain services rule 0 (handle 7)") {
		t.Fatalf("err = %v", err)
	}
}

func TestRangePrefix(t *testing.T) {
	for _, tc := range []struct{ start, end, want string }{
		{"10.244.0.0", "10.245.0.0", "10.244.0.0/16"},
		{"2001:db8:96::", "2001:db8:96::10:0", "2001:db8:96::/108"},
		{"10.0.0.1", "10.0.0.2", "10.0.0.1/32"},
		{"255.255.255.0", "", "255.255.255.0/24"},
		{"10.0.0.0", "10.0.0.3", ""},
	} {
		var end netip.Addr
		if tc.end != "" {
			end = netip.MustParseAddr(tc.end)
		}
		p, err := rangePrefix(netip.MustParseAddr(tc.start), end)
		got := ""
		if err == nil {
			got = p.String()
		}
		if got != tc.want {
			t.Errorf("rangePrefix(%s, %s) = %q (%v), want %q", tc.start, tc.end, got, err, tc.want)
		}
	}
}
