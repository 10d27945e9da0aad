package cluster

import (
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// LabelServiceProxyName is the Service label that hands a Service to another proxy: kube-proxy
// ignores Services that carry it, and so does vipgate (unless it is that proxy, see
// ServiceProxyFilter.Name).
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// LabelHeadless marks a Service (and, copied by the EndpointSlice controller, its EndpointSlices) that
// no service proxy may program, whatever its spec says. kube-proxy ignores such objects entirely, and
// so does vipgate: not even the ClusterIP is programmed.
const LabelHeadless = "service.kubernetes.io/headless"

// ServiceProxyFilter says, from their labels, which Services and EndpointSlices vipgate programs.
// The EndpointSlice controller copies a Service's labels onto its slices, so one filter serves both.
//
// The zero value is kube-proxy's, whose informers use the label selector
// "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless": everything except the
// objects handed to another proxy or marked headless. With Name set (NodeConfig serviceProxyName, as
// Cilium's k8s-service-proxy-name), vipgate is that other proxy: it programs only the objects labelled
// service-proxy-name=Name, and still never the headless-labelled ones.
type ServiceProxyFilter struct {
	Name string
}

// Ignores reports whether an object with these labels is left alone.
func (f ServiceProxyFilter) Ignores(objLabels map[string]string) bool {
	if _, ok := objLabels[LabelHeadless]; ok {
		return true
	}
	name, ok := objLabels[LabelServiceProxyName]
	if f.Name == "" {
		return ok
	}
	return !ok || name != f.Name
}

// Selector is the label selector of the Service and EndpointSlice informers: exactly the objects
// Ignores accepts, so that ignored objects are never even sent by the API server.
func (f ServiceProxyFilter) Selector() labels.Selector {
	proxy := selection.DoesNotExist
	var values []string
	if f.Name != "" {
		proxy, values = selection.Equals, []string{f.Name}
	}
	sel := labels.NewSelector()
	for _, r := range []struct {
		key    string
		op     selection.Operator
		values []string
	}{{LabelServiceProxyName, proxy, values}, {LabelHeadless, selection.DoesNotExist, nil}} {
		req, err := labels.NewRequirement(r.key, r.op, r.values)
		if err != nil {
			// Only a Name that is not a label value gets here; NodeConfig validation refuses it.
			return labels.Nothing()
		}
		sel = sel.Add(*req)
	}
	return sel
}

// proxyLabels returns the labels of objLabels that ServiceProxyFilter reads (nil when there are none),
// so that a decoded object can be filtered later without keeping all its labels.
func proxyLabels(objLabels map[string]string) map[string]string {
	var out map[string]string
	for _, k := range []string{LabelServiceProxyName, LabelHeadless} {
		if v, ok := objLabels[k]; ok {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}
