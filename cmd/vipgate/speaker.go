package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"net/netip"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
	"github.com/vipgate/vipgate/cluster/mlbstatus"
	"github.com/vipgate/vipgate/dataplane"
	"github.com/vipgate/vipgate/keyreload"
	"github.com/vipgate/vipgate/l2"
	"github.com/vipgate/vipgate/membership"
	"github.com/vipgate/vipgate/speaker"
)

// This file wires the speaker: the real l2 announcer, BGP speaker, membership and status writer
// around speaker.Controller, which decides and drives them (speaker/controller.go).

// eventer records a Kubernetes Event (cluster.KubeSource implements it).
type eventer interface {
	Event(ref *corev1.ObjectReference, eventType, reason, message string)
}

// podWatcher is the Kubernetes source's pod watch (cluster.KubeSource.WatchSpeakerPods).
type podWatcher interface {
	WatchSpeakerPods(namespace, selector string) error
}

// nodeSpeaker announces this node's LoadBalancer IPs (L2 or BGP). Update is called after every
// successful dataplane sync with the snapshot it programmed.
type nodeSpeaker interface {
	Update(st *cluster.State, rep *dataplane.SyncReport)
	Stop()
}

// speakerFlags are the speaker's command-line flags (addFlags).
type speakerFlags struct {
	// MemberPort is --member-port: the UDP port of the speakers' membership heartbeats. 0 takes the
	// config's speaker.memberPort, else membership.DefaultPort.
	MemberPort int
	// MemberKeyFile is --member-key-file: the keys that authenticate the membership heartbeats, one
	// per line (over the config's speaker.memberKeyFile). MemberInsecure is --member-insecure: run
	// without.
	MemberKeyFile  string
	MemberInsecure bool
	// BGPDrain is --bgp-shutdown-drain: on SIGTERM, announce the routes with the GRACEFUL_SHUTDOWN
	// community and local-pref 0 for this long, then withdraw them. 0 keeps them (a restart:
	// routers with graceful restart keep forwarding until vipgate is back).
	BGPDrain time.Duration
	// LinkHoldDown is --l2-link-hold-down: how long an interface that lost its link must stay up
	// again before this node takes back the L2 VIPs announced on it (0: speaker.DefaultLinkHoldDown).
	LinkHoldDown time.Duration
}

// addFlags defines the speaker's flags on fs, into f.
func (f *speakerFlags) addFlags(fs *flag.FlagSet) {
	fs.DurationVar(&f.BGPDrain, "bgp-shutdown-drain", f.BGPDrain, "on SIGTERM, advertise routes with GRACEFUL_SHUTDOWN and local-pref 0 for this long, then withdraw (0: keep them for graceful restart)")
	fs.IntVar(&f.MemberPort, "member-port", f.MemberPort, "UDP port of the speakers' membership heartbeats, the same on every node (0: the config's speaker.memberPort, else 7473)")
	fs.StringVar(&f.MemberKeyFile, "member-key-file", f.MemberKeyFile, "file of the keys that authenticate the membership heartbeats, one per line: the first signs, any verifies (over the config's speaker.memberKeyFile); without one L2 announcements are refused")
	fs.BoolVar(&f.MemberInsecure, "member-insecure", f.MemberInsecure, "run the L2 membership without a key (labs only: anyone on the LAN can steer it)")
	fs.DurationVar(&f.LinkHoldDown, "l2-link-hold-down", f.LinkHoldDown, "how long an interface whose link went down must be up again before this node takes back the L2 VIPs announced on it (0: 3s)")
}

// memberKeyReload is how often the key file is read again, so that a rotated Secret (the kubelet
// updates the mounted file) takes effect without a restart.
const memberKeyReload = 10 * time.Second

// speakerResync is how often the L2 side re-applies its decisions without a change, so that a
// failed interface (missing, or its socket broken) is retried.
const speakerResync = 5 * time.Second

// speakerDrainTimeout bounds the L2 drain on Stop (speaker.DefaultL2DrainOverlap, and margin).
const speakerDrainTimeout = 3 * time.Second

// speakerOptions is everything newSpeakerWith needs.
type speakerOptions struct {
	// Name is the node's (or gateway's) name, IPs its addresses (the last IPv4 one is the BGP
	// router ID, as in every earlier version: changing it would reset sessions on upgrade; the
	// default interface is the one of the first that has one).
	Name   string
	IPs    []netip.Addr
	Config cluster.SpeakerConfig
	Flags  speakerFlags
	// WatchPods makes setEventer watch the speaker pods for the members (a node, not a gateway);
	// PodNamespace is vipgate's namespace (POD_NAMESPACE), where they and the status resources live.
	WatchPods    bool
	PodNamespace string
	// Registry takes the l2, membership, owner and BGP metrics (nodeRegistry() if nil).
	Registry prometheus.Registerer
}

// startSpeakerWith starts the speakers of `vipgate node` (see newSpeakerWith).
func startSpeakerWith(ctx context.Context, cfg *cluster.NodeConfig, f speakerFlags, log hclog.Logger) (nodeSpeaker, error) {
	// A node's members are the nodes that run vipgate (a gateway's are its configured group).
	return newSpeakerWith(ctx, speakerOptions{Name: cfg.NodeName, IPs: cfg.NodeIPs, Config: cfg.Speaker, Flags: f,
		WatchPods: true, PodNamespace: os.Getenv(podNamespaceEnv)}, log)
}

// memberSettings resolves the membership's key file and insecure mode: the flag over the config,
// and insecure only without a key file.
func memberSettings(f speakerFlags, sc cluster.SpeakerConfig) (keyFile string, insecure bool) {
	keyFile = cmp.Or(f.MemberKeyFile, sc.MemberKeyFile)
	return keyFile, (f.MemberInsecure || sc.Insecure) && keyFile == ""
}

// newSpeakerWith starts the speakers: membership heartbeats among the members (speaker.members, else
// the Nodes of the State), ARP/NDP answers for the LoadBalancer IPs this host owns, and BGP once the
// State has BGPPeers for this host — speaker.Controller decides, this wires l2, bgp and the
// membership into it. It needs only a name, the host's IPs and the speaker section, so a gateway
// can run it as well as a node.
func newSpeakerWith(ctx context.Context, o speakerOptions, log hclog.Logger) (*l2Speaker, error) {
	log = log.Named("speaker")
	sc := o.Config
	var reg prometheus.Registerer = nodeRegistry()
	if o.Registry != nil {
		reg = o.Registry
	}
	keyFile, insecure := memberSettings(o.Flags, sc)
	var keys [][]byte
	if keyFile != "" {
		var err error
		if keys, err = readMemberKeys(keyFile); err != nil {
			return nil, err
		}
	}
	// speaker.gratuitousARPInterval: MetalLB v0.16.2's periodic gratuitous ARP / unsolicited NA.
	ann, err := l2.New(log.Named("l2"), reg, l2.Options{Periodic: sc.GratuitousARPInterval})
	if err != nil {
		return nil, err
	}
	if err := speaker.RegisterOwnerMetrics(reg); err != nil {
		ann.Close()
		return nil, err
	}
	s := &l2Speaker{log: log, self: o.Name, podSelector: sc.PodSelector, watchPods: o.WatchPods, podNamespace: o.PodNamespace}
	// Link-aware ownership: hostLinkStates on every netlink link update (watched below) and resync.
	copts := speaker.ControllerOptions{Self: o.Name, Log: log, L2: l2Adapter{ann}, Links: hostLinks, BGPDrain: o.Flags.BGPDrain,
		Resync: speakerResync, LinkStates: hostLinkStates, LinkHoldDown: o.Flags.LinkHoldDown}
	for _, ip := range o.IPs {
		if ifname, err := l2.DefaultInterface(ip); err == nil {
			copts.DefaultInterface = ifname
			break
		}
	}
	for _, ip := range o.IPs {
		if ip.Is4() {
			copts.RouterID = ip
		}
	}
	copts.NewBGP = func(id netip.Addr) (speaker.BGPAnnouncer, error) {
		b, err := bgp.New(log.Named("bgp"), reg, id, -1)
		if err != nil {
			return nil, err
		}
		return b, nil
	}
	mem, err := membership.New(log.Named("members"), o.Name, membership.Options{
		Port:              cmp.Or(o.Flags.MemberPort, sc.MemberPort),
		HeartbeatInterval: sc.HeartbeatInterval,
		DeadAfter:         sc.DeadAfter,
		Keys:              keys,
		Insecure:          insecure,
		// The config's 0 means "every segment gossips"; Options' 0 means the default.
		DirectMembersLimit: membership.DirectMembersLimitOption(sc.DirectMembersLimit),
		GossipFanout:       sc.GossipFanout,
		// Agents that start together (docs/migration.md, step 3a) hear each other before either
		// announces alone: the IPs never visit a node that is not their owner.
		StartupGrace: membership.DefaultStartupGrace,
	})
	switch {
	case errors.Is(err, membership.ErrNoKey):
		// The dataplane and BGP do not need the membership: refuse L2 alone, loudly, rather than
		// take the node's Service routing down with it.
		copts.L2Disabled = "L2 mode refused: " + err.Error()
		log.Error("L2 announcements disabled: no membership key", "err", err)
	case err != nil:
		ann.Close()
		return nil, err
	default:
		if err := mem.RegisterMetrics(reg); err != nil {
			mem.Close()
			ann.Close()
			return nil, err
		}
		s.mem = mem
		copts.Members = speakerMembership{mem}
		if insecure {
			copts.Insecure = "membership heartbeats are not authenticated (--member-insecure): anyone on the LAN can steer which node answers for the VIPs"
			log.Warn(copts.Insecure)
		}
	}
	if len(sc.Members) > 0 {
		copts.FixedPeers = map[string][]netip.Addr{}
		for _, m := range sc.Members {
			copts.FixedPeers[m.Name] = []netip.Addr{m.Address}
		}
		s.fixedPeers = true
	}
	s.ctrl = speaker.NewController(copts)
	// Not ended by the caller's ctx (SIGTERM): the membership must keep sending heartbeats through
	// the drain in Stop, until Stop ends it.
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.ctx, s.cancel = ctx, cancel
	if s.mem != nil {
		s.mem.OnChange(s.ctrl.Recompute)
		// Link updates from the kernel: an announcing interface that loses its link withdraws this
		// node from its L2 segments at once (the resync reads the links too, should this fail).
		if err := l2.WatchLinks(ctx, s.ctrl.LinkUpdate, func(msg string, err error) { log.Warn(msg, "err", err) }); err != nil {
			log.Error("not watching link updates: link state is read every resync only", "err", err)
		}
		go s.mem.Run(ctx)
		if keyFile != "" {
			// The key file again every memberKeyReload: a rotated Secret takes effect without
			// a restart; a broken file keeps the old keys.
			reload := keyreload.Reloader{Path: keyFile, Period: memberKeyReload, Read: readMemberKeys, Apply: s.mem.SetKeys,
				Log: s.log, Failed: "keeping the previous membership keys", Reloaded: "membership keys reloaded"}
			go reload.Run(ctx, keys)
		}
	}
	go s.ctrl.Run(ctx)
	return s, nil
}

// l2Adapter is the l2.Announcer as the speaker.Controller's L2Announcer.
type l2Adapter struct{ a *l2.Announcer }

func (a l2Adapter) SetOwned(owned map[netip.Addr]speaker.L2Where) error {
	where := make(map[netip.Addr]l2.Where, len(owned))
	for ip, w := range owned {
		where[ip] = l2.Where{Answer: w.Answer, Announce: w.Announce}
	}
	return a.a.SetOwnedWhere(where)
}

func (a l2Adapter) Close() error { return a.a.Close() }

// speakerMembership is the membership protocol as the speaker.Controller's Membership. The speaker
// declares what it reads (speaker.View: the candidates and the member count) and never imports
// membership, so this is where the two meet: the membership's views of the segments (keyed by its
// wire digest) go to the speaker by the speaker's key, the segment's members.
type speakerMembership struct{ *membership.Members }

var _ speaker.Membership = speakerMembership{}

func (m speakerMembership) View() speaker.View { return speakerView(m.Members.View()) }

func (m speakerMembership) SegmentViews() map[string]speaker.View {
	vs := m.Members.SegmentViews()
	out := make(map[string]speaker.View, len(vs))
	for _, v := range vs {
		out[speaker.SegmentKey(v.Members)] = speakerView(v)
	}
	return out
}

// speakerView is what the speaker reads of a membership.View (its maps are already copies).
func speakerView(v membership.View) speaker.View {
	return speaker.View{Candidates: v.Candidates, Total: v.Total}
}

// l2Speaker is the speaker of a node or gateway: speaker.Controller with the real announcers, the
// membership and the Kubernetes side (Events, pod watch, status resources) wired in.
type l2Speaker struct {
	log  hclog.Logger
	self string
	ctrl *speaker.Controller
	// mem is nil when L2 is refused (the gateway's conntrack sync reads its View too).
	mem    *membership.Members
	ctx    context.Context
	cancel context.CancelFunc
	// fixedPeers says the members come from the config (speaker.members), not the pods.
	fixedPeers bool
	// podSelector is speaker.podSelector (the node agent's pods, with the Kubernetes source);
	// watchPods is set for a node (not a gateway); podNamespace is POD_NAMESPACE.
	podSelector  string
	watchPods    bool
	podNamespace string
}

// setEventer gives the speaker the Kubernetes source (called before the source runs). Besides
// Events, the source then also watches this speaker's pods in vipgate's namespace (POD_NAMESPACE),
// unless the members come from the config: a node is a member while a node agent pod is scheduled on
// it (State.SpeakerNodes), not merely because it is a Node.
func (s *l2Speaker) setEventer(e eventer) {
	s.ctrl.SetEvents(e)
	s.startStatusWriter(e)
	pw, ok := e.(podWatcher)
	if !ok || !s.watchPods || s.fixedPeers || s.mem == nil {
		return
	}
	if s.podNamespace == "" {
		s.log.Warn("POD_NAMESPACE is not set: the L2 members are every Node, including nodes that run no speaker " +
			"(set it from the downward API, as deploy/ does, or list speaker.members)")
		return
	}
	if err := pw.WatchSpeakerPods(s.podNamespace, s.podSelector); err != nil {
		s.log.Error("not watching the speaker pods: the L2 members are every Node", "err", err)
	}
}

// startStatusWriter starts the writer of MetalLB's status resources when the source is the
// Kubernetes API and vipgate's namespace is known (POD_NAMESPACE): they live there, as MetalLB's
// live in its own. It never blocks the speaker: the writer works from the last state handed over.
func (s *l2Speaker) startStatusWriter(e eventer) {
	rc, ok := e.(interface{ RESTConfig() *rest.Config })
	if !ok || s.podNamespace == "" || s.ctx == nil {
		return
	}
	w, err := mlbstatus.New(rc.RESTConfig(), mlbstatus.Options{Namespace: s.podNamespace, Component: mlbstatus.Speaker, Node: s.self,
		PodSelector: cmp.Or(s.podSelector, cluster.DefaultSpeakerPodSelector)}, s.log.Named("mlbstatus"))
	if err != nil {
		s.log.Error("not writing MetalLB's status resources", "err", err)
		return
	}
	go w.Run(s.ctx)
	s.ctrl.SetStatus(w)
}

// Update hands the controller the State the dataplane programmed.
func (s *l2Speaker) Update(st *cluster.State, _ *dataplane.SyncReport) { s.ctrl.Update(st) }

// VIPs reports every LoadBalancer IP and its L2 owner for /status.
func (s *l2Speaker) VIPs() []VIPStatus {
	vs := s.ctrl.VIPs()
	out := make([]VIPStatus, 0, len(vs))
	for _, v := range vs {
		out = append(out, VIPStatus{IP: v.IP.String(), Service: v.Service.String(), Mode: v.Mode, Announcer: v.Announcer,
			Announced: v.Announced, Peers: v.Peers, Reason: v.Reason})
	}
	return out
}

// Warnings lists what /status should show about the speaker as a whole.
func (s *l2Speaker) Warnings() []string { return s.ctrl.Warnings() }

// Stop drains L2 first (the other members take this node's VIPs over while it still answers them:
// speaker.Controller.Drain), then stops the membership, the ARP/NDP answers and BGP (draining with
// --bgp-shutdown-drain).
func (s *l2Speaker) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), speakerDrainTimeout)
	s.ctrl.Drain(ctx)
	cancel()
	s.cancel()
	if s.mem != nil {
		s.mem.Close()
	}
	s.ctrl.Stop()
}

// readMemberKeys reads a membership key file (membership.ReadKeyFile: a regular file, not
// readable by others, keys of at least 128 bits).
func readMemberKeys(path string) ([][]byte, error) {
	return membership.ReadKeyFile(path)
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

// hostLinkStates lists this host's interfaces with their link state (l2.LinkStates), for the
// speaker's link-aware ownership; nil if they cannot be listed (nothing is withdrawn for it).
func hostLinkStates() []speaker.LinkState {
	ls, err := l2.LinkStates()
	if err != nil {
		return nil
	}
	out := make([]speaker.LinkState, 0, len(ls))
	for _, l := range ls {
		out = append(out, speaker.LinkState{Name: l.Name, Up: l.Up, Prefixes: l.Prefixes})
	}
	return out
}
