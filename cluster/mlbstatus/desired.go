// Package mlbstatus writes MetalLB's status resources the way MetalLB v0.16.2 does (as v0.16.1), so that a user's
// `kubectl get servicel2statuses -A`, `servicebgpstatuses`, `configurationstates` and the
// IPAddressPool counters look as they do under MetalLB:
//
//   - ServiceL2Status (metallb.io/v1beta1): one per Service this node announces in layer 2, in
//     vipgate's namespace, generateName "l2-", labels metallb.io/node, metallb.io/service-name,
//     metallb.io/service-namespace, owned by the node's vipgate pod; status node, serviceName,
//     serviceNamespace, interfaces. The announcing node deletes the objects of other nodes for the
//     Service (MetalLB's Layer2StatusReconciler), so the object follows the VIP when it moves.
//   - ServiceBGPStatus: one per Service and node that advertises it over BGP, generateName "bgp-",
//     the same labels, status peers = the BGPPeer names the Service is configured to be advertised
//     to (MetalLB: "not whether the session is up").
//   - ConfigurationState: "speaker-<node>" (labels metallb.io/component-type=speaker,
//     metallb.io/node-name=<node>) and "controller" (metallb.io/component-type=controller), with
//     result Valid/Invalid, errorSummary and one condition (configReconcilerValid or
//     poolReconcilerValid, reason Reconciled or ConfigurationError).
//   - IPAddressPool status: assignedIPv4/IPv6, availableIPv4/IPv6, written by the controller.
//
// desired.go decides (pure functions, unit-tested); writer.go applies the difference to the API
// server, rate-limited, in the background, retrying on errors and never blocking its caller.
package mlbstatus

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// MetalLB's labels (internal/k8s/controllers/values.go and internal/k8s/k8s.go of v0.16.2).
const (
	LabelAnnounceNode     = "metallb.io/node"
	LabelServiceName      = "metallb.io/service-name"
	LabelServiceNamespace = "metallb.io/service-namespace"
	LabelComponentType    = "metallb.io/component-type"
	LabelNodeName         = "metallb.io/node-name"
)

// MetalLB's ConfigurationState condition types and reasons.
const (
	ConditionSpeaker    = "configReconcilerValid"
	ConditionController = "poolReconcilerValid"
	ReasonReconciled    = "Reconciled"
	ReasonConfiguration = "ConfigurationError"
)

// Component says which ConfigurationState a writer owns.
type Component string

// The two components of MetalLB.
const (
	Speaker    Component = "speaker"
	Controller Component = "controller"
)

// ServiceStatus is what one node reports about one Service: the interfaces it answers ARP/NDP on
// (L2) or the BGPPeer names it advertises the Service to (BGP).
type ServiceStatus struct {
	Interfaces []string
	Peers      []string
	// L2Owners are the nodes that announce some of the Service's IPs by L2 (a dual-stack Service's
	// two IPs may have two owners: vipgate picks an owner per IP, MetalLB one per Service). The
	// announcing node removes other nodes' ServiceL2Status of the Service, except these owners'.
	L2Owners []string
}

// L2Status is the status of the ServiceL2Status node reports for svc (MetalLB's buildDesiredStatus;
// interfaces sorted, once each).
func L2Status(node string, svc types.NamespacedName, interfaces []string) metallbv1beta1.MetalLBServiceL2Status {
	s := metallbv1beta1.MetalLBServiceL2Status{Node: node, ServiceName: svc.Name, ServiceNamespace: svc.Namespace}
	ifs := slices.Clone(interfaces)
	slices.Sort(ifs)
	for _, i := range slices.Compact(ifs) {
		s.Interfaces = append(s.Interfaces, metallbv1beta1.InterfaceInfo{Name: i})
	}
	return s
}

// BGPStatus is the status of the ServiceBGPStatus node reports for svc (peers sorted, as MetalLB's
// sets.List).
func BGPStatus(node string, svc types.NamespacedName, peers []string) metallbv1beta1.MetalLBServiceBGPStatus {
	p := slices.Clone(peers)
	slices.Sort(p)
	return metallbv1beta1.MetalLBServiceBGPStatus{Node: node, ServiceName: svc.Name, ServiceNamespace: svc.Namespace, Peers: slices.Compact(p)}
}

// ServiceLabels are the labels MetalLB puts on a ServiceL2Status or ServiceBGPStatus.
func ServiceLabels(node string, svc types.NamespacedName) map[string]string {
	return map[string]string{LabelAnnounceNode: node, LabelServiceName: svc.Name, LabelServiceNamespace: svc.Namespace}
}

// ConfigStateName and ConfigStateLabels name a component's ConfigurationState as MetalLB does
// ("controller", or "speaker-<node>").
func ConfigStateName(c Component, node string) string {
	if c == Controller {
		return "controller"
	}
	return "speaker-" + node
}

// ConfigStateLabels are the labels of a component's ConfigurationState.
func ConfigStateLabels(c Component, node string) map[string]string {
	if c == Controller {
		return map[string]string{LabelComponentType: "controller"}
	}
	return map[string]string{LabelComponentType: "speaker", LabelNodeName: node}
}

// ConfigState is the ConfigurationState status of a component whose configuration has the given
// problems (one line each; none = Valid). vipgate rejects a bad object alone and keeps the rest
// working, so Invalid means "some objects were rejected", and errorSummary lists them. prev is the
// current status (nil if none): the condition keeps its lastTransitionTime while its status stays.
func ConfigState(c Component, problems []string, prev *metallbv1beta1.ConfigurationStateStatus, now metav1.Time) metallbv1beta1.ConfigurationStateStatus {
	p := slices.Clone(problems)
	sort.Strings(p)
	p = slices.Compact(p)
	cond := metav1.Condition{Type: ConditionSpeaker, Status: metav1.ConditionTrue, Reason: ReasonReconciled, LastTransitionTime: now}
	if c == Controller {
		cond.Type = ConditionController
	}
	out := metallbv1beta1.ConfigurationStateStatus{Result: metallbv1beta1.ConfigurationResultValid}
	if len(p) > 0 {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonConfiguration, joinCapped(p, maxMessage)
		out.Result = metallbv1beta1.ConfigurationResultInvalid
		out.ErrorSummary = cond.Message
	}
	if prev != nil {
		for _, old := range prev.Conditions {
			if old.Type == cond.Type && old.Status == cond.Status && !old.LastTransitionTime.IsZero() {
				cond.LastTransitionTime = old.LastTransitionTime
			}
		}
	}
	out.Conditions = []metav1.Condition{cond}
	return out
}

// PoolCounts is one IPAddressPool's use, per family (sizes as float64: an IPv6 pool can exceed int64).
type PoolCounts struct {
	SizeIPv4, SizeIPv6         float64
	AssignedIPv4, AssignedIPv6 int64
}

// PoolStatus is the IPAddressPool status for c (MetalLB's PoolCounters: available = size - assigned,
// capped at the largest int64).
func PoolStatus(c PoolCounts) metallbv1beta1.IPAddressPoolStatus {
	avail := func(size float64, used int64) int64 {
		v := size - float64(used)
		switch {
		case v <= 0:
			return 0
		case v >= math.MaxInt64:
			return math.MaxInt64
		}
		return int64(v)
	}
	return metallbv1beta1.IPAddressPoolStatus{
		AssignedIPv4: c.AssignedIPv4, AssignedIPv6: c.AssignedIPv6,
		AvailableIPv4: avail(c.SizeIPv4, c.AssignedIPv4), AvailableIPv6: avail(c.SizeIPv6, c.AssignedIPv6),
	}
}

// sortedKeys returns m's keys in a stable order.
func sortedKeys[V any](m map[types.NamespacedName]V) []types.NamespacedName {
	return slices.SortedFunc(maps.Keys(m), func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) })
}

// maxMessage bounds the condition message and errorSummary: the CRD allows 32768 characters in a
// condition message, and a status the API server refuses would never be written.
const maxMessage = 32000

// joinCapped joins lines with newlines, keeping whole lines up to max bytes and saying how many were
// left out.
func joinCapped(lines []string, max int) string {
	var b strings.Builder
	for i, l := range lines {
		more := fmt.Sprintf("\n... and %d more", len(lines)-i)
		if b.Len()+1+len(l) > max-len(more) {
			if i == 0 {
				return fmt.Sprintf("%d problems; the first: %s", len(lines), strings.ToValidUTF8(l[:min(len(l), max/2)], ""))
			}
			b.WriteString(more)
			break
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(l)
	}
	return b.String()
}
