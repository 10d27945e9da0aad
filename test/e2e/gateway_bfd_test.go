package e2e

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vipgate/vipgate/test/lab"
	"github.com/vipgate/vipgate/test/routers"
)

// birdBFDSessionLine is a session line of birdc's "show bfd sessions": neighbor, interface, state, ...
var birdBFDSessionLine = regexp.MustCompile(`(?m)^([0-9a-fA-F.:]+)[ \t]+\S+[ \t]+(\S+)`)

// birdBFDStates reads BIRD's BFD sessions: state by neighbor address.
func birdBFDStates(bird *routers.BIRD) map[netip.Addr]string {
	out, _ := bird.Birdc("show", "bfd", "sessions")
	states := map[netip.Addr]string{}
	for _, m := range birdBFDSessionLine.FindAllStringSubmatch(out, -1) {
		if a, err := netip.ParseAddr(m[1]); err == nil {
			states[a] = m[2]
		}
	}
	return states
}

// waitBIRDBFDUp waits until BIRD's BFD sessions to every gateway in gws are Up.
//
// BIRD asks for a gateway's BFD session only once its BGP session is Established, so the route
// through a gateway is there before BFD watches over it: the session starts Down and comes Up up to
// a second later (both sides send at the idle rate of one packet a second until they hear each
// other). A gateway that dies in that window is not detected by BFD at all (a session that was never
// Up does not go down): the router keeps its route until the BGP hold timer (9 s). A test that kills
// a gateway to measure BFD's failover waits for this first.
func waitBIRDBFDUp(t *testing.T, bird *routers.BIRD, gws []*lab.Node, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		states := birdBFDStates(bird)
		up := true
		for _, g := range gws {
			up = up && states[g.IPv4] == "Up"
		}
		if up {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			out, _ := bird.Birdc("show", "bfd", "sessions")
			names := make([]string, 0, len(gws))
			for _, g := range gws {
				names = append(names, g.Name)
			}
			t.Fatalf("BIRD's BFD sessions not Up for %s after %v:\n%s", strings.Join(names, ", "), timeout, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
