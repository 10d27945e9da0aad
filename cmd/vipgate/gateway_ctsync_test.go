package main

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/cluster"
)

// TestConntrackSyncKey: the sync relay's key file is conntrackSync.keyFile, else the
// membership's (flag over config); without one conntrack sync refuses to start (fail closed), the
// membership's insecure mode included, and a broken key file is an error too.
func TestConntrackSyncKey(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cs    string
		flags speakerFlags
		sc    cluster.SpeakerConfig
		want  string
	}{
		{name: "keyFile", cs: "/k/sync", flags: speakerFlags{MemberKeyFile: "/k/flag"}, sc: cluster.SpeakerConfig{MemberKeyFile: "/k/member"}, want: "/k/sync"},
		{name: "flag", flags: speakerFlags{MemberKeyFile: "/k/flag"}, sc: cluster.SpeakerConfig{MemberKeyFile: "/k/member"}, want: "/k/flag"},
		{name: "membership", sc: cluster.SpeakerConfig{MemberKeyFile: "/k/member"}, want: "/k/member"},
		{name: "none"},
		{name: "insecure membership", flags: speakerFlags{MemberInsecure: true}, sc: cluster.SpeakerConfig{Insecure: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &cluster.GatewayConfig{Speaker: tc.sc, ConntrackSync: cluster.ConntrackSync{Enabled: true, KeyFile: tc.cs}}
			got, err := ctsyncKeyFile(cfg, tc.flags)
			if tc.want == "" {
				if !errors.Is(err, errNoSyncKey) {
					t.Fatalf("key file %q, err %v; want errNoSyncKey", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("key file %q, err %v; want %q", got, err, tc.want)
			}
		})
	}

	cfg := &cluster.GatewayConfig{GatewayIPs: []netip.Addr{netip.MustParseAddr("192.0.2.11")},
		ConntrackSync: cluster.ConntrackSync{Enabled: true, Peer: netip.MustParseAddr("192.0.2.12"), Port: 3780, Interface: "lo",
			StateDir: filepath.Join(t.TempDir(), "state")}}
	if _, _, err := startConntrackd(context.Background(), cfg, speakerFlags{}, hclog.NewNullLogger()); !errors.Is(err, errNoSyncKey) {
		t.Fatalf("startConntrackd without a key: %v, want errNoSyncKey", err)
	}
	if _, err := os.Stat(cfg.ConntrackSync.StateDir); err == nil {
		t.Errorf("startConntrackd without a key wrote conntrackd's state directory")
	}
	t.Log(errNoSyncKey)
	short := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(short, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.ConntrackSync.KeyFile = short
	if _, _, err := startConntrackd(context.Background(), cfg, speakerFlags{}, hclog.NewNullLogger()); err == nil || !strings.Contains(err.Error(), "conntrackSync") {
		t.Fatalf("startConntrackd with a 5-byte key: %v", err)
	}
}
