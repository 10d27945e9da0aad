package main

import (
	"maps"
	"testing"
)

func TestParseBFDSessions(t *testing.T) {
	// birdc 2.0's output, one session Up and one not yet.
	out := `BIRD 2.0.12 ready.
bfd1:
IP address                Interface  State      Since         Interval  Timeout
192.0.2.13                lan0       Init       22:34:34.851    1.000    3.000
192.0.2.14                lan0       Up         22:34:35.069    0.200    0.600
2001:db8:1::13            lan0       Down       22:34:32.662    1.000    0.000
`
	want := map[string]string{"192.0.2.13": "Init", "192.0.2.14": "Up", "2001:db8:1::13": "Down"}
	if got := parseBFDSessions(out); !maps.Equal(got, want) {
		t.Errorf("parseBFDSessions = %v, want %v", got, want)
	}
	if got := parseBFDSessions("BIRD 2.0.12 ready.\nbfd1:\nIP address                Interface  State      Since         Interval  Timeout\n"); len(got) != 0 {
		t.Errorf("no sessions: got %v", got)
	}
}

func TestParseRetransSegs(t *testing.T) {
	out := `Ip: Forwarding DefaultTTL InReceives
Ip: 2 64 1234
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 52 0 0 0 40 4321 4400 17 0 3 0
Udp: InDatagrams NoPorts
Udp: 12 0
`
	if n, err := parseRetransSegs(out); err != nil || n != 17 {
		t.Errorf("parseRetransSegs = %d, %v; want 17", n, err)
	}
	if _, err := parseRetransSegs("Ip: Forwarding\nIp: 2\n"); err == nil {
		t.Error("parseRetransSegs without a Tcp line: no error")
	}
}
