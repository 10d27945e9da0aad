package cluster

import (
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
)

// apiService is a valid API Service as the informer delivers it (UID and resourceVersion set).
func apiService(name, uid, rv, clusterIP string) *corev1.Service {
	svc := kubeTestService(name, nil)
	svc.UID, svc.ResourceVersion = types.UID(uid), rv
	svc.Spec.ClusterIP = clusterIP
	return svc
}

func apiSlice(name, service, uid, rv string) *discoveryv1.EndpointSlice {
	es := kubeTestSlice(name, service, "10.244.1.11")
	es.UID, es.ResourceVersion = types.UID(uid), rv
	return es
}

// TestKubeBuilder checks, without an API server, what the Kubernetes source does with informer
// listings: conversion, pointer reuse by UID and resourceVersion, rejections reported once per
// resourceVersion, and MetalLB objects from unstructured.
func TestKubeBuilder(t *testing.T) {
	events := record.NewFakeRecorder(10)
	b := newKubeBuilder(hclog.New(&hclog.LoggerOptions{Output: testWriter{t}}), events)

	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
		"metadata": map[string]any{"name": "lan", "namespace": "default", "uid": "p1", "resourceVersion": "1"},
		"spec":     map[string]any{"addresses": []any{"203.0.113.0/28"}},
	}}
	objs := kubeObjects{
		services: []*corev1.Service{apiService("web", "s1", "1", "10.96.0.10"), apiService("bad", "s2", "1", "not-an-ip")},
		slices:   []*discoveryv1.EndpointSlice{apiSlice("web-a", "web", "e1", "1"), apiSlice("orphan", "", "e2", "1")},
		metallb:  []metallbItem{{kind: &metallbKinds[0], obj: pool}},
	}
	first := b.build(objs)
	web := ServiceKey{"default", "web"}
	if first.Services[web] == nil || len(first.Services) != 1 {
		t.Fatalf("services %s", describeState(first))
	}
	if len(first.Rejected) != 2 || first.Rejected[0].Kind != "EndpointSlice" || first.Rejected[1].Object != "default/bad" {
		t.Fatalf("rejected %v", first.Rejected)
	}
	if len(first.MetalLB.IPAddressPools) != 1 || first.MetalLB.IPAddressPools[0].Spec.Addresses[0] != "203.0.113.0/28" {
		t.Fatalf("MetalLB %+v", first.MetalLB)
	}
	if got := len(events.Events); got != 2 {
		t.Fatalf("%d events, want 2", got)
	}
	for range 2 {
		if ev := <-events.Events; !strings.HasPrefix(ev, "Warning Rejected vipgate ignores this") {
			t.Errorf("event %q", ev)
		}
	}

	// The same listing again, in another order: the same objects, no new events.
	objs.services[0], objs.services[1] = objs.services[1], objs.services[0]
	second := b.build(objs)
	if !sameState(first, second) {
		t.Errorf("an unchanged listing gave a different State")
	}
	if len(events.Events) != 0 {
		t.Errorf("rejections reported again for unchanged objects: %v", <-events.Events)
	}

	// A new resourceVersion of web converts again; the slice, the pool and the bad Service stay.
	objs.services = []*corev1.Service{apiService("web", "s1", "2", "10.96.0.10"), objs.services[0]}
	third := b.build(objs)
	if third.Services[web] == second.Services[web] {
		t.Errorf("web kept its pointer across a new resourceVersion")
	}
	if &third.EndpointSlices[web][0] != &second.EndpointSlices[web][0] || third.MetalLB != second.MetalLB {
		t.Errorf("unchanged slices or MetalLB objects lost their pointers")
	}
	if len(events.Events) != 0 {
		t.Errorf("rejections reported again: %v", <-events.Events)
	}

	// Deleted objects disappear, and so do their rejections.
	fourth := b.build(kubeObjects{services: objs.services[:1]})
	if len(fourth.Rejected) != 0 || len(fourth.EndpointSlices) != 0 || !fourth.MetalLB.IsEmpty() {
		t.Errorf("after deletions: %s, MetalLB %+v", describeState(fourth), fourth.MetalLB)
	}
}

// TestKubeBuilderIgnoresProxyLabels: Services and EndpointSlices kube-proxy ignores are left out even
// when a listing holds them (the informers' label selector normally keeps them away), without a
// rejection.
func TestKubeBuilderIgnoresProxyLabels(t *testing.T) {
	b := newKubeBuilder(hclog.New(&hclog.LoggerOptions{Output: testWriter{t}}), nil)
	headless := apiService("marked", "s2", "1", "10.96.0.11")
	headless.Labels = map[string]string{LabelHeadless: ""}
	other := apiService("other", "s3", "1", "10.96.0.12")
	other.Labels = map[string]string{LabelServiceProxyName: "someone-else"}
	markedSlice := apiSlice("marked-a", "marked", "e2", "1")
	markedSlice.Labels[LabelHeadless] = ""
	st := b.build(kubeObjects{
		services: []*corev1.Service{apiService("web", "s1", "1", "10.96.0.10"), headless, other},
		slices:   []*discoveryv1.EndpointSlice{apiSlice("web-a", "web", "e1", "1"), markedSlice},
	})
	if len(st.Services) != 1 || st.Services[ServiceKey{"default", "web"}] == nil {
		t.Errorf("services %s", describeState(st))
	}
	if len(st.EndpointSlices) != 1 || len(st.Rejected) != 0 {
		t.Errorf("slices %v, rejected %v", st.EndpointSlices, st.Rejected)
	}
}

// TestServiceProxyFilter checks the filter and the informers' selector against each other, and the
// default against kube-proxy's selector.
func TestServiceProxyFilter(t *testing.T) {
	if got, want := (ServiceProxyFilter{}).Selector().String(), "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"; got != want {
		t.Errorf("default selector %q, want kube-proxy's %q", got, want)
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		// ignoredBy is whether the default filter and the one named "vipgate" ignore the object.
		ignoredDefault, ignoredNamed bool
	}{
		{"no labels", nil, false, true},
		{"other labels", map[string]string{"app": "web"}, false, true},
		{"headless", map[string]string{LabelHeadless: ""}, true, true},
		{"another proxy", map[string]string{LabelServiceProxyName: "other"}, true, true},
		{"this proxy", map[string]string{LabelServiceProxyName: "vipgate"}, true, false},
		{"this proxy but headless", map[string]string{LabelServiceProxyName: "vipgate", LabelHeadless: "x"}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, f := range []struct {
				filter ServiceProxyFilter
				want   bool
			}{{ServiceProxyFilter{}, tc.ignoredDefault}, {ServiceProxyFilter{Name: "vipgate"}, tc.ignoredNamed}} {
				if got := f.filter.Ignores(tc.labels); got != f.want {
					t.Errorf("%+v.Ignores(%v) = %v, want %v", f.filter, tc.labels, got, f.want)
				}
				if got := !f.filter.Selector().Matches(labels.Set(tc.labels)); got != f.want {
					t.Errorf("%+v: selector %q ignores %v: %v, want %v", f.filter, f.filter.Selector(), tc.labels, got, f.want)
				}
			}
		})
	}
}

// TestStripManagedFields checks the informer transform on typed and unstructured objects.
func TestStripManagedFields(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}}
	u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
		"name": "x", "managedFields": []any{map[string]any{"manager": "kubectl"}}}}}
	for _, o := range []metav1.Object{svc, u} {
		if _, err := stripManagedFields(o); err != nil {
			t.Fatal(err)
		}
		if len(o.GetManagedFields()) != 0 {
			t.Errorf("%T still has managed fields", o)
		}
	}
	if u.GetName() != "x" {
		t.Errorf("name lost")
	}
}
