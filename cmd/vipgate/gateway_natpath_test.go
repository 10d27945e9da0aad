package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/dataplane/maglev"
)

// gatewayHashSeed: derived from the first key of hashKeyFile, else of the membership key file
// (the flag over the config); the public default with a warning without a key; an error when a
// named file cannot be read (the other gateways would hash with another seed).
func TestGatewayHashSeed(t *testing.T) {
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
		flags       speakerFlags
		want        uint32
		warnContain string
		wantErr     bool
	}{
		{name: "hashKeyFile", cfg: cluster.GatewayConfig{HashKeyFile: hashFile, Speaker: cluster.SpeakerConfig{MemberKeyFile: memberFile}},
			want: maglev.DeriveHashSeed([]byte(hashKey))},
		{name: "the membership's key", cfg: cluster.GatewayConfig{Speaker: cluster.SpeakerConfig{MemberKeyFile: memberFile}},
			want: maglev.DeriveHashSeed([]byte(memberKey))},
		{name: "--member-key-file", flags: speakerFlags{MemberKeyFile: memberFile}, want: maglev.DeriveHashSeed([]byte(memberKey))},
		{name: "no key", want: maglev.DefaultHashSeed, warnContain: "public default"},
		{name: "a missing file", cfg: cluster.GatewayConfig{HashKeyFile: filepath.Join(dir, "nope")}, wantErr: true},
	} {
		seed, warn, err := gatewayHashSeed(&c.cfg, c.flags)
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
