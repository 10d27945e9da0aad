package cluster

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// ctsyncGateway is gw1 of a pair with SNAT addresses and conntrack sync.
const ctsyncGateway = `apiVersion: vipgate.io/v1alpha1
kind: GatewayConfig
name: gw1
gatewayIPs: [192.0.2.11]
speaker:
  members:
  - {name: gw1, address: 192.0.2.11}
  - {name: gw2, address: 192.0.2.12}
snatAddresses:
- {gateway: gw1, addresses: [192.0.2.240]}
- {gateway: gw2, addresses: [192.0.2.241]}
conntrackSync:
  peer: 192.0.2.12
  interface: eth1
  stateDir: /var/lib/vipgate/ctsync
  keyFile: /etc/vipgate/ctsync/key
`

func TestParseGatewayConntrackSync(t *testing.T) {
	c, err := ParseGatewayConfig([]byte(ctsyncGateway))
	if err != nil {
		t.Fatal(err)
	}
	want := ConntrackSync{Enabled: true, Interface: "eth1", Peer: netip.MustParseAddr("192.0.2.12"), Port: DefaultConntrackSyncPort, StateDir: "/var/lib/vipgate/ctsync",
		KeyFile: "/etc/vipgate/ctsync/key"}
	if diff := cmp.Diff(want, c.ConntrackSync, cmpOpts); diff != "" {
		t.Errorf("conntrackSync (-want +got)\n%s", diff)
	}
	if diff := cmp.Diff([]netip.Addr{netip.MustParseAddr("192.0.2.241")}, c.SNATAddressesOf("gw2"), cmpOpts); diff != "" {
		t.Errorf("gw2's SNAT addresses (-want +got)\n%s", diff)
	}
	off, err := ParseGatewayConfig([]byte(strings.Replace(ctsyncGateway, "  peer: 192.0.2.12\n", "  enabled: false\n", 1)))
	if err != nil || off.ConntrackSync.Enabled {
		t.Errorf("enabled: false: %v, %+v", err, off)
	}
}

func TestGatewayConntrackSyncErrors(t *testing.T) {
	for _, tc := range []struct{ old, new, want string }{
		{"  peer: 192.0.2.12\n", "", "conntrackSync.peer: required"},
		{"peer: 192.0.2.12", "peer: 192.0.2.11", "this gateway's own gatewayIP"},
		{"peer: 192.0.2.12", "peer: nope", "conntrackSync.peer"},
		{"peer: 192.0.2.12", "peer: 2001:db8::12", "no gatewayIP of the family"},
		{"interface: eth1", "interface: 'eth1 {'", "conntrackSync.interface"},
		{"interface: eth1", "port: 70000", "conntrackSync.port"},
		{"stateDir: /var/lib/vipgate/ctsync", "stateDir: relative", "conntrackSync.stateDir"},
		{"stateDir: /var/lib/vipgate/ctsync", "stateDir: /var/../etc", "conntrackSync.stateDir"},
		{"keyFile: /etc/vipgate/ctsync/key", "keyFile: key", "conntrackSync.keyFile"},
		{"gateway: gw2, addresses: [192.0.2.241]", "gateway: gw3, addresses: [192.0.2.241]", `"gw3" is neither this gateway`},
		{"gateway: gw2, addresses: [192.0.2.241]", "gateway: gw1, addresses: [192.0.2.241]", "listed twice"},
		{"addresses: [192.0.2.241]", "addresses: [192.0.2.240]", "each gateway needs its own SNAT address"},
		{"addresses: [192.0.2.241]", "addresses: [192.0.2.12]", "member address"},
		{"addresses: [192.0.2.240]", "addresses: [192.0.2.11]", "own gatewayIP"},
		{"addresses: [192.0.2.241]", "addresses: []", "needs at least one address"},
		{"addresses: [192.0.2.241]", "addresses: [192.0.2.241, 192.0.2.242]", "snatAddresses[1].addresses"},
		{"- {gateway: gw1, addresses: [192.0.2.240]}\n", "", "no entry for this gateway"},
		{"snatAddresses:\n- {gateway: gw1, addresses: [192.0.2.240]}\n- {gateway: gw2, addresses: [192.0.2.241]}\n", "", "conntrackSync: needs snatAddresses"},
		{"conntrackSync:", "conntrackSync:\n  bogus: 1", "bogus"},
	} {
		doc := strings.Replace(ctsyncGateway, tc.old, tc.new, 1)
		if doc == ctsyncGateway {
			t.Fatalf("case %q did not change the document", tc.old)
		}
		_, err := ParseGatewayConfig([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q -> %q: err = %v, want %q", tc.old, tc.new, err, tc.want)
		}
	}
	// Route forwarding needs no SNAT addresses (no NAT at the gateway).
	route := strings.Replace(ctsyncGateway, "snatAddresses:\n- {gateway: gw1, addresses: [192.0.2.240]}\n- {gateway: gw2, addresses: [192.0.2.241]}\n", "forwarding: route\n", 1)
	if _, err := ParseGatewayConfig([]byte(route)); err != nil {
		t.Errorf("route forwarding with conntrackSync: %v", err)
	}
}
