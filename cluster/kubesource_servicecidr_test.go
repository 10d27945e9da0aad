package cluster

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vipgate/vipgate/test/apiserver"
)

func TestServiceCIDRPrefixes(t *testing.T) {
	now := metav1.Now()
	obj := func(name string, cidrs ...string) *networkingv1.ServiceCIDR {
		return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
	}
	terminating := obj("old", "203.0.113.0/26")
	terminating.DeletionTimestamp = &now
	got, rej := ServiceCIDRPrefixes([]*networkingv1.ServiceCIDR{
		obj("kubernetes", "10.96.0.0/16", "2001:db8:96::/108"),
		obj("extra", "203.0.113.77/26"), // not masked: masked here
		obj("dup", "10.96.0.0/16"),
		terminating,                                    // kept until it is gone
		obj("bad", "10.97.0.0/33", "203.0.113.128/26"), // the bad range alone is refused
		obj("mapped", "::ffff:10.0.0.0/104"),
		nil,
	})
	want := []netip.Prefix{
		netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("203.0.113.0/26"),
		netip.MustParsePrefix("203.0.113.64/26"), netip.MustParsePrefix("203.0.113.128/26"),
		netip.MustParsePrefix("2001:db8:96::/108"),
	}
	if d := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
		t.Errorf("prefixes (-want +got):\n%s", d)
	}
	wantRej := []Rejection{
		{Kind: "ServiceCIDR", Object: "bad", Source: "kubernetes", Reason: `spec.cidrs: not a CIDR: "10.97.0.0/33"`},
		{Kind: "ServiceCIDR", Object: "mapped", Source: "kubernetes", Reason: `spec.cidrs: not a CIDR: "::ffff:10.0.0.0/104"`},
	}
	if d := cmp.Diff(wantRej, rej); d != "" {
		t.Errorf("rejections (-want +got):\n%s", d)
	}
	if got := ServiceCIDRs([]netip.Prefix{netip.MustParsePrefix("10.96.1.2/16")}, &State{ServiceCIDRs: want[:2]}); !cmp.Equal(got, want[:2], cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })) {
		t.Errorf("union = %v, want %v", got, want[:2])
	}
	if got := ServiceCIDRs(nil, nil); len(got) != 0 {
		t.Errorf("union of nothing = %v", got)
	}
}

// flakyDiscovery answers ServiceCIDR discovery (networking.k8s.io/v1) with errs, one per call, then
// as discovery does.
type flakyDiscovery struct {
	next  func(context.Context, kubernetes.Interface) (*metav1.APIResourceList, error)
	mu    sync.Mutex
	errs  []error
	calls int
}

func (d *flakyDiscovery) resources(ctx context.Context, c kubernetes.Interface) (*metav1.APIResourceList, error) {
	d.mu.Lock()
	d.calls++
	var err error
	if len(d.errs) > 0 {
		err, d.errs = d.errs[0], d.errs[1:]
	}
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return d.next(ctx, c)
}

func (d *flakyDiscovery) callCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls
}

// useFlakyDiscovery makes ServiceCIDR discovery go through a flakyDiscovery answering errs first, with
// short retry delays, until the test ends.
func useFlakyDiscovery(t *testing.T, errs ...error) *flakyDiscovery {
	prevDisc, prevMin, prevMax := serviceCIDRResources, serviceCIDRRetryMin, serviceCIDRRetryMax
	t.Cleanup(func() { serviceCIDRResources, serviceCIDRRetryMin, serviceCIDRRetryMax = prevDisc, prevMin, prevMax })
	serviceCIDRRetryMin, serviceCIDRRetryMax = 20*time.Millisecond, 200*time.Millisecond
	fd := &flakyDiscovery{errs: errs, next: prevDisc}
	serviceCIDRResources = fd.resources
	return fd
}

// TestServiceCIDRProbeCancel: ServiceCIDR discovery of an API server that never answers ends with
// the context (shutdown), not with the client's timeout (none by default).
func TestServiceCIDRProbeCancel(t *testing.T) {
	asked := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case asked <- struct{}{}:
		default:
		}
		<-r.Context().Done() // never answers; the client's cancellation ends the request
	}))
	defer srv.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	w := &serviceCIDRWatch{client: client, logger: hclog.NewNullLogger(), logged: map[string]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-asked
		cancel()
	}()
	answer, err := w.probe(ctx)
	if answer != serviceCIDRsUnknown || !errors.Is(err, context.Canceled) {
		t.Errorf("probe after cancellation: %v, %v; want unknown, context canceled", answer, err)
	}
}

// syncBuffer is a log sink for several goroutines.
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

// TestKubeSourceServiceCIDRRetry: ServiceCIDR discovery fails when the source starts (twice as if
// the API server were unreachable, twice Forbidden); the source starts without them, keeps asking in
// the background, and the ServiceCIDRs of a real kube-apiserver arrive in a State once discovery
// answers. Each failure is logged once, not at every retry.
func TestKubeSourceServiceCIDRRetry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	unreachable := errors.New(`Get "https://192.0.2.1:6443/apis/networking.k8s.io/v1": dial tcp 192.0.2.1:6443: connect: connection refused`)
	forbidden := apierrors.NewForbidden(schema.GroupResource{}, "", errors.New(`User "system:serviceaccount:kube-system:vipgate" cannot get path "/apis/networking.k8s.io/v1"`))
	fd := useFlakyDiscovery(t, unreachable, unreachable, forbidden, forbidden)

	srv := apiserver.Start(t, apiserver.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	must := mustFor(t)
	must(srv.Client.NetworkingV1().ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "extra"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"203.0.113.64/26"}},
	}, metav1.CreateOptions{}))

	var logs syncBuffer
	logger := hclog.New(&hclog.LoggerOptions{Name: "kube", Level: hclog.Info, Output: io.MultiWriter(&logs, testWriter{t})})
	rec := runTestSource(t, ctx, NewKubeSource(srv.RESTConfig(), "node1", logger))
	first := rec.wait(t, "the first snapshot", func(*State) bool { return true })
	t.Logf("first snapshot: ServiceCIDRs %v", first.ServiceCIDRs)
	want := []netip.Prefix{netip.MustParsePrefix(apiserver.ServiceCIDR), netip.MustParsePrefix("203.0.113.64/26")}
	slices.SortFunc(want, comparePrefix)
	rec.wait(t, "the ServiceCIDRs once discovery answers", func(st *State) bool { return slices.Equal(st.ServiceCIDRs, want) })
	if c := fd.callCount(); c != 5 {
		t.Errorf("ServiceCIDR discovery asked %d times, want 5 (4 failures, then the answer)", c)
	}

	// The informer runs: a range added now arrives too.
	must(srv.Client.NetworkingV1().ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "later"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"198.51.100.0/24"}},
	}, metav1.CreateOptions{}))
	rec.wait(t, "the ServiceCIDR added later", func(st *State) bool {
		return slices.Contains(st.ServiceCIDRs, netip.MustParsePrefix("198.51.100.0/24"))
	})

	out := logs.String()
	for _, tc := range []struct {
		line string
		want int
	}{
		{"cannot discover ServiceCIDRs", 1},
		{"not allowed to list ServiceCIDRs", 1},
		{"ServiceCIDRs discovered; watching them now", 1},
	} {
		if got := strings.Count(out, tc.line); got != tc.want {
			t.Errorf("%q logged %d times, want %d", tc.line, got, tc.want)
		}
	}
}

// TestServiceCIDRDiscoveryAnswers checks watchServiceCIDRs's decisions without an API server: served
// (informer registered at once), not served (neither informer nor retries), and a transient failure
// followed by "not served" (one retry, then the goroutine ends).
func TestServiceCIDRDiscoveryAnswers(t *testing.T) {
	served := &metav1.APIResourceList{GroupVersion: serviceCIDRGroupVersion,
		APIResources: []metav1.APIResource{{Name: serviceCIDRResource, Kind: "ServiceCIDR"}}}
	notFound := apierrors.NewNotFound(schema.GroupResource{}, serviceCIDRGroupVersion)
	for _, tc := range []struct {
		name      string
		resources []*metav1.APIResourceList
		errs      []error
		watched   bool
		calls     int
	}{
		{"served", []*metav1.APIResourceList{served}, nil, true, 1},
		{"no such group version", nil, []error{notFound}, false, 1},
		{"group version without the resource", []*metav1.APIResourceList{{GroupVersion: serviceCIDRGroupVersion}}, nil, false, 1},
		{"unreachable, then not served", nil, []error{errors.New("connection refused"), notFound}, false, 2},
		{"unreachable, then served", []*metav1.APIResourceList{served}, []error{errors.New("connection refused")}, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd := useFlakyDiscovery(t, tc.errs...)
			client := kubefake.NewClientset()
			client.Resources = tc.resources
			factory := informers.NewSharedInformerFactory(client, 0)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			notified := make(chan struct{}, 1)
			w, err := watchServiceCIDRs(ctx, factory, client, cache.ResourceEventHandlerFuncs{},
				func() { notified <- struct{}{} }, &wg, hclog.New(&hclog.LoggerOptions{Output: testWriter{t}}))
			if err != nil {
				t.Fatal(err)
			}
			factory.Start(ctx.Done())
			defer func() { cancel(); factory.Shutdown() }()
			if tc.calls > 1 && tc.watched {
				select {
				case <-notified:
				case <-time.After(60 * time.Second):
					t.Fatal("no notification once discovery answered")
				}
			}
			wg.Wait() // the retries end by themselves here
			if got := w.informer() != nil; got != tc.watched {
				t.Errorf("watched %v, want %v", got, tc.watched)
			}
			if got := fd.callCount(); got != tc.calls {
				t.Errorf("%d discovery calls, want %d", got, tc.calls)
			}
		})
	}
}
