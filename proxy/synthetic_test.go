package proxy

import "testing"

// TestSyntheticStateUniqueNodePorts: no two synthetic Services claim one NodePort, so a benchmark
// programs every entry it counts.
func TestSyntheticStateUniqueNodePorts(t *testing.T) {
	seen := map[uint16]string{}
	for _, svc := range SyntheticState(30000, 1).Services {
		for _, p := range svc.Ports {
			if p.NodePort == 0 {
				continue
			}
			if other, ok := seen[p.NodePort]; ok {
				t.Fatalf("NodePort %d: %s and %s", p.NodePort, other, svc.Key)
			}
			seen[p.NodePort] = svc.Key.String()
		}
	}
	if len(seen) != 4500 {
		t.Errorf("%d NodePorts, want 4,500 (15%% of 30,000)", len(seen))
	}
}
