package membership

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// seal builds a heartbeat datagram from hb for receiver to, signed with key.
func seal(t testing.TB, key []byte, to string, hb heartbeat) []byte {
	t.Helper()
	b, err := appendHeartbeat(nil, &hb)
	if err != nil {
		t.Fatal(err)
	}
	return mac(key, to, b, b)
}

func TestHeartbeatCodec(t *testing.T) {
	hb := heartbeat{name: "node-3", ready: true, counter: 42, echo: 7, digest: 99, heard: []byte{0b101, 1}}
	b := seal(t, testKeys[0], "n1", hb)
	var got heartbeat
	if r := parseHeartbeat(b, &got); r != acceptedReason {
		t.Fatalf("parse: %s", r)
	}
	if diff := cmp.Diff(hb, got, cmp.AllowUnexported(heartbeat{})); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if !verify(testKeys, "n1", b) || verify(testKeys, "n2", b) {
		t.Errorf("the MAC must verify for its receiver only")
	}
	for name, bad := range map[string][]byte{
		"empty": nil, "short": b[:20], "no mac": b[:len(b)-macSize], "other magic": append([]byte("VGH2"), b[4:]...),
		"old text format": []byte("vipgate-hb2 n1 1 -"), "oversize": make([]byte, MaxHeartbeat+1),
	} {
		if r := parseHeartbeat(bad, &got); r == acceptedReason {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestHeartbeatSizeBound(t *testing.T) {
	long := strings.Repeat("n", 253)
	if _, err := appendHeartbeat(nil, &heartbeat{name: long, heard: newBitmap(MaxMembers)}); err != nil {
		t.Errorf("%d members with a 253-byte name: %v", MaxMembers, err)
	}
	if _, err := appendHeartbeat(nil, &heartbeat{name: long, heard: newBitmap(MaxMembers + 8)}); !errors.Is(err, errOversize) {
		t.Errorf("%d members: %v, want errOversize", MaxMembers+8, err)
	}
	t.Logf("a heartbeat describes up to %d members (5,000 members: %d bytes with a 20-byte name)", MaxMembers, heartbeatFixed+20+(5000+7)/8)
}

func TestNoKeyRefused(t *testing.T) {
	if _, err := newMembers(hclog.NewNullLogger(), "n1", Options{}, nil); !errors.Is(err, ErrNoKey) {
		t.Errorf("no key: %v, want ErrNoKey", err)
	}
	if _, err := newMembers(hclog.NewNullLogger(), "n1", Options{Keys: [][]byte{[]byte("short")}}, nil); err == nil {
		t.Errorf("a 5-byte key was accepted")
	}
	m, err := newMembers(hclog.NewNullLogger(), "n1", Options{Insecure: true}, nil)
	if err != nil || !m.Insecure() {
		t.Errorf("insecure: %v %v", m, err)
	}
}

// authFixture is member n2 of {n1, n2, n3} driven by hand, without sockets or timers.
type authFixture struct {
	t   *testing.T
	m   *Members
	now time.Time
	// counters are the next counter of each (simulated) sender.
	counters map[string]uint64
}

var authAddrs = map[string][]netip.Addr{
	"n1": {netip.MustParseAddr("192.0.2.1")}, "n2": {netip.MustParseAddr("192.0.2.2")}, "n3": {netip.MustParseAddr("192.0.2.3")},
}

func newAuthFixture(t *testing.T, keys ...[]byte) *authFixture {
	m, err := newMembers(hclog.NewNullLogger(), "n2", Options{Keys: keys}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.SetPeers(authAddrs)
	m.SetWilling(true)
	return &authFixture{t: t, m: m, now: time.Now(), counters: map[string]uint64{"n1": 1e18, "n3": 1e18}}
}

// from builds the next genuine heartbeat of sender for n2 (echoing n2's boot counter).
func (f *authFixture) from(sender string, ready bool, key []byte) []byte {
	f.counters[sender]++
	return seal(f.t, key, "n2", heartbeat{name: sender, ready: ready, counter: f.counters[sender], echo: f.m.boot,
		digest: f.m.segs[0].key, heard: newBitmap(3)})
}

func (f *authFixture) deliver(b []byte, src string) dropReason {
	f.now = f.now.Add(10 * time.Millisecond)
	return f.m.handle(b, netip.MustParseAddr(src), f.now)
}

func TestHeartbeatAuthentication(t *testing.T) {
	key, other := testKeys[0], []byte("another key, not the members'!!!")
	f := newAuthFixture(t, key)
	genuine := f.from("n1", true, key)
	for _, tc := range []struct {
		name string
		b    []byte
		src  string
		want dropReason
	}{
		{"genuine", genuine, "192.0.2.1", acceptedReason},
		{"replayed", genuine, "192.0.2.1", dropReplay},
		{"forged with another key (keep a dead node alive)", f.from("n3", true, other), "192.0.2.3", dropBadMAC},
		{"forged not-ready", f.from("n1", false, other), "192.0.2.1", dropBadMAC},
		{"tampered ready flag", flip(f.from("n1", false, key), 4), "192.0.2.1", dropBadMAC},
		{"meant for n3", seal(t, key, "n3", heartbeat{name: "n1", counter: 2e18, echo: f.m.boot, heard: newBitmap(3)}), "192.0.2.1", dropBadMAC},
		{"from another address", f.from("n1", true, key), "192.0.2.3", dropWrongSrc},
		{"not a member", seal(t, key, "n2", heartbeat{name: "n9", counter: 1, heard: newBitmap(3)}), "192.0.2.9", dropNotMember},
		{"captured before n2 started (old echo)", seal(t, key, "n2", heartbeat{name: "n3", counter: 3e18, echo: f.m.boot - 1, heard: newBitmap(3)}), "192.0.2.3", dropUnfreshed},
		{"garbage", []byte("vipgate-hb2 n1 1 -"), "192.0.2.1", dropMalformed},
	} {
		if got := f.deliver(tc.b, tc.src); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	// Only n1's genuine heartbeat counted: n2 hears n1 and itself, n3 is silent.
	if v := f.m.View(); v.Heard != 2 || !v.Candidates["n1"] || v.Candidates["n3"] {
		t.Errorf("view after the attacks: %+v", v)
	}
	for r, want := range map[dropReason]float64{dropBadMAC: 4, dropReplay: 1, dropWrongSrc: 1, dropNotMember: 1, dropUnfreshed: 1, dropMalformed: 1} {
		if got := counterValue(f.m.rejected[r]); got != want {
			t.Errorf("rejected{reason=%s} = %v, want %v", r, got, want)
		}
	}
}

func flip(b []byte, i int) []byte { b[i] ^= 1; return b }

func TestHeartbeatKeyRotation(t *testing.T) {
	k1, k2 := testKeys[0], []byte("the second key, after rotation!!")
	f := newAuthFixture(t, k1)
	if r := f.deliver(f.from("n1", true, k2), "192.0.2.1"); r != dropBadMAC {
		t.Fatalf("unknown key: %q", r)
	}
	// Step 1: every member learns the new key while still signing with the old one.
	if err := f.m.SetKeys([][]byte{k1, k2}); err != nil {
		t.Fatal(err)
	}
	for _, k := range [][]byte{k1, k2} {
		if r := f.deliver(f.from("n1", true, k), "192.0.2.1"); r != acceptedReason {
			t.Errorf("during the rotation: %q", r)
		}
	}
	// Step 3: the old key is gone.
	if err := f.m.SetKeys([][]byte{k2}); err != nil {
		t.Fatal(err)
	}
	if r := f.deliver(f.from("n1", true, k1), "192.0.2.1"); r != dropBadMAC {
		t.Errorf("the retired key still verifies: %q", r)
	}
}

func TestHeartbeatSenderRestart(t *testing.T) {
	key := testKeys[0]
	f := newAuthFixture(t, key)
	if r := f.deliver(f.from("n1", true, key), "192.0.2.1"); r != acceptedReason {
		t.Fatal(r)
	}
	// n1 restarts: its counter starts again at its (later) boot time, and until it heard n2 it
	// echoes nothing. The first datagram is recorded but does not count; once it echoes, it does.
	f.counters["n1"] += uint64(time.Second)
	first := seal(t, key, "n2", heartbeat{name: "n1", counter: f.counters["n1"], heard: newBitmap(3), digest: f.m.segs[0].key})
	if r := f.deliver(first, "192.0.2.1"); r != dropUnfreshed {
		t.Errorf("restarted sender before it heard n2: %q, want not-fresh", r)
	}
	if r := f.deliver(f.from("n1", true, key), "192.0.2.1"); r != acceptedReason {
		t.Errorf("restarted sender: %q", r)
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

func TestParseMemberKeys(t *testing.T) {
	k1, k2 := strings.Repeat("0123456789abcdef", 2), strings.Repeat("fedcba9876543210", 2)
	keys, err := ParseKeys([]byte("# rotation in progress\n " + k1 + " \n\n" + k2 + "\n"))
	if err != nil || len(keys) != 2 || string(keys[0]) != k1 || string(keys[1]) != k2 {
		t.Errorf("two keys: %q %v", keys, err)
	}
	// 16 hex characters are 64 bits (accepted before); 32 are the least for 128.
	for _, bad := range []string{"", "\n# only a comment\n", "short\n", "0123456789abcdef\n", k1[:31] + "\n"} {
		if _, err := ParseKeys([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestHeartbeatReplayAfterRejoin(t *testing.T) {
	key := testKeys[0]
	f := newAuthFixture(t, key)
	captured := f.from("n1", true, key)
	if r := f.deliver(f.from("n1", true, key), "192.0.2.1"); r != acceptedReason {
		t.Fatal(r)
	}
	// n1 leaves the member list and comes back: what was captured before is still a replay.
	f.m.SetPeers(map[string][]netip.Addr{"n3": authAddrs["n3"]})
	f.m.SetPeers(authAddrs)
	if r := f.deliver(captured, "192.0.2.1"); r != dropReplay {
		t.Errorf("replay after n1 rejoined: %q, want replay", r)
	}
	if r := f.deliver(f.from("n1", true, key), "192.0.2.1"); r != acceptedReason {
		t.Errorf("n1 after it rejoined: %q", r)
	}
}
