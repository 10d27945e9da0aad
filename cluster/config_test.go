package cluster

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
)

const goodNodeConfig = `apiVersion: vipgate.io/v1alpha1
kind: NodeConfig
nodeName: node-a
nodeIPs: [192.0.2.11, "2001:db8::11"]
clusterCIDRs: [10.244.0.0/16]
serviceCIDRs: [10.96.0.0/16, "2001:db8:96::/108"]
nodeLabels:
  topology.kubernetes.io/zone: z1
`

func TestParseNodeConfigDefaults(t *testing.T) {
	got, err := ParseNodeConfig([]byte(goodNodeConfig))
	if err != nil {
		t.Fatalf("ParseNodeConfig: %v", err)
	}
	want := &NodeConfig{
		NodeName:             "node-a",
		NodeIPs:              addrs("192.0.2.11", "2001:db8::11"),
		ClusterCIDRs:         prefixes("10.244.0.0/16"),
		ServiceCIDRs:         prefixes("10.96.0.0/16", "2001:db8:96::/108"),
		NodePortAddresses:    prefixes("192.0.2.11/32", "2001:db8::11/128"),
		MasqueradeBit:        14,
		NodeZone:             "z1",
		NodeLabels:           map[string]string{"topology.kubernetes.io/zone": "z1"},
		HealthzBindAddress:   netip.MustParseAddrPort("127.0.0.1:10256"),
		MetricsBindAddress:   netip.MustParseAddrPort("127.0.0.1:10249"),
		HealthCheckAddresses: addrs("192.0.2.11", "2001:db8::11"),
		TableName:            "vipgate",
		Logging:              Logging{Level: hclog.Info},
	}
	if diff := cmp.Diff(want, got, cmpOpts); diff != "" {
		t.Errorf("ParseNodeConfig (-want +got):\n%s", diff)
	}
	if got.MasqueradeMark() != 0x4000 {
		t.Errorf("MasqueradeMark = %#x, want 0x4000", got.MasqueradeMark())
	}
	if a, ok := got.NodeIP(IPv6); !ok || a != netip.MustParseAddr("2001:db8::11") {
		t.Errorf("NodeIP(IPv6) = %v, %v", a, ok)
	}
}

func TestParseNodeConfigAllFields(t *testing.T) {
	in := goodNodeConfig + `nodePortAddresses: [192.0.2.0/24]
masqueradeAll: true
masqueradeBit: 3
nodeZone: z9
healthzBindAddress: "[2001:db8::11]:10256"
metricsBindAddress: 0.0.0.0:9100
healthCheckAddresses: [192.0.2.11]
tableName: vg_test-1
serviceProxyName: vipgate
logLevel: debug
logFormat: json
`
	got, err := ParseNodeConfig([]byte(in))
	if err != nil {
		t.Fatalf("ParseNodeConfig: %v", err)
	}
	if !got.MasqueradeAll || got.MasqueradeMark() != 8 || got.NodeZone != "z9" || got.TableName != "vg_test-1" || got.ServiceProxyName != "vipgate" ||
		got.Logging != (Logging{Level: hclog.Debug, JSON: true}) ||
		got.HealthzBindAddress != netip.MustParseAddrPort("[2001:db8::11]:10256") ||
		len(got.NodePortAddresses) != 1 || len(got.HealthCheckAddresses) != 1 {
		t.Errorf("fields not applied: %+v", got)
	}
}

func TestParseNodeConfigDefaultsNodeNameToHostname(t *testing.T) {
	old := hostname
	t.Cleanup(func() { hostname = old })
	hostname = func() (string, error) { return "Node-B", nil }
	got, err := ParseNodeConfig([]byte(strings.Replace(goodNodeConfig, "nodeName: node-a\n", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got.NodeName != "node-b" {
		t.Errorf("NodeName = %q, want node-b", got.NodeName)
	}
}

func TestParseNodeConfigErrors(t *testing.T) {
	base := `apiVersion: vipgate.io/v1alpha1
kind: NodeConfig
nodeName: node-a
`
	tests := []struct {
		name string
		body string // appended to base, unless it starts with "apiVersion"
		want string // substring of the error
	}{
		{"unknown field", "nodeIPs: [192.0.2.11]\nnodeIp: 192.0.2.11\n", "nodeIp"},
		{"duplicate field", "nodeIPs: [192.0.2.11]\nnodeIPs: [192.0.2.12]\n", "nodeIPs"},
		{"wrong apiVersion", "apiVersion: v1\nkind: NodeConfig\n", "apiVersion"},
		{"wrong kind", "apiVersion: vipgate.io/v1alpha1\nkind: KubeProxyConfiguration\n", "kind"},
		{"no node IPs", "clusterCIDRs: [10.244.0.0/16]\n", "nodeIPs"},
		{"bad node IP", "nodeIPs: [192.0.2.300]\n", "nodeIPs[0]"},
		{"two IPv4 node IPs", "nodeIPs: [192.0.2.11, 192.0.2.12]\n", "nodeIPs[1]"},
		{"loopback node IP", "nodeIPs: [127.0.0.1]\n", "nodeIPs[0]"},
		{"bad CIDR", "nodeIPs: [192.0.2.11]\nclusterCIDRs: [10.244.0.0/33]\n", "clusterCIDRs[0]"},
		{"CIDR with host bits", "nodeIPs: [192.0.2.11]\nserviceCIDRs: [10.96.0.1/16]\n", "serviceCIDRs[0]"},
		{"CIDR of a family without node IP", "nodeIPs: [192.0.2.11]\nclusterCIDRs: [\"2001:db8:244::/64\"]\n", "clusterCIDRs[0]"},
		{"bad nodePortAddresses", "nodeIPs: [192.0.2.11]\nnodePortAddresses: [192.0.2.11]\n", "nodePortAddresses[0]"},
		{"masqueradeBit out of range", "nodeIPs: [192.0.2.11]\nmasqueradeBit: 32\n", "masqueradeBit"},
		{"masqueradeBit not a number", "nodeIPs: [192.0.2.11]\nmasqueradeBit: high\n", "masqueradeBit"},
		{"bad bind address", "nodeIPs: [192.0.2.11]\nhealthzBindAddress: localhost:10256\n", "healthzBindAddress"},
		{"bind without port", "nodeIPs: [192.0.2.11]\nmetricsBindAddress: 127.0.0.1:0\n", "metricsBindAddress"},
		{"same bind addresses", "nodeIPs: [192.0.2.11]\nmetricsBindAddress: 127.0.0.1:10256\n", "metricsBindAddress"},
		{"bad table name", "nodeIPs: [192.0.2.11]\ntableName: \"vip gate\"\n", "tableName"},
		{"bad serviceProxyName", "nodeIPs: [192.0.2.11]\nserviceProxyName: \"not a label\"\n", "serviceProxyName"},
		{"bad log level", "nodeIPs: [192.0.2.11]\nlogLevel: loud\n", "logLevel"},
		{"bad log format", "nodeIPs: [192.0.2.11]\nlogFormat: xml\n", "logFormat"},
		{"bad node name", "apiVersion: vipgate.io/v1alpha1\nkind: NodeConfig\nnodeName: Node_A\nnodeIPs: [192.0.2.11]\n", "nodeName"},
		{"bad label", "nodeIPs: [192.0.2.11]\nnodeLabels: {\"a b\": c}\n", "nodeLabels"},
		{"malformed YAML", "nodeIPs: [192.0.2.11\n", "yaml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := base + tc.body
			if strings.HasPrefix(tc.body, "apiVersion") {
				in = tc.body
			}
			got, err := ParseNodeConfig([]byte(in))
			if err == nil {
				t.Fatalf("accepted: %+v", got)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

const goodGatewayConfig = `apiVersion: vipgate.io/v1alpha1
kind: GatewayConfig
gatewayIPs: [198.51.100.1]
clusterCIDRs: [10.244.0.0/16]
`

func TestParseGatewayConfig(t *testing.T) {
	got, err := ParseGatewayConfig([]byte(goodGatewayConfig))
	if err != nil {
		t.Fatalf("ParseGatewayConfig: %v", err)
	}
	want := &GatewayConfig{
		GatewayIPs:          addrs("198.51.100.1"),
		Forwarding:          ForwardNodePort,
		SNAT:                SNATAuto,
		HealthCheckInterval: 5 * time.Second,
		ClusterCIDRs:        prefixes("10.244.0.0/16"),
		TableName:           "vipgate",
		Logging:             Logging{Level: hclog.Info},
		NATFastPath:         NATFastPath{Enabled: DefaultNATFastPath}, // on with nodePort forwarding
	}
	// The name defaults to the host name, and it is a label.
	want.Name = got.Name
	want.Labels = map[string]string{"kubernetes.io/hostname": got.Name, GatewayRoleLabel: "gateway"}
	want.MetricsBindAddress = netip.MustParseAddrPort(DefaultMetricsBindAddress)
	if diff := cmp.Diff(want, got, cmpOpts); diff != "" {
		t.Errorf("ParseGatewayConfig (-want +got):\n%s", diff)
	}

	tests := []struct{ name, body, want string }{
		{"unknown field", "forward: direct\n", "forward"},
		{"bad forwarding", "forwarding: tunnel\n", "forwarding"},
		{"bad snat", "snat: sometimes\n", "snat"},
		{"bad interval", "healthCheckInterval: 5\n", "healthCheckInterval"},
		{"interval too short", "healthCheckInterval: 1ms\n", "healthCheckInterval"},
		{"wrong family", "serviceCIDRs: [\"2001:db8::/108\"]\n", "serviceCIDRs[0]"},
		{"bad gateway IP", "gatewayIPs: [nope]\n", "gatewayIPs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := goodGatewayConfig + tc.body
			if strings.HasPrefix(tc.body, "gatewayIPs") {
				in = strings.Replace(goodGatewayConfig, "gatewayIPs: [198.51.100.1]\n", tc.body, 1)
			}
			if _, err := ParseGatewayConfig([]byte(in)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func TestLoadConfigDispatchesOnKind(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if c, err := LoadConfig(write("node.yaml", goodNodeConfig)); err != nil {
		t.Errorf("node config: %v", err)
	} else if _, ok := c.(*NodeConfig); !ok {
		t.Errorf("node config: got %T", c)
	}
	if c, err := LoadConfig(write("gw.yaml", goodGatewayConfig)); err != nil {
		t.Errorf("gateway config: %v", err)
	} else if _, ok := c.(*GatewayConfig); !ok {
		t.Errorf("gateway config: got %T", c)
	}
	if _, err := LoadNodeConfig(write("gw2.yaml", goodGatewayConfig)); err == nil {
		t.Error("LoadNodeConfig accepted a GatewayConfig")
	}
	if c, err := LoadGatewayConfig(filepath.Join(dir, "gw.yaml")); err != nil || c.Forwarding != ForwardNodePort {
		t.Errorf("LoadGatewayConfig: %+v, %v", c, err)
	}
	var buf strings.Builder
	c, _ := ParseNodeConfig([]byte(goodNodeConfig + "logFormat: json\n"))
	c.Logging.NewLogger("vipgate", &buf).Info("hello", "node", c.NodeName)
	if !strings.Contains(buf.String(), `"node":"node-a"`) {
		t.Errorf("JSON logger wrote %q", buf.String())
	}
	if _, err := LoadConfig(write("empty.yaml", "")); err == nil {
		t.Error("LoadConfig accepted an empty file")
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("LoadConfig accepted a missing file")
	}
}

// TestExampleConfigs keeps the shipped examples loadable.
func TestExampleConfigs(t *testing.T) {
	for _, name := range []string{"nodeconfig.yaml", "gatewayconfig.yaml"} {
		p := filepath.Join("..", "deploy", "examples", name)
		if _, err := os.Stat(p); err != nil {
			t.Skipf("example %s: %v", name, err)
		}
		if _, err := LoadConfig(p); err != nil {
			t.Errorf("example %s: %v", name, err)
		}
	}
}

func TestConfigExpandsEnvironment(t *testing.T) {
	t.Setenv("VG_TEST_NODE", "node7")
	t.Setenv("VG_TEST_IP", "192.0.2.17")
	dir := t.TempDir()
	path := dir + "/node.yaml"
	body := "apiVersion: vipgate.io/v1alpha1\nkind: NodeConfig\nnodeName: ${VG_TEST_NODE}\nnodeIPs: [\"${VG_TEST_IP}\"]\n"
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadNodeConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeName != "node7" || len(c.NodeIPs) != 1 || c.NodeIPs[0].String() != "192.0.2.17" {
		t.Fatalf("got %q %v", c.NodeName, c.NodeIPs)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(body, "VG_TEST_NODE", "VG_TEST_UNSET_XYZ", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadNodeConfig(path); err == nil || !strings.Contains(err.Error(), "VG_TEST_UNSET_XYZ") {
		t.Fatalf("unset variable: %v", err)
	}
}
