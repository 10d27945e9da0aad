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
