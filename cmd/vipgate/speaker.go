package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/cluster/mlbstatus"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/l2"
	"github.com/vipgate/vipgate/speaker"
)

// eventer records a Kubernetes Event (cluster.KubeSource implements it).
type eventer interface {
	Event(ref *corev1.ObjectReference, eventType, reason, message string)
}

// setEventer gives the speaker the Kubernetes source (called before the source runs). Besides
// Events, the source then also watches this speaker's pods in vipgate's namespace (POD_NAMESPACE),
// unless the members come from the config: a node is a member while a node agent pod is scheduled on
// it (State.SpeakerNodes), not merely because it is a Node.
func (s *l2Speaker) setEventer(e eventer) {
	s.mu.Lock()
	s.events = e
	s.mu.Unlock()
	s.startStatusWriter(e)
	pw, ok := e.(podWatcher)
	if !ok || !s.watchPods || s.fixedPeers != nil || s.mem == nil {
		return
	}
	ns := os.Getenv(podNamespaceEnv)
	if ns == "" {
		s.log.Warn("POD_NAMESPACE is not set: the L2 members are every Node, including nodes that run no speaker " +
			"(set it from the downward API, as deploy/ does, or list speaker.members)")
		return
	}
	if err := pw.WatchSpeakerPods(ns, s.podSelector); err != nil {
		s.log.Error("not watching the speaker pods: the L2 members are every Node", "err", err)
	}
}

// podWatcher is the Kubernetes source's pod watch (cluster.KubeSource.WatchSpeakerPods).
type podWatcher interface {
	WatchSpeakerPods(namespace, selector string) error
}

// announce records, once per start, that this node announces ip of svc (MetalLB's "nodeAssigned").
// Called with s.mu held.
func (s *l2Speaker) announce(now map[string]bool, mode string, d speaker.VIPDecision, detail string) {
	key := mode + " " + d.IP.String()
	now[key] = true
	if s.announced[key] || s.events == nil {
		return
	}
	ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: d.Service.Namespace, Name: d.Service.Name}
	s.events.Event(ref, corev1.EventTypeNormal, "nodeAssigned", fmt.Sprintf("announcing %s from node %q with protocol %q%s", d.IP, s.self, mode, detail))
}

// nodeSpeaker announces this node's LoadBalancer IPs (L2 or BGP). Update is called after every
// successful dataplane sync with the snapshot it programmed.
type nodeSpeaker interface {
	Update(st *cluster.State, rep *dataplane.SyncReport)
	Stop()
}

// memberPort is --member-port: the UDP port of the speakers' membership heartbeats. 0 (the
// default) takes the config's speaker.memberPort, else speaker.DefaultMemberPort.
var memberPort int

// memberKeyFile is --member-key-file: the keys that authenticate the membership heartbeats, one per
// line (over the config's speaker.memberKeyFile). memberInsecure is --member-insecure: run without.
var (
	memberKeyFile  string
	memberInsecure bool
)

// memberKeyReload is how often the key file is read again, so that a rotated Secret (the kubelet
// updates the mounted file) takes effect without a restart.
const memberKeyReload = 10 * time.Second

// bgpDrain is --bgp-shutdown-drain: on SIGTERM, announce the routes with the GRACEFUL_SHUTDOWN
// community and local-pref 0 for this long, then withdraw them. 0 keeps them (a restart: routers
// with graceful restart keep forwarding until vipgate is back).
var bgpDrain time.Duration

// speakerResync is how often the L2 side re-applies its decisions without a change, so that a
// failed interface (missing, or its socket broken) is retried.
const speakerResync = 5 * time.Second

// startSpeaker starts the speakers of `vipgate node` (see newSpeaker).
func startSpeaker(ctx context.Context, cfg *cluster.NodeConfig, log hclog.Logger) (nodeSpeaker, error) {
	s, err := newSpeaker(ctx, cfg.NodeName, cfg.NodeIPs, cfg.Speaker, log)
	if err != nil {
		return nil, err
	}
	// A node's members are the nodes that run vipgate (a gateway's are its configured group).
	s.watchPods = true
	return s, nil
}

// newSpeaker starts the speakers: membership heartbeats among the members (speaker.members, else
// the Nodes of the State), ARP/NDP answers for the LoadBalancer IPs this host owns
// (speaker.DecideL2), and BGP once the State has BGPPeers for this host. The l2 and membership
// metrics go to nodeRegistry(). It needs only a name, the host's IPs and the speaker section, so a
// gateway can run it as well as a node.
func newSpeaker(ctx context.Context, name string, ips []netip.Addr, sc cluster.SpeakerConfig, log hclog.Logger) (*l2Speaker, error) {
	log = log.Named("speaker")
	keyFile := cmp.Or(memberKeyFile, sc.MemberKeyFile)
	insecure := (memberInsecure || sc.Insecure) && keyFile == ""
	var keys [][]byte
	if keyFile != "" {
		var err error
		if keys, err = readMemberKeys(keyFile); err != nil {
			return nil, err
		}
	}
	ann, err := l2.New(log.Named("l2"), nodeRegistry(), l2.Options{})
	if err != nil {
		return nil, err
	}
	if err := speaker.RegisterOwnerMetrics(nodeRegistry()); err != nil {
		ann.Close()
		return nil, err
	}
	def := ""
	for _, ip := range ips {
		if ifname, err := l2.DefaultInterface(ip); err == nil {
			def = ifname
			break
		}
	}
	s := &l2Speaker{log: log, self: name, ann: ann, defIface: def, problems: map[string]string{},
		podSelector: sc.PodSelector, owners: speaker.NewOwnerCache()}
	for _, ip := range ips {
		if ip.Is4() {
			s.routerID = ip
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	s.ctx = ctx
	mem, err := speaker.NewMembers(log.Named("members"), name, speaker.MemberOptions{
		Port:              cmp.Or(memberPort, sc.MemberPort),
		HeartbeatInterval: sc.HeartbeatInterval,
		DeadAfter:         sc.DeadAfter,
		Keys:              keys,
		Insecure:          insecure,
		// The config's 0 means "every segment gossips"; MemberOptions' 0 means the default.
		DirectMembersLimit: speaker.DirectMembersLimitOption(sc.DirectMembersLimit),
		GossipFanout:       sc.GossipFanout,
	})
	switch {
	case errors.Is(err, speaker.ErrNoMemberKey):
		// The dataplane and BGP do not need the membership: refuse L2 alone, loudly, rather than
		// take the node's Service routing down with it.
		s.l2Disabled = "L2 mode refused: " + err.Error()
		log.Error("L2 announcements disabled: no membership key", "err", err)
	case err != nil:
		cancel()
		ann.Close()
		return nil, err
	default:
		if err := mem.RegisterMetrics(nodeRegistry()); err != nil {
			cancel()
			mem.Close()
			ann.Close()
			return nil, err
		}
		s.mem = mem
		if insecure {
			s.insecure = "membership heartbeats are not authenticated (--member-insecure): anyone on the LAN can steer which node answers for the VIPs"
			log.Warn(s.insecure)
		}
	}
	if len(sc.Members) > 0 {
		s.fixedPeers = map[string][]netip.Addr{}
		for _, m := range sc.Members {
			s.fixedPeers[m.Name] = []netip.Addr{m.Address}
		}
	}
	if s.mem != nil {
		s.mem.OnChange(s.recompute)
		go s.mem.Run(ctx)
		if keyFile != "" {
			go s.reloadKeys(ctx, keyFile, keys)
		}
	}
	go func() {
		t := time.NewTicker(speakerResync)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.recompute()
			}
		}
	}()
	return s, nil
}

// readMemberKeys reads a membership key file (speaker.ParseMemberKeys).
func readMemberKeys(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the membership key file: %w", err)
	}
	keys, err := speaker.ParseMemberKeys(data)
	if err != nil {
		return nil, fmt.Errorf("membership key file %s: %w", path, err)
	}
	return keys, nil
}

// reloadKeys reads the key file again every memberKeyReload and hands changed keys to the
// membership: a rotated Secret takes effect without a restart. A broken file keeps the old keys.
func (s *l2Speaker) reloadKeys(ctx context.Context, path string, keys [][]byte) {
	t := time.NewTicker(memberKeyReload)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next, err := readMemberKeys(path)
		if err != nil {
			s.log.Error("keeping the previous membership keys", "err", err)
			continue
		}
		if slices.EqualFunc(keys, next, bytes.Equal) {
			continue
		}
		if err := s.mem.SetKeys(next); err != nil {
			s.log.Error("keeping the previous membership keys", "err", err)
			continue
		}
		keys = next
		s.log.Info("membership keys reloaded", "keys", len(keys))
	}
}

type l2Speaker struct {
	log  hclog.Logger
	self string
	// mem is nil when L2 is refused (l2Disabled says why).
	mem        *speaker.Members
	l2Disabled string
	// insecure is the warning shown in /status when the membership runs without a key.
	insecure string
	ann      *l2.Announcer
	defIface string
	cancel   context.CancelFunc
	// fixedPeers are the members from the config (nil: the Nodes of the State that run a speaker).
	fixedPeers map[string][]netip.Addr
	// podSelector is speaker.podSelector (the node agent's pods, with the Kubernetes source);
	// watchPods is set for a node (not a gateway).
	podSelector string
	watchPods   bool

	routerID netip.Addr

	mu sync.Mutex
	st *cluster.State
	// segments are the L2 segments of st (speaker.L2Segments); owners keeps the VIPs' owners
	// between decisions (DecideL2 hashes only what a membership change touches).
	segments  []speaker.L2Segment
	owners    *speaker.OwnerCache
	switching bool
	decisions []speaker.VIPDecision
	lastErr   string
	// problems are the configuration problems already logged (IP -> reason), so each is logged once.
	problems map[string]string
	// alone is set once "no other members known" has been logged.
	alone bool

	// events records Kubernetes Events (nil with the file source); announced remembers which
	// (mode, IP) this node already told about, so each start of an announcement is one Event.
	events    eventer
	announced map[string]bool

	// The BGP side starts with the first State that has BGPPeers for this node.
	bgp          *bgp.Speaker
	bgpDecisions []speaker.VIPDecision
	bgpProblems  map[string]string

	// status writes MetalLB's ServiceL2Status, ServiceBGPStatus and ConfigurationState (nil with
	// the file source: `vipgate status` shows the same); bgpPeers are the BGPPeers each Service is
	// advertised to (speaker.AdvertisedPeers).
	ctx      context.Context
	status   *mlbstatus.Writer
	bgpPeers map[cluster.ServiceKey][]string
}

// startStatusWriter starts the writer of MetalLB's status resources when the source is the
// Kubernetes API and vipgate's namespace is known (POD_NAMESPACE): they live there, as MetalLB's
// live in its own. It never blocks the speaker: the writer works from the last state handed over.
func (s *l2Speaker) startStatusWriter(e eventer) {
	rc, ok := e.(interface{ RESTConfig() *rest.Config })
	ns := os.Getenv(podNamespaceEnv)
	if !ok || ns == "" || s.ctx == nil {
		return
	}
	w, err := mlbstatus.New(rc.RESTConfig(), mlbstatus.Options{Namespace: ns, Component: mlbstatus.Speaker, Node: s.self,
		PodSelector: cmp.Or(s.podSelector, cluster.DefaultSpeakerPodSelector)}, s.log.Named("mlbstatus"))
	if err != nil {
		s.log.Error("not writing MetalLB's status resources", "err", err)
		return
	}
	go w.Run(s.ctx)
	s.mu.Lock()
	s.status = w
	s.publishStatus()
	s.mu.Unlock()
}

// publishStatus hands the writer what this node announces and the configuration problems it sees.
// Called with s.mu held.
func (s *l2Speaker) publishStatus() {
	if s.status == nil || s.st == nil {
		return
	}
	svcs := map[types.NamespacedName]mlbstatus.ServiceStatus{}
	for k, ifs := range speaker.AnnouncedInterfaces(s.decisions) {
		key := types.NamespacedName{Namespace: k.Namespace, Name: k.Name}
		svcs[key] = mlbstatus.ServiceStatus{Interfaces: ifs, Peers: svcs[key].Peers}
	}
	for k, peers := range s.bgpPeers {
		key := types.NamespacedName{Namespace: k.Namespace, Name: k.Name}
		svcs[key] = mlbstatus.ServiceStatus{Interfaces: svcs[key].Interfaces, Peers: peers}
	}
	// The L2 owners of each Service's IPs (a dual-stack Service may have two): the node announcing
	// it removes the others' ServiceL2Status, but not theirs.
	for _, d := range s.decisions {
		key := types.NamespacedName{Namespace: d.Service.Namespace, Name: d.Service.Name}
		if st, ok := svcs[key]; ok && d.Owner != "" && !slices.Contains(st.L2Owners, d.Owner) {
			st.L2Owners = append(st.L2Owners, d.Owner)
			slices.Sort(st.L2Owners)
			svcs[key] = st
		}
	}
	problems := map[string]string{}
	for _, r := range s.st.Rejected {
		problems[r.Kind+" "+r.Object] = r.Reason
	}
	for o, r := range s.bgpProblems {
		problems[o] = r
	}
	for k, r := range s.problems {
		ip, svc, _ := strings.Cut(k, " ")
		problems["Service "+svc+" IP "+ip] = r
	}
	s.status.SetSpeaker(svcs, mlbstatus.ProblemLines(problems))
}

func (s *l2Speaker) Update(st *cluster.State, _ *dataplane.SyncReport) {
	peers := s.fixedPeers
	if peers == nil {
		peers = nodeMembers(st)
	}
	// The segments: which speakers vote on which VIPs. This node always runs a speaker.
	names := []string{s.self}
	for n := range peers {
		names = append(names, n)
	}
	segs := speaker.L2Segments(st, names)
	if segs == nil {
		segs = []speaker.L2Segment{} // no L2 pool: no membership (nil would mean "one for all")
	}
	// The State, its segments and the membership's views of them must change together: a decision
	// from new segments and old views (or the reverse) would drop this node's VIPs for an instant.
	// Decisions wait (switching) until the membership has the new segments, then run once.
	s.mu.Lock()
	s.st = st
	s.segments = segs
	s.switching = true
	s.mu.Unlock()
	if s.mem != nil {
		s.mem.SetSegments(peers, speaker.SegmentsOf(segs, s.self))
		// Now this node can answer: tell the others (a no-op after the first State).
		s.mem.SetWilling(true)
	}
	s.mu.Lock()
	s.switching = false
	s.mu.Unlock()
	s.recompute()
	s.updateBGP(st)
}

// nodeMembers lists the Nodes of the State that run a speaker as members (every Node when the
// source does not know the speaker pods): heartbeats go to the first IPv4 address (else the first
// address) and are accepted from any of them.
func nodeMembers(st *cluster.State) map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	for name, n := range st.Nodes {
		if st.SpeakerNodes != nil && !st.SpeakerNodes[name] {
			continue
		}
		addrs := slices.Clone(n.Addresses)
		slices.SortStableFunc(addrs, func(a, b netip.Addr) int { return cmp.Compare(a.BitLen(), b.BitLen()) })
		if len(addrs) > 0 {
			out[name] = addrs
		}
	}
	return out
}

// updateBGP programs the BGP sessions and routes the State asks of this node.
func (s *l2Speaker) updateBGP(st *cluster.State) {
	peers, ads, decisions, problems := speaker.DecideBGP(speaker.BGPInput{Self: s.self, State: st})
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bgpDecisions = decisions
	s.bgpPeers = speaker.AdvertisedPeers(s.self, peers, ads, decisions)
	defer s.publishStatus()
	seen := map[string]string{}
	for _, p := range problems {
		seen[p.Object] = p.Reason
		if s.bgpProblems[p.Object] != p.Reason {
			reason, msg := "Rejected", "rejected"
			if p.Accepted {
				// In use, a field ignored: never silent (log, Event, ConfigurationState).
				reason, msg = "Unsupported", "accepted with an unsupported field"
			}
			s.log.Warn(msg, "object", p.Object, "reason", p.Reason)
			if kind, nsName, ok := strings.Cut(p.Object, " "); ok && s.events != nil {
				ns, name, _ := strings.Cut(nsName, "/")
				apiVersion := "metallb.io/v1beta1"
				if kind == "BGPPeer" {
					apiVersion = "metallb.io/v1beta2"
				}
				s.events.Event(&corev1.ObjectReference{APIVersion: apiVersion, Kind: kind, Namespace: ns, Name: name},
					corev1.EventTypeWarning, reason, p.Reason)
			}
		}
	}
	now := map[string]bool{}
	for _, d := range decisions {
		if d.Owner == s.self {
			peerNames := make([]string, 0, len(peers))
			for _, p := range peers {
				peerNames = append(peerNames, p.Name)
			}
			s.announce(now, "bgp", d, " to peers "+strings.Join(peerNames, ", "))
		}
	}
	for k := range s.announced {
		if strings.HasPrefix(k, "bgp ") && !now[k] {
			delete(s.announced, k)
		}
	}
	if s.announced == nil {
		s.announced = map[string]bool{}
	}
	for k := range now {
		s.announced[k] = true
	}
	s.bgpProblems = seen
	if s.bgp == nil {
		if len(peers) == 0 {
			return
		}
		if !s.routerID.IsValid() {
			s.log.Error("BGP needs an IPv4 node IP as router ID; not peering")
			return
		}
		b, err := bgp.New(s.log.Named("bgp"), nodeRegistry(), s.routerID, -1)
		if err != nil {
			s.log.Error("starting BGP", "err", err)
			return
		}
		s.bgp = b
	}
	// Routes first, then sessions: a restarted speaker then announces everything in its first
	// UPDATEs after graceful restart, and the routers see no flap.
	if err := s.bgp.SetAdvertisements(ads); err != nil {
		s.log.Warn("BGP advertisements", "err", err)
	}
	if err := s.bgp.SetPeers(peers); err != nil {
		s.log.Warn("BGP peers", "err", err)
	}
}

// recompute decides again and hands the result to the ARP/NDP responder. It runs on every State, on
// every membership change and every speakerResync.
func (s *l2Speaker) recompute() {
	links := hostLinks()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == nil || s.switching {
		return
	}
	var view speaker.View
	var segViews map[uint64]speaker.View
	if s.mem != nil {
		view = s.mem.View()
		segViews = s.mem.SegmentViews()
	}
	if s.mem != nil && view.Total == 1 && !s.alone && len(s.st.Nodes) <= 1 && s.fixedPeers == nil {
		s.alone = true
		s.log.Warn("no other speakers known (no Node objects and no speaker.members): this node announces alone; " +
			"run every speaker with the same member list, or each one answers for every IP")
	}
	owned, decisions := speaker.DecideL2(speaker.L2Input{Self: s.self, Links: links, DefaultInterface: s.defIface,
		State: s.st, Segments: s.segments, SegmentViews: segViews, Owners: s.owners})
	if s.mem == nil {
		for i := range decisions {
			if decisions[i].Reason == "" || decisions[i].Owner == "" {
				decisions[i].Reason = s.l2Disabled
			}
		}
	}
	s.decisions = decisions
	s.logProblems(decisions)
	defer s.publishStatus()
	now := map[string]bool{}
	for _, d := range decisions {
		if d.Owner == s.self && len(d.Interfaces) > 0 {
			s.announce(now, "layer2", d, "")
		}
	}
	for k := range s.announced {
		if strings.HasPrefix(k, "layer2 ") && !now[k] {
			delete(s.announced, k)
		}
	}
	if s.announced == nil {
		s.announced = map[string]bool{}
	}
	for k := range now {
		s.announced[k] = true
	}
	// Answer on every interface DecideL2 chose; announce takeovers on its preferred ones only.
	where := make(map[netip.Addr]l2.Where, len(owned))
	for _, d := range decisions {
		if ifs, ok := owned[d.IP]; ok {
			where[d.IP] = l2.Where{Answer: ifs, Announce: d.Announce}
		}
	}
	if err := s.ann.SetOwnedWhere(where); err != nil {
		if e := err.Error(); e != s.lastErr {
			s.lastErr = e
			s.log.Warn("announcing LoadBalancer IPs", "err", err)
		}
	} else {
		s.lastErr = ""
	}
}

// logProblems logs each configuration problem of the L2 decisions once (and again only after it
// went away and came back). Called with s.mu held.
func (s *l2Speaker) logProblems(decisions []speaker.VIPDecision) {
	seen := map[string]bool{}
	for _, d := range decisions {
		if !d.Problem {
			continue
		}
		key := d.IP.String() + " " + d.Service.String()
		seen[key] = true
		if s.problems[key] != d.Reason {
			s.problems[key] = d.Reason
			s.log.Warn("LoadBalancer IP not announced by L2 as configured", "ip", d.IP, "service", d.Service, "reason", d.Reason)
		}
	}
	for k := range s.problems {
		if !seen[k] {
			delete(s.problems, k)
		}
	}
}

// hostLinks lists this host's interfaces that are up, with their prefixes and what decides whether
// they are one of "all interfaces" (l2.Interfaces), for speaker.DecideL2; nil if they cannot be
// listed (DecideL2 then falls back to the default interface).
func hostLinks() []speaker.Link {
	ifs, err := l2.Interfaces()
	if err != nil {
		return nil
	}
	links := make([]speaker.Link, 0, len(ifs))
	for _, i := range ifs {
		links = append(links, speaker.Link{Name: i.Name, Prefixes: i.Prefixes, Master: i.Master, NoARP: i.NoARP})
	}
	return links
}

// VIPs reports every LoadBalancer IP and its L2 owner for /status.
func (s *l2Speaker) VIPs() []VIPStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]VIPStatus, 0, len(s.decisions)+len(s.bgpDecisions))
	for _, d := range s.decisions {
		out = append(out, VIPStatus{IP: d.IP.String(), Service: d.Service.String(), Mode: "l2", Announcer: d.Owner,
			Announced: d.Owner == s.self && len(d.Interfaces) > 0, Reason: d.Reason})
	}
	var peers []string
	if s.bgp != nil {
		for _, p := range s.bgp.Status() {
			peers = append(peers, fmt.Sprintf("%s %s (%s)", p.Name, p.Address, p.State))
		}
	}
	for _, d := range s.bgpDecisions {
		out = append(out, VIPStatus{IP: d.IP.String(), Service: d.Service.String(), Mode: "bgp", Announcer: d.Owner,
			Announced: d.Owner == s.self, Peers: peers, Reason: d.Reason})
	}
	return out
}

// Warnings lists what /status should show about the speaker as a whole.
func (s *l2Speaker) Warnings() []string {
	var out []string
	for _, w := range []string{s.l2Disabled, s.insecure} {
		if w != "" {
			out = append(out, w)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var bgp []string
	for o, r := range s.bgpProblems {
		bgp = append(bgp, o+": "+r)
	}
	slices.Sort(bgp)
	return append(out, bgp...)
}

func (s *l2Speaker) Stop() {
	s.cancel()
	if s.mem != nil {
		s.mem.Close()
	}
	s.ann.Close()
	s.mu.Lock()
	b := s.bgp
	s.mu.Unlock()
	if b != nil {
		ctx, cancel := context.WithTimeout(context.Background(), bgpDrain+10*time.Second)
		defer cancel()
		if bgpDrain > 0 {
			s.log.Info("BGP graceful shutdown: draining, then withdrawing", "drain", bgpDrain)
			_ = b.Shutdown(ctx, bgpDrain)
		} else {
			_ = b.Stop(ctx)
		}
	}
}
