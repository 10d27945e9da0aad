package cluster

import (
	"fmt"
	"strings"
)

// LBAlgorithmAnnotation chooses how a Service's new connections are spread over its endpoints, on the
// nodes (ClusterIP, NodePort and LoadBalancer entries) and on gateways. Unset: the default (random on
// nodes, as kube-proxy; Maglev on gateways). See docs/lb-algorithms.md.
const LBAlgorithmAnnotation = "vipgate.io/lb-algorithm"

// LBAlgorithm is a value of LBAlgorithmAnnotation.
type LBAlgorithm string

// The balancing algorithms.
const (
	// LBDefault: the annotation is not set.
	LBDefault LBAlgorithm = ""
	// LBRandom: `numgen random mod N`, kube-proxy's choice.
	LBRandom LBAlgorithm = "random"
	// LBRoundRobin: each endpoint in turn (`numgen inc`), per node (IPVS rr).
	LBRoundRobin LBAlgorithm = "round-robin"
	// LBSourceHash: a fixed hash of the client address (IPVS sh): a client keeps its endpoint while
	// the endpoints do not change.
	LBSourceHash LBAlgorithm = "source-hash"
	// LBMaglev: Maglev consistent hashing of the flow (addresses and ports).
	LBMaglev LBAlgorithm = "maglev"
)

// LBAlgorithms lists the valid values in the order the documentation gives them.
var LBAlgorithms = []LBAlgorithm{LBRandom, LBRoundRobin, LBSourceHash, LBMaglev}

// ServiceLBAlgorithm reads the Service's LBAlgorithmAnnotation. An absent or empty annotation is
// LBDefault. A value that is not one of LBAlgorithms returns LBDefault and an error that says what was
// wrong: the Service is still programmed, with the default algorithm (a typo must not take a Service
// down), and the caller reports the error (log, Event, status) as it does for refused addresses.
func ServiceLBAlgorithm(svc *Service) (LBAlgorithm, error) {
	if svc == nil {
		return LBDefault, nil
	}
	raw, ok := svc.Annotations[LBAlgorithmAnnotation]
	if !ok {
		return LBDefault, nil
	}
	v := LBAlgorithm(strings.TrimSpace(raw))
	if v == LBDefault {
		return LBDefault, nil
	}
	for _, a := range LBAlgorithms {
		if v == a {
			return a, nil
		}
	}
	names := make([]string, len(LBAlgorithms))
	for i, a := range LBAlgorithms {
		names[i] = string(a)
	}
	hint := ""
	if strings.EqualFold(string(v), "leastconn") || strings.EqualFold(string(v), "least-connection") || strings.EqualFold(string(v), "lc") {
		hint = " (least-connection needs per-endpoint connection counts, which stateless nftables rules cannot keep; see docs/lb-algorithms.md)"
	}
	return LBDefault, fmt.Errorf("metadata.annotations[%s]: unknown algorithm %q (want one of %s); the default is used%s",
		LBAlgorithmAnnotation, lbTruncate(string(v), 64), strings.Join(names, ", "), hint)
}

// lbTruncate keeps error messages short whatever an annotation holds.
func lbTruncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
