package cluster

import (
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
