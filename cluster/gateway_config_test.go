package cluster

import (
	"strings"
	"testing"
	"time"
)

func TestGatewayConfigNodesAndMaglevSize(t *testing.T) {
	base := "apiVersion: vipgate.io/v1alpha1\nkind: GatewayConfig\ngatewayIPs: [192.0.2.100]\n"
	c, err := ParseGatewayConfig([]byte(base + "maglevTableSize: 4093\nnodes:\n- {name: node1, addresses: [192.0.2.11, \"2001:db8:1::11\"]}\n- {name: node2, addresses: [192.0.2.12]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Nodes) != 2 || c.Nodes[0].Name != "node1" || len(c.Nodes[0].Addresses) != 2 || c.MaglevTableSize != 4093 {
		t.Errorf("parsed %+v", c)
	}
	for _, bad := range []struct{ yaml, want string }{
		{"nodes:\n- {name: node1, addresses: [192.0.2.11]}\n- {name: node1, addresses: [192.0.2.12]}\n", "listed twice"},
		{"nodes:\n- {name: node1}\n", "at least one address"},
		{"nodes:\n- {name: Node_1, addresses: [192.0.2.11]}\n", "not a valid node name"},
		{"nodes:\n- {name: node1, addresses: [192.0.2.11, 192.0.2.12]}\n", "nodes[0].addresses"},
		{"nodes:\n- {name: node1, address: [192.0.2.11]}\n", "address"},
		{"maglevTableSize: 1000\n", "not a prime"},
		{"maglevTableSize: 101\n", "not a prime between"},
	} {
		_, err := ParseGatewayConfig([]byte(base + bad.yaml))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: error %v, want one containing %q", bad.yaml, err, bad.want)
		}
	}
}

func TestGatewayConfigSpeaker(t *testing.T) {
	base := "apiVersion: vipgate.io/v1alpha1\nkind: GatewayConfig\ngatewayIPs: [192.0.2.100]\n"
	c, err := ParseGatewayConfig([]byte(base + "name: gw1\nlabels: {rack: r1}\nspeaker:\n  members:\n  - {name: gw1, address: 192.0.2.100}\n  - {name: gw2, address: 192.0.2.101}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "gw1" || len(c.Speaker.Members) != 2 || c.Labels["rack"] != "r1" ||
		c.Labels["kubernetes.io/hostname"] != "gw1" || c.Labels[GatewayRoleLabel] != "gateway" {
		t.Errorf("parsed %+v", c)
	}
	if c, err := ParseGatewayConfig([]byte(base + "forwarding: route\n")); err != nil || c.Forwarding != ForwardRoute {
		t.Errorf("forwarding: route: %v %+v", err, c)
	}
	c, err = ParseGatewayConfig([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if c.Name == "" || c.Labels["kubernetes.io/hostname"] != c.Name {
		t.Errorf("default name %q, labels %v: want the host name", c.Name, c.Labels)
	}
	for _, bad := range []struct{ yaml, want string }{
		{"name: GW_1\n", "name: \"GW_1\""},
		{"name: gw1\nspeaker:\n  members:\n  - {name: gw2, address: 192.0.2.101}\n", "not listed"},
		{"name: gw1\nlabels: {\"bad key!\": x}\n", "labels: key"},
		{"name: gw1\nlabels: {rack: \"not a value!\"}\n", "labels: value"},
		{"name: gw1\nspeaker: {heartbeatInterval: 1ms}\n", "heartbeatInterval"},
		{"name: gw1\nforwarding: route\nsnat: always\n", "snat: always cannot be done with forwarding: route"},
	} {
		_, err := ParseGatewayConfig([]byte(base + bad.yaml))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: error %v, want one containing %q", bad.yaml, err, bad.want)
		}
	}
}

func TestGatewayConfigTimeouts(t *testing.T) {
	base := "apiVersion: vipgate.io/v1alpha1\nkind: GatewayConfig\ngatewayIPs: [192.0.2.100]\n"
	c, err := ParseGatewayConfig([]byte(base + "flowTimeout: 2h\ndrainTimeout: 1s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.FlowTimeout != 2*time.Hour || c.DrainTimeout != time.Second {
		t.Errorf("flowTimeout %s drainTimeout %s", c.FlowTimeout, c.DrainTimeout)
	}
	if c, err := ParseGatewayConfig([]byte(base)); err != nil || c.FlowTimeout != 0 || c.DrainTimeout != 0 {
		t.Errorf("defaults: %v, flowTimeout %s drainTimeout %s (0: the dataplane's defaults)", err, c.FlowTimeout, c.DrainTimeout)
	}
	for _, bad := range []struct{ yaml, want string }{
		{"drainTimeout: 500ms\n", "drainTimeout: 500ms is out of range 1s-24h"},
		{"drainTimeout: 25h\n", "out of range"},
		{"drainTimeout: 0s\n", "0 is not allowed"},
		{"flowTimeout: 500ms\n", "flowTimeout: 500ms is out of range 1s-24h"},
		{"flowTimeout: 25h\n", "flowTimeout"},
		{"flowTimeout: -1m\n", "flowTimeout"},
		{"flowTimeout: 0s\n", "0 is not allowed"},
		{"flowTimeout: soon\n", "not a duration"},
	} {
		_, err := ParseGatewayConfig([]byte(base + bad.yaml))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: error %v, want one containing %q", bad.yaml, err, bad.want)
		}
	}
}
