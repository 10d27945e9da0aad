package gateway

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/dataplane/maglev"
)

// testReadKeys reads a key file as the membership does, for these tests: one key a line, at least
// 16 bytes each (cmd/vipgate passes the membership's own reader).
func testReadKeys(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var keys [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		if len(l) < 16 {
			return nil, errors.New("a key shorter than 128 bits")
		}
		keys = append(keys, l)
	}
	return keys, nil
}

// TestSyncKeyFile: the sync relay's key file is conntrackSync.keyFile, else the membership's
// (cmd/vipgate resolves the flag over the config); without one conntrack sync refuses to start
// (fail closed), the membership's insecure mode included, and a broken key file is an error too.
func TestSyncKeyFile(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cs        string
		memberKey string
		want      string
	}{
		{name: "keyFile", cs: "/k/sync", memberKey: "/k/member", want: "/k/sync"},
		{name: "membership", memberKey: "/k/member", want: "/k/member"},
		{name: "none (the membership insecure, or without a key)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &cluster.GatewayConfig{ConntrackSync: cluster.ConntrackSync{Enabled: true, KeyFile: tc.cs}}
			got, err := SyncKeyFile(cfg, tc.memberKey)
			if tc.want == "" {
				if !errors.Is(err, ErrNoSyncKey) {
					t.Fatalf("key file %q, err %v; want ErrNoSyncKey", got, err)
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
	opts := RuntimeOptions{ReadKeys: testReadKeys, Registry: prometheus.NewRegistry()}
	if _, _, err := startConntrackd(context.Background(), cfg, opts, hclog.NewNullLogger()); !errors.Is(err, ErrNoSyncKey) {
		t.Fatalf("startConntrackd without a key: %v, want ErrNoSyncKey", err)
	}
	if _, err := os.Stat(cfg.ConntrackSync.StateDir); err == nil {
		t.Errorf("startConntrackd without a key wrote conntrackd's state directory")
	}
	t.Log(ErrNoSyncKey)
	short := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(short, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.ConntrackSync.KeyFile = short
	if _, _, err := startConntrackd(context.Background(), cfg, opts, hclog.NewNullLogger()); err == nil || !strings.Contains(err.Error(), "conntrackSync") {
		t.Fatalf("startConntrackd with a 5-byte key: %v", err)
	}
}

// TestHashSeed: derived from the first key of hashKeyFile, else of the membership key file (the
// flag's, which cmd/vipgate resolves, over the config's); the public default with a warning
// without a key; an error when a named file cannot be read (the other gateways would hash with
// another seed).
func TestHashSeed(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hashKey := "0123456789abcdef0123456789abcdef"
	memberKey := "fedcba9876543210fedcba9876543210"
	hashFile := write("hash", hashKey+"\n")
	memberFile := write("member", memberKey+"\nolderkey0123456789abcdef01234567\n")
	for _, c := range []struct {
		name        string
		cfg         cluster.GatewayConfig
		memberKey   string
		want        uint32
		warnContain string
		wantErr     bool
	}{
		{name: "hashKeyFile", cfg: cluster.GatewayConfig{HashKeyFile: hashFile, Speaker: cluster.SpeakerConfig{MemberKeyFile: memberFile}},
			want: maglev.DeriveHashSeed([]byte(hashKey))},
		{name: "the membership's key", cfg: cluster.GatewayConfig{Speaker: cluster.SpeakerConfig{MemberKeyFile: memberFile}},
			want: maglev.DeriveHashSeed([]byte(memberKey))},
		{name: "--member-key-file", memberKey: memberFile, want: maglev.DeriveHashSeed([]byte(memberKey))},
		{name: "--member-key-file over the config's", cfg: cluster.GatewayConfig{Speaker: cluster.SpeakerConfig{MemberKeyFile: hashFile}},
			memberKey: memberFile, want: maglev.DeriveHashSeed([]byte(memberKey))},
		{name: "no key", want: maglev.DefaultHashSeed, warnContain: "public default"},
		{name: "a missing file", cfg: cluster.GatewayConfig{HashKeyFile: filepath.Join(dir, "nope")}, wantErr: true},
	} {
		seed, warn, err := HashSeed(&c.cfg, c.memberKey, testReadKeys)
		if (err != nil) != c.wantErr {
			t.Errorf("%s: error %v, want one: %v", c.name, err, c.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		if seed != c.want || (c.warnContain == "") != (warn == "") || !strings.Contains(warn, c.warnContain) {
			t.Errorf("%s: seed %#x, warning %q; want %#x, a warning with %q", c.name, seed, warn, c.want, c.warnContain)
		}
	}
}

// TestFastPathStatusWarnings: /status lists a family without its route forwarding fast path among
// its warnings while the last sync says so, and no longer once a sync has it again; the family's
// vipgate_gateway_fast_path gauge says the same (0 before the first sync). A warning about a fast
// path that is on is listed too, and leaves the gauge at 1. The runtime's Warnings carry them
// with the fast path on only, before the NAT fast path's.
func TestFastPathStatusWarnings(t *testing.T) {
	r := &Runtime{dp: Config{FastPath: &FastPath{}}, nat: &natPathStatus{}}
	s := &r.fastPath
	g4, g6 := s.gauge(cluster.IPv4), s.gauge(cluster.IPv6)
	value := func(g prometheus.GaugeFunc) float64 {
		var m dto.Metric
		if err := g.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetGauge().GetValue()
	}
	gauges := func() [2]float64 { return [2]float64{value(g4), value(g6)} }
	if w := r.Warnings(); len(w) != 0 || gauges() != [2]float64{0, 0} {
		t.Errorf("before the first sync: warnings %q, gauges %v", w, gauges())
	}
	s.set([]string{"IPv4: programming netdev table vipgate-fwd4: no such device"}, nil)
	want := "route forwarding fast path off: IPv4: programming netdev table vipgate-fwd4: no such device"
	if w := r.Warnings(); !slices.Equal(w, []string{want}) || gauges() != [2]float64{0, 1} {
		t.Errorf("fast path off: warnings %q, want %q; gauges %v, want [0 1]", w, want, gauges())
	}
	s.set(nil, nil)
	if w := r.Warnings(); len(w) != 0 || gauges() != [2]float64{1, 1} {
		t.Errorf("fast path on again: warnings %q, gauges %v", w, gauges())
	}
	// A fast path that is on with a warning (a listed ingress device that does not exist): on
	// /status, and the gauge still 1.
	s.set(nil, []string{"IPv4: ingress devices that do not exist (no chain until they do): x0"})
	want = "route forwarding fast path: IPv4: ingress devices that do not exist (no chain until they do): x0"
	if w := r.Warnings(); !slices.Equal(w, []string{want}) || gauges() != [2]float64{1, 1} {
		t.Errorf("fast path on with a warning: warnings %q, want %q; gauges %v, want [1 1]", w, want, gauges())
	}
	// The NAT fast path's lines follow; without routeFastPath the route fast path's are not listed.
	r.nat.seed = "the public default"
	if w := r.Warnings(); !slices.Equal(w, []string{want, "flow hash seed: the public default"}) {
		t.Errorf("with the seed's warning: %q", w)
	}
	r.dp.FastPath = nil
	if w := r.Warnings(); !slices.Equal(w, []string{"flow hash seed: the public default"}) {
		t.Errorf("without routeFastPath: %q", w)
	}
}

// TestDataplaneReport: the admin endpoint's view of a gateway sync counts the families' tables,
// not the fast path's netdev tables (they hold the same sets).
func TestDataplaneReport(t *testing.T) {
	if (*SyncReport)(nil).DataplaneReport() != nil {
		t.Error("a nil report is not nil")
	}
	rep := &SyncReport{Full: true, Txs: []*dataplane.Tx{{Family: cluster.IPv4}, {Family: cluster.IPv6}, {Family: dataplane.NetdevFamily(cluster.IPv4)}}}
	got := rep.DataplaneReport()
	if !got.Full || len(got.Txs) != 2 || got.Txs[0].Family != cluster.IPv4 || got.Txs[1].Family != cluster.IPv6 {
		t.Errorf("report %+v", got)
	}
}
