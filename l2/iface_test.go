package l2

import (
	"net/netip"
	"testing"
)

func TestInterfaceFor(t *testing.T) {
	prefixes := []ifacePrefix{
		{"lo", netip.MustParsePrefix("127.0.0.1/8")},
		{"br0", netip.MustParsePrefix("192.0.2.254/16")},
		{"eth0", netip.MustParsePrefix("192.0.2.10/24")},
		{"eth1", netip.MustParsePrefix("198.51.100.7/24")},
		{"eth0", netip.MustParsePrefix("2001:db8:1::10/64")},
	}
	for _, c := range []struct {
		ip     string
		want   string
		wantOK bool
	}{
		{"192.0.2.10", "eth0", true},     // exact address
		{"192.0.2.254", "br0", true},     // exact address beats a longer prefix
		{"192.0.2.99", "eth0", true},     // longest prefix
		{"192.0.9.1", "br0", true},       // only the /16 contains it
		{"198.51.100.200", "eth1", true}, //
		{"2001:db8:1::99", "eth0", true},
		{"::ffff:198.51.100.7", "eth1", true}, // 4-in-6 form
		{"203.0.113.1", "", false},
		{"2001:db8:2::1", "", false},
	} {
		got, ok := interfaceFor(prefixes, netip.MustParseAddr(c.ip))
		if got != c.want || ok != c.wantOK {
			t.Errorf("interfaceFor(%s) = %q, %v; want %q, %v", c.ip, got, ok, c.want, c.wantOK)
		}
	}
}

func TestDefaultInterfaceLoopback(t *testing.T) {
	// Every network namespace has lo with 127.0.0.1, so this needs no setup.
	name, err := DefaultInterface(netip.MustParseAddr("127.0.0.1"))
	if err != nil {
		t.Skipf("no loopback address here: %v", err)
	}
	if name != "lo" {
		t.Errorf("DefaultInterface(127.0.0.1) = %q, want lo", name)
	}
	if _, err := DefaultInterface(netip.MustParseAddr("203.0.113.254")); err == nil {
		t.Error("DefaultInterface found an interface for an address no interface has")
	}
}
