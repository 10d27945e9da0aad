package speaker

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
)

// Weighted ECMP for externalTrafficPolicy Local (MetalLB issue #1): with eTP=Local each node sends
// a VIP's traffic only to its own endpoints, yet the router's ECMP gives every advertising node the
// same share, so a node with one ready pod gets as many flows as one with ten. A BGPAdvertisement
// annotated WeightedECMPAnnotation: "true" makes each node send its routes of eTP=Local Services
// with the BGP link bandwidth extended community (bgp.LinkBandwidth) in proportion to its ready
// local endpoints of the Service; a router doing weighted ECMP (FRR: it uses the community when
// every multipath carries it) then gives each node a share proportional to its endpoints.
//
// The community is left out (the router falls back to equal shares) for eTP=Cluster Services
// (every node forwards to every endpoint: equal shares are right) and for aggregated prefixes
// (aggregationLength shorter than the IP: the route covers other Services). A node with no
// endpoint does not advertise an eTP=Local IP at all, as before.

// WeightedECMPAnnotation on a BGPAdvertisement: "true" turns weighted ECMP on for the eTP=Local
// Services it advertises, "false" (or no annotation) leaves it off. MetalLB's CRDs have no such
// field.
const WeightedECMPAnnotation = "vipgate.io/weighted-ecmp"

// LinkBandwidthPerEndpoint is the link bandwidth one ready endpoint is worth: 1 Mbit/s, in bytes
// per second. Routers only compare the values of one prefix's paths, so the unit is arbitrary;
// whole Mbit/s read well in FRR's "show bgp" ("Extended Community: LB:64513:375000 (3.000 Mbps)").
const LinkBandwidthPerEndpoint = 125000

// MaxWeightedEndpoints caps the endpoints counted per node (10 Gbit/s): FRR keeps the bandwidth
// as a 32-bit count of bytes per second, which 34,359 endpoints would overflow. Its weights are
// whole percents anyway.
const MaxWeightedEndpoints = 10000

// DefaultLinkBandwidthInterval is ControllerOptions.LinkBandwidthInterval's default: the least
// time between two link bandwidth changes of one route.
const DefaultLinkBandwidthInterval = 5 * time.Second

// LinkBandwidthFor is the community a node with endpoints ready local endpoints sends (zero, none,
// for 0), with as in its AS field.
func LinkBandwidthFor(endpoints int, as uint32) bgp.LinkBandwidth {
	if endpoints <= 0 {
		return bgp.LinkBandwidth{}
	}
	n := min(endpoints, MaxWeightedEndpoints)
	return bgp.LinkBandwidth{AS: as, BytesPerSecond: float32(n * LinkBandwidthPerEndpoint)}
}

// localEndpoints counts the endpoints of family on node that this node's dataplane sends an
// eTP=Local VIP's traffic to, as kube-proxy picks them: the ready ones, or, when none is ready,
// the serving (terminating) ones. An address listed in two slices counts once.
func localEndpoints(slices_ []*cluster.EndpointSlice, node string, family cluster.Family) int {
	ready, serving := map[netip.Addr]bool{}, map[netip.Addr]bool{}
	for _, es := range slices_ {
		if es.Family != family {
			continue
		}
		for _, ep := range es.Endpoints {
			if ep.NodeName != node || len(ep.Addresses) == 0 {
				continue
			}
			switch {
			case ep.Ready:
				ready[ep.Addresses[0]] = true
			case ep.Serving:
				serving[ep.Addresses[0]] = true
			}
		}
	}
	if len(ready) > 0 {
		return len(ready)
	}
	return len(serving)
}

// weightedECMP reads an advertisement's WeightedECMPAnnotation; reason says why a value is not
// usable ("" when it is).
func weightedECMP(ad *metallbv1beta1.BGPAdvertisement) (on bool, reason string) {
	v, ok := ad.Annotations[WeightedECMPAnnotation]
	if !ok {
		return false, ""
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Sprintf("annotation %s: %q is not true or false; weighted ECMP off", WeightedECMPAnnotation, v)
	}
	return on, ""
}

// linkBWVote gathers what the advertisements of one prefix say about its link bandwidth: want when
// one of them asks for weighted ECMP, off when one of the Services behind it cannot be weighted
// (eTP=Cluster, or an aggregated prefix), endpoints the most ready local endpoints of one of them
// (Services sharing an IP with eTP=Local have the same pods, MetalLB's sharing rule).
type linkBWVote struct {
	want, off bool
	endpoints int
}

// holdLinkBandwidth limits how often a route's link bandwidth changes: endpoint churn (a rolling
// update moves the count pod by pod) would otherwise send an UPDATE per pod, and routers with route
// flap damping count attribute changes. A change of a route whose bandwidth last changed at least
// interval ago is sent at once (the leading edge); one that follows sooner is held: the route keeps
// the bandwidth it was sent with until interval after that change, when the newest value is sent.
// New and withdrawn routes are never held: only the weight of a route that stays is.
//
// It is pure: sent is what was handed to the speaker last (by prefix), changed when each route's
// bandwidth last changed (updated in place; entries of withdrawn routes are dropped). It returns
// the advertisements to hand over and, when some are held, the delay after which to decide again
// (0: none held).
func holdLinkBandwidth(want []bgp.Advertisement, sent map[netip.Prefix]bgp.Advertisement, changed map[netip.Prefix]time.Time,
	now time.Time, interval time.Duration) ([]bgp.Advertisement, time.Duration) {
	out := make([]bgp.Advertisement, len(want))
	var next time.Duration
	keep := make(map[netip.Prefix]bool, len(want))
	for i, a := range want {
		out[i] = a
		keep[a.Prefix] = true
		old, ok := sent[a.Prefix]
		if !ok || old.LinkBandwidth == a.LinkBandwidth {
			continue
		}
		if last, ok := changed[a.Prefix]; ok {
			if wait := last.Add(interval).Sub(now); wait > 0 {
				out[i].LinkBandwidth = old.LinkBandwidth
				if next == 0 || wait < next {
					next = wait
				}
				continue
			}
		}
		changed[a.Prefix] = now
	}
	for p := range changed {
		if !keep[p] {
			delete(changed, p)
		}
	}
	return out, next
}

// linkBWHolder is the BGPAnnouncer the Controller drives: it hands the routes on to the speaker
// through holdLinkBandwidth, and hands them again when a held change is due.
type linkBWHolder struct {
	BGPAnnouncer
	interval time.Duration
	now      func() time.Time
	log      hclog.Logger

	mu      sync.Mutex
	want    []bgp.Advertisement // the newest SetAdvertisements
	sent    map[netip.Prefix]bgp.Advertisement
	changed map[netip.Prefix]time.Time
	timer   *time.Timer
	stopped bool
}

func newLinkBWHolder(b BGPAnnouncer, interval time.Duration, log hclog.Logger) *linkBWHolder {
	if interval <= 0 {
		interval = DefaultLinkBandwidthInterval
	}
	return &linkBWHolder{BGPAnnouncer: b, interval: interval, now: time.Now, log: log,
		sent: map[netip.Prefix]bgp.Advertisement{}, changed: map[netip.Prefix]time.Time{}}
}

// SetAdvertisements hands ads on, with the link bandwidth changes that come too soon held.
func (h *linkBWHolder) SetAdvertisements(ads []bgp.Advertisement) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.want = ads
	return h.apply()
}

// apply hands h.want on and arms the timer for the next held change. Called with h.mu held, so
// the speaker gets the calls in order.
func (h *linkBWHolder) apply() error {
	if h.stopped {
		return h.BGPAnnouncer.SetAdvertisements(h.want) // the speaker refuses it
	}
	out, wait := holdLinkBandwidth(h.want, h.sent, h.changed, h.now(), h.interval)
	err := h.BGPAnnouncer.SetAdvertisements(out)
	clear(h.sent)
	for _, a := range out {
		h.sent[a.Prefix] = a
	}
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	if wait > 0 {
		h.timer = time.AfterFunc(wait, func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if err := h.apply(); err != nil {
				h.log.Warn("BGP advertisements (held link bandwidth changes)", "err", err)
			}
		})
	}
	return err
}

func (h *linkBWHolder) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	if h.timer != nil {
		h.timer.Stop()
	}
}

// Shutdown stops the held changes, then the speaker.
func (h *linkBWHolder) Shutdown(ctx context.Context, drain time.Duration) error {
	h.stop()
	return h.BGPAnnouncer.Shutdown(ctx, drain)
}

// Stop stops the held changes, then the speaker.
func (h *linkBWHolder) Stop(ctx context.Context) error {
	h.stop()
	return h.BGPAnnouncer.Stop(ctx)
}
