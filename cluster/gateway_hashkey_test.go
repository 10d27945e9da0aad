package cluster

import "testing"

// hashKeyFile: the key file the flow hash's seed is derived from (cmd/vipgate reads it).
func TestGatewayConfigHashKeyFile(t *testing.T) {
	base := "apiVersion: vipgate.io/v1alpha1\nkind: GatewayConfig\ngatewayIPs: [192.0.2.100]\n"
	c, err := ParseGatewayConfig([]byte(base + "hashKeyFile: /etc/vipgate/hash.key\n"))
	if err != nil || c.HashKeyFile != "/etc/vipgate/hash.key" {
		t.Fatalf("hashKeyFile: %q, %v", c.HashKeyFile, err)
	}
	if c, err := ParseGatewayConfig([]byte(base)); err != nil || c.HashKeyFile != "" {
		t.Fatalf("no hashKeyFile: %q, %v", c.HashKeyFile, err)
	}
}
