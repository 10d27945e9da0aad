package main

import (
	"slices"
	"testing"
	"time"
)

func TestParseFlagsGatewayPPS(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !o.sections["gateway-pps"] || !slices.Equal(o.gwPPS.modes, []string{"route", "nodePort", "direct"}) || o.gwPPS.rounds != 5 || o.gwPPS.sampleTime != 2*time.Second {
		t.Errorf("defaults: gateway-pps in the run %v, %+v", o.sections["gateway-pps"], o.gwPPS)
	}
	if !o.kubeProxy.churn {
		t.Errorf("defaults: kube-proxy's churn is off")
	}
	o, err = parseFlags([]string{"--only", "gateway-pps", "--gw-modes", "route", "--no-kube-proxy-churn", "--quick"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.sections) != 1 || !slices.Equal(o.gwPPS.modes, []string{"route"}) || o.kubeProxy.churn || o.gwPPS.rounds != 2 {
		t.Errorf("--only gateway-pps --gw-modes route --no-kube-proxy-churn --quick: %v %+v churn %v", o.sections, o.gwPPS, o.kubeProxy.churn)
	}
	for _, bad := range [][]string{{"--gw-modes", "dsr"}, {"--gw-time", "1m"}, {"--gw-rounds", "0"}, {"--gw-count", "0"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// Beyond 60,000 Services the cluster IPs are shared by port: no two Services may claim one entry.
func TestSynthClusterIPEntriesUnique(t *testing.T) {
	type entry struct {
		ip   string
		port uint16
	}
	seen := map[entry]int{}
	for i := range maxServices {
		svc, _ := synthService(i, 1)
		for _, ip := range append(svc.ClusterIPs, svc.LoadBalancerIPs...) {
			e := entry{ip.String(), svc.Ports[0].Port}
			if j, ok := seen[e]; ok {
				t.Fatalf("Services %d and %d both claim %v", j, i, e)
			}
			seen[e] = i
		}
	}
}
