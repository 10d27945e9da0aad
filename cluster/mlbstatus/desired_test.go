package mlbstatus

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestL2AndBGPStatus(t *testing.T) {
	svc := types.NamespacedName{Namespace: "demo", Name: "web"}
	got := L2Status("node1", svc, []string{"eth1", "eth0", "eth1"})
	want := metallbv1beta1.MetalLBServiceL2Status{Node: "node1", ServiceName: "web", ServiceNamespace: "demo",
		Interfaces: []metallbv1beta1.InterfaceInfo{{Name: "eth0"}, {Name: "eth1"}}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("L2Status (-want +got):\n%s", d)
	}
	gotB := BGPStatus("node1", svc, []string{"tor2", "tor1", "tor2"})
	wantB := metallbv1beta1.MetalLBServiceBGPStatus{Node: "node1", ServiceName: "web", ServiceNamespace: "demo", Peers: []string{"tor1", "tor2"}}
	if d := cmp.Diff(wantB, gotB); d != "" {
		t.Errorf("BGPStatus (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]string{"metallb.io/node": "node1", "metallb.io/service-name": "web", "metallb.io/service-namespace": "demo"},
		ServiceLabels("node1", svc)); d != "" {
		t.Errorf("ServiceLabels (-want +got):\n%s", d)
	}
}

func TestConfigState(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Hour))
	for _, tc := range []struct {
		name     string
		c        Component
		problems []string
		prev     *metallbv1beta1.ConfigurationStateStatus
		want     metallbv1beta1.ConfigurationStateStatus
	}{
		{name: "speaker valid", c: Speaker, want: metallbv1beta1.ConfigurationStateStatus{Result: "Valid",
			Conditions: []metav1.Condition{{Type: "configReconcilerValid", Status: "True", Reason: "Reconciled", LastTransitionTime: t1}}}},
		{name: "controller invalid, sorted and once each", c: Controller, problems: []string{"b: bad", "a: worse", "b: bad"},
			want: metallbv1beta1.ConfigurationStateStatus{Result: "Invalid", ErrorSummary: "a: worse\nb: bad",
				Conditions: []metav1.Condition{{Type: "poolReconcilerValid", Status: "False", Reason: "ConfigurationError", Message: "a: worse\nb: bad", LastTransitionTime: t1}}}},
		{name: "unchanged status keeps its transition time", c: Speaker,
			prev: &metallbv1beta1.ConfigurationStateStatus{Conditions: []metav1.Condition{{Type: "configReconcilerValid", Status: "True", LastTransitionTime: t0}}},
			want: metallbv1beta1.ConfigurationStateStatus{Result: "Valid",
				Conditions: []metav1.Condition{{Type: "configReconcilerValid", Status: "True", Reason: "Reconciled", LastTransitionTime: t0}}}},
		{name: "changed status moves it", c: Speaker, problems: []string{"x"},
			prev: &metallbv1beta1.ConfigurationStateStatus{Conditions: []metav1.Condition{{Type: "configReconcilerValid", Status: "True", LastTransitionTime: t0}}},
			want: metallbv1beta1.ConfigurationStateStatus{Result: "Invalid", ErrorSummary: "x",
				Conditions: []metav1.Condition{{Type: "configReconcilerValid", Status: "False", Reason: "ConfigurationError", Message: "x", LastTransitionTime: t1}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, ConfigState(tc.c, tc.problems, tc.prev, t1)); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
	if ConfigStateName(Speaker, "n1") != "speaker-n1" || ConfigStateName(Controller, "") != "controller" {
		t.Error("ConfigurationState names differ from MetalLB's")
	}
	if d := cmp.Diff(map[string]string{"metallb.io/component-type": "speaker", "metallb.io/node-name": "n1"}, ConfigStateLabels(Speaker, "n1")); d != "" {
		t.Errorf("speaker labels (-want +got):\n%s", d)
	}
}

func TestPoolStatus(t *testing.T) {
	for _, tc := range []struct {
		in   PoolCounts
		want metallbv1beta1.IPAddressPoolStatus
	}{
		{PoolCounts{SizeIPv4: 11, AssignedIPv4: 1}, metallbv1beta1.IPAddressPoolStatus{AssignedIPv4: 1, AvailableIPv4: 10}},
		{PoolCounts{SizeIPv4: 254, SizeIPv6: math.Pow(2, 80), AssignedIPv6: 3},
			metallbv1beta1.IPAddressPoolStatus{AvailableIPv4: 254, AssignedIPv6: 3, AvailableIPv6: math.MaxInt64}},
		{PoolCounts{SizeIPv4: 1, AssignedIPv4: 2}, metallbv1beta1.IPAddressPoolStatus{AssignedIPv4: 2}},
	} {
		if d := cmp.Diff(tc.want, PoolStatus(tc.in)); d != "" {
			t.Errorf("PoolStatus(%+v) (-want +got):\n%s", tc.in, d)
		}
	}
}

func TestConfigStateMessageCapped(t *testing.T) {
	var problems []string
	for i := range 2000 {
		problems = append(problems, fmt.Sprintf("Service default/svc-%04d IP 192.0.2.1: L2Advertisement interface(s) bond7 not found on this node", i))
	}
	st := ConfigState(Speaker, problems, nil, metav1.Now())
	msg := st.Conditions[0].Message
	if len(msg) > maxMessage || !strings.HasSuffix(msg, "more") || st.ErrorSummary != msg {
		t.Fatalf("message of %d bytes (max %d), ends %q", len(msg), maxMessage, msg[max(0, len(msg)-40):])
	}
	if one := joinCapped([]string{strings.Repeat("é", maxMessage)}, maxMessage); len(one) > maxMessage || !utf8.ValidString(one) {
		t.Fatalf("one long line: %d bytes, valid UTF-8 %v", len(one), utf8.ValidString(one))
	}
}
