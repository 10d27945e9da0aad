package dataplane

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vipgate/vipgate/cluster"
)

// TestResolveTargetPorts: every slice gives its own number to each Service port, matched by name and
// protocol whatever the order of the slice's ports; a port the slice does not list, or lists with
// another protocol, has none.
func TestResolveTargetPorts(t *testing.T) {
	svcPorts := []cluster.ServicePort{
		{Name: "http", Protocol: cluster.TCP, Port: 80},
		{Name: "dns", Protocol: cluster.UDP, Port: 53},
		{Name: "metrics", Protocol: cluster.TCP, Port: 9090},
	}
	slice := func(ports ...cluster.EndpointPort) *cluster.EndpointSlice {
		return &cluster.EndpointSlice{Ports: ports}
	}
	slices_ := []*cluster.EndpointSlice{
		slice(cluster.EndpointPort{Name: "http", Protocol: cluster.TCP, Port: 8080}, cluster.EndpointPort{Name: "dns", Protocol: cluster.UDP, Port: 5353},
			cluster.EndpointPort{Name: "metrics", Protocol: cluster.TCP, Port: 9100}),
		// Another mapping of the same names, in another order.
		slice(cluster.EndpointPort{Name: "metrics", Protocol: cluster.TCP, Port: 9101}, cluster.EndpointPort{Name: "http", Protocol: cluster.TCP, Port: 8081}),
		// dns with the wrong protocol, and a port the Service does not have.
		slice(cluster.EndpointPort{Name: "dns", Protocol: cluster.TCP, Port: 5353}, cluster.EndpointPort{Name: "admin", Protocol: cluster.TCP, Port: 7000}),
		slice(),
	}
	targets := ResolveTargetPorts(svcPorts, slices_)
	var got [][]uint16
	for i := range slices_ {
		row := make([]uint16, len(svcPorts))
		for j := range svcPorts {
			row[j] = targets.At(i, j)
		}
		got = append(got, row)
	}
	want := [][]uint16{{8080, 5353, 9100}, {8081, 0, 9101}, {0, 0, 0}, {0, 0, 0}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("target ports (-want +got):\n%s", diff)
	}
}
