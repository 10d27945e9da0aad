package cluster

import (
	"slices"
	"strings"
	"testing"
)

// TestGatewayConfigRouteFastPath: routeFastPath is on by default with forwarding: route and off
// with the other modes; `enabled: false` turns it off, devices name the ingress interfaces; with
// another forwarding mode, turning it on or naming devices is an error (it would do nothing), and a
// device that cannot be an interface name is refused.
func TestGatewayConfigRouteFastPath(t *testing.T) {
	base := "apiVersion: vipgate.io/v1alpha1\nkind: GatewayConfig\ngatewayIPs: [192.0.2.100]\n"
	for _, c := range []struct {
		name, yaml string
		on         bool
		devices    []string
	}{
		{"route, default", "forwarding: route\n", DefaultRouteFastPath, nil},
		{"nodePort, default", "forwarding: nodePort\n", false, nil},
		{"no forwarding (nodePort), default", "", false, nil},
		{"direct, default", "forwarding: direct\nclusterCIDRs: [10.244.0.0/16]\n", false, nil},
		{"route, devices", "forwarding: route\nrouteFastPath: {devices: [eth0, bond0.100, fifteen-bytes-1]}\n", true, []string{"eth0", "bond0.100", "fifteen-bytes-1"}},
		{"route, enabled", "forwarding: route\nrouteFastPath: {enabled: true}\n", true, nil},
		{"route, empty section", "forwarding: route\nrouteFastPath: {}\n", DefaultRouteFastPath, nil},
		{"route, disabled", "forwarding: route\nrouteFastPath: {enabled: false}\n", false, nil},
		{"route, disabled with devices", "forwarding: route\nrouteFastPath: {enabled: false, devices: [eth0]}\n", false, []string{"eth0"}},
		// Turning it off where it is off anyway is harmless.
		{"nodePort, disabled", "forwarding: nodePort\nrouteFastPath: {enabled: false}\n", false, nil},
	} {
		cfg, err := ParseGatewayConfig([]byte(base + c.yaml))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if cfg.RouteFastPath != c.on || !slices.Equal(cfg.RouteFastPathDevices, c.devices) {
			t.Errorf("%s: fast path %v devices %q, want %v %q", c.name, cfg.RouteFastPath, cfg.RouteFastPathDevices, c.on, c.devices)
		}
	}
	for _, bad := range []struct{ yaml, want string }{
		{"forwarding: nodePort\nrouteFastPath: {enabled: true}\n", "routeFastPath: only with forwarding: route"},
		{"routeFastPath: {enabled: true}\n", "routeFastPath: only with forwarding: route"},
		{"forwarding: direct\nclusterCIDRs: [10.244.0.0/16]\nrouteFastPath: {devices: [eth0]}\n", "routeFastPath: only with forwarding: route"},
		{"forwarding: nodePort\nrouteFastPath: {enabled: false, devices: [eth0]}\n", "routeFastPath: only with forwarding: route"},
		{"forwarding: route\nrouteFastPath: {devices: [\"\"]}\n", `routeFastPath.devices: "" is not an interface name`},
		{"forwarding: route\nrouteFastPath: {devices: [a-name-far-too-long]}\n", "is not an interface name"},
		{"forwarding: route\nrouteFastPath: {devices: [\"eth0 eth1\"]}\n", "is not an interface name"},
		{"forwarding: route\nrouteFastPath: {devices: [net/eth0]}\n", "is not an interface name"},
		{"forwarding: route\nrouteFastPath: {devices: [\"eth0:1\"]}\n", `"eth0:1" is not an interface name: ':' is not allowed`},
		{"forwarding: route\nrouteFastPath: {devices: [\".\"]}\n", "a path component"},
		{"forwarding: route\nrouteFastPath: {devices: [\"..\"]}\n", "a path component"},
		{"forwarding: route\nrouteFastPath: {devices: [\"eth\\t0\"]}\n", "white space"},
		{"forwarding: route\nrouteFastPath: {devices: [sixteen-bytes-12]}\n", "16 bytes, longer than 15"},
		{"forwarding: route\nrouteFastPath: {enable: true}\n", "enable"},
		{"forwarding: route\nrouteFastPath: {enabled: yes-please}\n", "enabled"},
	} {
		_, err := ParseGatewayConfig([]byte(base + bad.yaml))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: error %v, want one containing %q", bad.yaml, err, bad.want)
		}
	}
}

// TestGatewayConfigNATFastPath: natFastPath is on by default with forwarding direct and nodePort
// (the default mode) and off with route; its fields are checked; with route, turning it on or
// setting anything but enabled: false is an error.
func TestGatewayConfigNATFastPath(t *testing.T) {
	base := "apiVersion: vipgate.io/v1alpha1\nkind: GatewayConfig\ngatewayIPs: [192.0.2.100]\n"
	direct := "forwarding: direct\nclusterCIDRs: [10.244.0.0/16]\n"
	for _, c := range []struct {
		name, yaml string
		want       NATFastPath
	}{
		{"nodePort, default", "forwarding: nodePort\n", NATFastPath{Enabled: DefaultNATFastPath}},
		{"no forwarding (nodePort), default", "", NATFastPath{Enabled: DefaultNATFastPath}},
		{"direct, default", direct, NATFastPath{Enabled: DefaultNATFastPath}},
		{"route, default", "forwarding: route\n", NATFastPath{}},
		{"route, disabled", "forwarding: route\nnatFastPath: {enabled: false}\n", NATFastPath{}},
		{"direct, disabled", direct + "natFastPath: {enabled: false}\n", NATFastPath{}},
		{"nodePort, all of it", "natFastPath: {devices: [eth0, bond0.7], flowTableSize: 1048576, snatPorts: \"40000-49999\", attach: xdp}\n",
			NATFastPath{Enabled: true, Devices: []string{"eth0", "bond0.7"}, FlowTableSize: 1 << 20, SNATPortMin: 40000, SNATPortMax: 49999, Attach: "xdp"}},
	} {
		cfg, err := ParseGatewayConfig([]byte(base + c.yaml))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		got := cfg.NATFastPath
		if got.Enabled != c.want.Enabled || !slices.Equal(got.Devices, c.want.Devices) || got.FlowTableSize != c.want.FlowTableSize ||
			got.SNATPortMin != c.want.SNATPortMin || got.SNATPortMax != c.want.SNATPortMax || got.Attach != c.want.Attach {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	for _, bad := range []struct{ yaml, want string }{
		{"forwarding: route\nnatFastPath: {enabled: true}\n", "natFastPath: only with forwarding: nodePort or direct"},
		{"forwarding: route\nnatFastPath: {devices: [eth0]}\n", "natFastPath: only with forwarding"},
		{"natFastPath: {devices: [\"eth0:1\"]}\n", `natFastPath.devices: "eth0:1" is not an interface name`},
		{"natFastPath: {flowTableSize: 100}\n", "natFastPath.flowTableSize: 100: must be 1024 to"},
		{"natFastPath: {flowTableSize: 1000000000}\n", "natFastPath.flowTableSize"},
		{"natFastPath: {snatPorts: \"61000\"}\n", `natFastPath.snatPorts: "61000" is not a port range`},
		{"natFastPath: {snatPorts: \"0-1023\"}\n", "is not a port range"},
		{"natFastPath: {snatPorts: \"65000-61000\"}\n", "is not a port range"},
		{"natFastPath: {snatPorts: \"61000-70000\"}\n", "is not a port range"},
		{"natFastPath: {snatPorts: \"61000-61100\"}\n", "at least 1024 ports"},
		{"natFastPath: {snatPorts: \"1500-65000\"}\n", "leave 1,024 ports above 1023 on one side"},
		{"natFastPath: {enable: true}\n", "enable"},
		{"natFastPath: {attach: xdpgeneric}\n", `natFastPath.attach: "xdpgeneric": auto, xdp or tc`},
	} {
		_, err := ParseGatewayConfig([]byte(base + bad.yaml))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: error %v, want one containing %q", bad.yaml, err, bad.want)
		}
	}
}
