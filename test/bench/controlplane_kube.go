package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/test/apiserver"
)

// controlPlaneKube is controlPlane through a real kube-apiserver (test/apiserver: etcd and
// kube-apiserver in node1's namespace, on its loopback): `vipgate node --kubeconfig` watches it,
// with `background` Services and their EndpointSlices created first; for each change a Service is
// created (and awaited: refused), then its EndpointSlice, and the time from the create call's
// return to the client's first connection through the ClusterIP to pod1 is taken. The background
// Services are all ClusterIP: the API server allocates NodePorts from 30000-32767 only, and this
// row measures the watch path, not the mix. With compare (--cp-compare) a second vipgate binary is
// measured the same way in the same run (before / after a change).
func controlPlaneKube(t *table, pl *packetLab, bin, compare string, background, changes int) {
	what := fmt.Sprintf("EndpointSlice created in kube-apiserver -> first connection through its ClusterIP, `vipgate node --kubeconfig`, %s Services, p50 / p99 of %d",
		thousands(background+1), changes)
	dir, err := pl.controlPlaneDir("kube")
	if err != nil {
		t.fail(what, err)
		return
	}
	srv, err := apiserver.Launch(apiserver.Options{Netns: pl.l.NS(thisNode), Addr: netip.MustParseAddr("127.0.0.1")},
		filepath.Join(dir, "apiserver"), func(string, ...any) {})
	if srv != nil {
		defer srv.Shutdown()
	}
	if err != nil {
		if strings.Contains(err.Error(), "not found") {
			t.skip(what, "no kube-apiserver or etcd (`make apiserver`, `make deps`): "+err.Error())
			return
		}
		t.fail(what, err)
		return
	}
	cfg := srv.RESTConfig()
	cfg.QPS, cfg.Burst = 2000, 4000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.fail(what, err)
		return
	}
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}}, metav1.CreateOptions{}); err != nil {
		t.fail(what, err)
		return
	}
	start := time.Now()
	if err := createBackground(ctx, client, background); err != nil {
		t.fail(what, fmt.Errorf("creating the background Services: %w", err))
		return
	}
	fmt.Fprintf(os.Stderr, "  (%s background Services and EndpointSlices created through the API in %v)\n", thousands(background), time.Since(start).Round(time.Second))

	nodeCfg := filepath.Join(dir, "node1.yaml")
	if err := os.WriteFile(nodeCfg, []byte(nodeConfigYAML(pl.node)), 0o644); err != nil {
		t.fail(what, err)
		return
	}
	// Each binary runs in its own process against the same API server and background; with a
	// comparison binary the two take turns in ABBA order (half the changes per turn), so that both
	// see the same load of the shared machine.
	type runner struct {
		bin    string
		lat    []time.Duration
		octets []byte
	}
	runners := []*runner{{bin: bin, octets: []byte{253, 252}}}
	order := []int{0}
	if compare != "" {
		runners = append(runners, &runner{bin: compare, octets: []byte{251, 250}})
		order = []int{0, 1, 1, 0}
	}
	turn := map[int]int{}
	for k, ri := range order {
		r := runners[ri]
		n := changes
		if compare != "" {
			n = (changes + 1) / 2
		}
		octet := r.octets[turn[ri]]
		turn[ri]++
		proc, err := pl.l.Start(thisNode, filepath.Join(dir, fmt.Sprintf("vipgate-%d.log", k)), r.bin, "node", "--config", nodeCfg, "--kubeconfig", srv.Kubeconfig, "--log-level", "warn")
		if err != nil {
			t.fail(what, err)
			return
		}
		lat, err := pl.probeChanges(n, octet, func(svc *cluster.Service, _ *cluster.EndpointSlice) error {
			_, err := client.CoreV1().Services(benchNamespace).Create(ctx, kubeService(svc.Key.Name, svc.ClusterIPs[0]), metav1.CreateOptions{})
			return err
		}, func(_ *cluster.Service, es *cluster.EndpointSlice) error {
			_, err := client.DiscoveryV1().EndpointSlices(benchNamespace).Create(ctx, kubeSlice(es), metav1.CreateOptions{})
			return err
		})
		if err != nil {
			t.fail(what, fmt.Errorf("%s: %v; vipgate log: %s", r.bin, err, oneLine(proc.Tail(5))))
			proc.Stop()
			return
		}
		proc.Stop()
		r.lat = append(r.lat, lat...)
	}
	ref := "from the create call's return: the watch event, a snapshot at once when the informers were quiet for 50 ms (bursts coalesce: kubeDebounce), then the sync"
	if compare != "" {
		c := runners[1]
		ref = fmt.Sprintf("the same with %s, same run, ABBA turns: %s / %s (p50 / p99 of %d)", filepath.Base(c.bin),
			fmtDuration(quantile(c.lat, 0.5)), fmtDuration(quantile(c.lat, 0.99)), len(c.lat))
	}
	t.add(row{What: what, Vipgate: fmtDuration(quantile(runners[0].lat, 0.5)) + " / " + fmtDuration(quantile(runners[0].lat, 0.99)), Ref: ref})
}

// createBackground creates n synthetic Services (as ClusterIP) and their EndpointSlices, 16 at a time.
func createBackground(ctx context.Context, client kubernetes.Interface, n int) error {
	work := make(chan int)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				svc, es := synthService(i, 10)
				ksvc := kubeService(svc.Key.Name, svc.ClusterIPs[0])
				if _, err := client.CoreV1().Services(benchNamespace).Create(ctx, ksvc, metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
				if _, err := client.DiscoveryV1().EndpointSlices(benchNamespace).Create(ctx, kubeSlice(es), metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := 0; i < n; i++ {
		select {
		case work <- i:
		case err = <-errs:
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

func kubeService(name string, ip netip.Addr) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNamespace},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: ip.String(), ClusterIPs: []string{ip.String()},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

func kubeSlice(es *cluster.EndpointSlice) *discoveryv1.EndpointSlice {
	out := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: es.Name, Namespace: es.Namespace, Labels: map[string]string{discoveryv1.LabelServiceName: es.Service.Name}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range es.Ports {
		proto, port := corev1.Protocol(p.Protocol), int32(p.Port)
		out.Ports = append(out.Ports, discoveryv1.EndpointPort{Protocol: &proto, Port: &port})
	}
	for _, ep := range es.Endpoints {
		ready, serving, terminating := ep.Ready, ep.Serving, ep.Terminating
		node := ep.NodeName
		out.Endpoints = append(out.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{ep.Addresses[0].String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
			NodeName:   &node,
		})
	}
	return out
}
