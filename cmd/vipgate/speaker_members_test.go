package main

import (
	"flag"
	"testing"
	"time"

	"github.com/vipgate/vipgate/cluster"
)

// TestSpeakerFlags: the speaker's flags parse into speakerFlags (no package globals), and the
// membership's key file and insecure mode resolve flag over config, insecure only without a key.
func TestSpeakerFlags(t *testing.T) {
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	var f speakerFlags
	f.addFlags(fs)
	if err := fs.Parse([]string{"--member-port=7999", "--member-insecure", "--bgp-shutdown-drain=30s"}); err != nil {
		t.Fatal(err)
	}
	if f.MemberPort != 7999 || !f.MemberInsecure || f.BGPDrain != 30*time.Second || f.MemberKeyFile != "" {
		t.Errorf("parsed %+v", f)
	}
	for _, c := range []struct {
		name         string
		f            speakerFlags
		sc           cluster.SpeakerConfig
		wantKey      string
		wantInsecure bool
	}{
		{name: "nothing", wantKey: "", wantInsecure: false},
		{name: "config key", sc: cluster.SpeakerConfig{MemberKeyFile: "/c"}, wantKey: "/c"},
		{name: "flag key over config", f: speakerFlags{MemberKeyFile: "/f"}, sc: cluster.SpeakerConfig{MemberKeyFile: "/c"}, wantKey: "/f"},
		{name: "insecure flag", f: speakerFlags{MemberInsecure: true}, wantInsecure: true},
		{name: "insecure config", sc: cluster.SpeakerConfig{Insecure: true}, wantInsecure: true},
		{name: "a key wins over insecure", f: speakerFlags{MemberInsecure: true}, sc: cluster.SpeakerConfig{MemberKeyFile: "/c"}, wantKey: "/c"},
	} {
		key, insecure := memberSettings(c.f, c.sc)
		if key != c.wantKey || insecure != c.wantInsecure {
			t.Errorf("%s: key %q insecure %v, want %q %v", c.name, key, insecure, c.wantKey, c.wantInsecure)
		}
	}
}
