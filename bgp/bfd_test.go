package bgp

import (
	"bytes"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"

	"github.com/vipgate/vipgate/bgp/bfd"
)

func TestBFDConfig(t *testing.T) {
	p := PeerConfig{PeerAddress: netip.MustParseAddr("192.0.2.1"), SourceAddress: netip.MustParseAddr("192.0.2.2"),
		BFD: &BFDProfile{ReceiveInterval: 300 * time.Millisecond, TransmitInterval: 100 * time.Millisecond, DetectMultiplier: 5, PassiveMode: true, MinimumTTL: 250}}
	want := bfd.Config{Peer: p.PeerAddress, Local: p.SourceAddress, DesiredMinTx: 100 * time.Millisecond, RequiredMinRx: 300 * time.Millisecond,
		DetectMult: 5, Passive: true}
	if diff := cmp.Diff(want, bfdConfig(p), cmpNet); diff != "" {
		t.Errorf("single hop (-want +got):\n%s", diff)
	}
	// The minimum TTL only applies to multi-hop sessions (RFC 5881 wants 255 on one hop).
	p.EBGPMultiHop = true
	want.Multihop, want.MinTTL = true, 250
	if diff := cmp.Diff(want, bfdConfig(p), cmpNet); diff != "" {
		t.Errorf("multi-hop (-want +got):\n%s", diff)
	}
}

// syncBuffer is a log sink safe for the speaker's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSpeakerBFDOnlyChange: a change of the BFD profile alone keeps GoBGP's neighbor (the BGP
// session); removing BFD leaves the peer without BFD status. The peer never establishes (closed
// port), so its BFD session is held and nothing is bound.
func TestSpeakerBFDOnlyChange(t *testing.T) {
	var out syncBuffer
	sp, err := New(hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Info}), nil, netip.MustParseAddr("127.0.0.1"), -1)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Shutdown(t.Context(), 0)
	p := loopbackPeer("a", "127.0.0.2")
	p.BFD = &BFDProfile{ReceiveInterval: 300 * time.Millisecond, TransmitInterval: 300 * time.Millisecond, DetectMultiplier: 3}
	if err := sp.SetPeers([]PeerConfig{p}); err != nil {
		t.Fatal(err)
	}
	if st := sp.Status(); len(st) != 1 || st[0].BFD != BFDDown {
		t.Errorf("status %+v, want BFD down", st)
	}
	b, ok := sp.bfd.Session(p.PeerAddress)
	if !ok || b.State != bfd.StateDown {
		t.Errorf("BFD session %+v (exists %v), want a held Down session", b, ok)
	}
	p.BFD = &BFDProfile{ReceiveInterval: 100 * time.Millisecond, TransmitInterval: 100 * time.Millisecond, DetectMultiplier: 4}
	if err := sp.SetPeers([]PeerConfig{p}); err != nil {
		t.Fatal(err)
	}
	if n, m := strings.Count(out.String(), "peer added"), strings.Count(out.String(), "peer removed"); n != 1 || m != 0 {
		t.Errorf("a BFD-only change added the peer %d times and removed it %d times, want 1 and 0:\n%s", n, m, out.String())
	}
	p.BFD = nil
	if err := sp.SetPeers([]PeerConfig{p}); err != nil {
		t.Fatal(err)
	}
	if st := sp.Status(); len(st) != 1 || st[0].BFD != BFDDisabled {
		t.Errorf("status %+v, want no BFD", st)
	}
	if _, ok := sp.bfd.Session(p.PeerAddress); ok {
		t.Errorf("BFD session left after removing the profile")
	}
}
