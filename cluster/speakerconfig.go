package cluster

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// SpeakerConfig is the NodeConfig's `speaker` section: the membership protocol of the L2 speakers
// (see speaker/README.md). Every field has a default; most clusters set none.
type SpeakerConfig struct {
	// MemberPort is the UDP port of the membership heartbeats, the same on every node (0: 7473).
	MemberPort int
	// Members lists the speakers by name and address. Empty: the Nodes of the cluster (their first
	// IPv4 address, else their first address) — a manifest directory without Node objects needs it.
	Members []SpeakerMember
	// HeartbeatInterval is how often each speaker sends a heartbeat to every member (0: 100ms).
	HeartbeatInterval time.Duration
	// DeadAfter is how long a member may stay silent before its VIPs move (0: 400ms).
	DeadAfter time.Duration
	// MemberKeyFile holds the keys that authenticate the heartbeats, one per line (the first signs,
	// any verifies: two during a rotation), e.g. the vipgate-memberlist Secret mounted as a file.
	// --member-key-file overrides it.
	MemberKeyFile string
	// Insecure runs the membership without a key (labs only: anyone on the LAN can steer it).
	// Without a key and without Insecure, L2 announcements are refused.
	Insecure bool
	// PodSelector is the label selector of vipgate's node agent pods in its own namespace
	// (POD_NAMESPACE), with the Kubernetes source and no Members: a node is a member while such a
	// pod is scheduled on it. "": DefaultSpeakerPodSelector.
	PodSelector string
	// DirectMembersLimit is the largest L2 segment whose members heartbeat each other all-to-all;
	// a larger one gossips (bounded traffic per member, speaker/README.md "Scale"). nil: 128; 0:
	// every segment gossips.
	DirectMembersLimit *int
	// GossipFanout is to how many members a gossip round sends (0: 1).
	GossipFanout int
	// GratuitousARPInterval, when set, announces every VIP this node owns by L2 again at this
	// interval (gratuitous ARP, unsolicited NA), on the interfaces its takeover is announced on:
	// MetalLB v0.16.2's speaker flag --gratuitous-arp-interval (metallb#2910: a switch whose FDB
	// entry ages out before the router's ARP entry black-holes the VIP until the owner sends
	// something). 0 (the default, as in MetalLB): off; else 1s-1h.
	GratuitousARPInterval time.Duration
}

// Bounds of SpeakerConfig.GratuitousARPInterval.
const (
	minGratuitousARPInterval = time.Second
	maxGratuitousARPInterval = time.Hour
)

// Bounds of the gossip settings: an all-to-all heartbeat holds at most 7,320 members, and a
// fanout beyond 16 only multiplies the traffic.
const (
	maxDirectMembersLimit = 7000
	maxGossipFanout       = 16
)

// SpeakerMember is one entry of SpeakerConfig.Members.
type SpeakerMember struct {
	Name    string
	Address netip.Addr
}

// speakerConfigFile is the on-disk form of SpeakerConfig.
type speakerConfigFile struct {
	MemberPort        int                 `json:"memberPort"`
	Members           []speakerMemberFile `json:"members"`
	HeartbeatInterval string              `json:"heartbeatInterval"`
	DeadAfter         string              `json:"deadAfter"`
	MemberKeyFile     string              `json:"memberKeyFile"`
	Insecure          bool                `json:"insecure"`
	PodSelector       string              `json:"podSelector"`
	// DirectMembersLimit is a pointer: 0 (always gossip) differs from unset (128).
	DirectMembersLimit *int `json:"directMembersLimit"`
	GossipFanout       int  `json:"gossipFanout"`
	// GratuitousARPInterval is a Go duration ("30s").
	GratuitousARPInterval string `json:"gratuitousARPInterval"`
}

type speakerMemberFile struct {
	Name    string `json:"name"`
	Address string `json:"address"`
}

// parseSpeakerConfig converts the file form; Validate checks the values.
func parseSpeakerConfig(f *speakerConfigFile) (SpeakerConfig, error) {
	var c SpeakerConfig
	if f == nil {
		return c, nil
	}
	c.MemberPort = f.MemberPort
	c.MemberKeyFile, c.Insecure, c.PodSelector = f.MemberKeyFile, f.Insecure, f.PodSelector
	c.DirectMembersLimit, c.GossipFanout = f.DirectMembersLimit, f.GossipFanout
	var err error
	for _, d := range []struct {
		field string
		in    string
		out   *time.Duration
	}{{"speaker.heartbeatInterval", f.HeartbeatInterval, &c.HeartbeatInterval}, {"speaker.deadAfter", f.DeadAfter, &c.DeadAfter},
		{"speaker.gratuitousARPInterval", f.GratuitousARPInterval, &c.GratuitousARPInterval}} {
		if d.in == "" {
			continue
		}
		if *d.out, err = time.ParseDuration(d.in); err != nil {
			return c, fieldErr(d.field, "%q is not a duration (e.g. 100ms)", d.in)
		}
	}
	for i, m := range f.Members {
		a, err := parseIP(fmt.Sprintf("speaker.members[%d].address", i), m.Address)
		if err != nil {
			return c, err
		}
		c.Members = append(c.Members, SpeakerMember{Name: m.Name, Address: a})
	}
	return c, nil
}

// validate checks the speaker section; nodeName is this node's name, which must be a member when
// members are listed (a speaker that is not in its own list could never count itself).
func (c *SpeakerConfig) validate(nodeName string) error {
	if c.MemberPort < 0 || c.MemberPort > 65535 {
		return fmt.Errorf("speaker.memberPort: %d is not a port (1-65535, 0 for 7473)", c.MemberPort)
	}
	hb, dead := c.HeartbeatInterval, c.DeadAfter
	if hb == 0 {
		hb = 100 * time.Millisecond
	}
	if dead == 0 {
		dead = 400 * time.Millisecond
	}
	if hb < 10*time.Millisecond || hb > 10*time.Second {
		return fmt.Errorf("speaker.heartbeatInterval: %v is outside 10ms-10s", c.HeartbeatInterval)
	}
	// Fewer than two heartbeats per DeadAfter would declare a member dead on one lost datagram.
	if dead < 2*hb || dead > time.Minute {
		return fmt.Errorf("speaker.deadAfter: %v must be at least twice heartbeatInterval (%v) and at most 1m", dead, hb)
	}
	if l := c.DirectMembersLimit; l != nil && (*l < 0 || *l > maxDirectMembersLimit) {
		return fmt.Errorf("speaker.directMembersLimit: %d is outside 0-%d (0: every segment gossips; unset: 128)", *l, maxDirectMembersLimit)
	}
	if g := c.GratuitousARPInterval; g != 0 && (g < minGratuitousARPInterval || g > maxGratuitousARPInterval) {
		return fmt.Errorf("speaker.gratuitousARPInterval: %v is outside %v-%v (0 or unset: off)", g, minGratuitousARPInterval, maxGratuitousARPInterval)
	}
	if c.GossipFanout < 0 || c.GossipFanout > maxGossipFanout {
		return fmt.Errorf("speaker.gossipFanout: %d is outside 1-%d (0 or unset: 1)", c.GossipFanout, maxGossipFanout)
	}
	if c.PodSelector != "" {
		sel, err := labels.Parse(c.PodSelector)
		if err != nil {
			return fmt.Errorf("speaker.podSelector: %q is not a label selector: %w", c.PodSelector, err)
		}
		if sel.Empty() {
			return fmt.Errorf("speaker.podSelector: %q selects every pod of the namespace; give the node agent's labels (default %s)", c.PodSelector, DefaultSpeakerPodSelector)
		}
	}
	seen := map[string]bool{}
	addrs := map[netip.Addr]string{}
	self := false
	for i, m := range c.Members {
		field := fmt.Sprintf("speaker.members[%d]", i)
		if errs := validation.IsDNS1123Subdomain(m.Name); len(errs) > 0 {
			return fmt.Errorf("%s.name: %q is not a valid node name: %s", field, m.Name, strings.Join(errs, "; "))
		}
		if seen[m.Name] {
			return fmt.Errorf("%s.name: %q is listed twice", field, m.Name)
		}
		seen[m.Name] = true
		if other, ok := addrs[m.Address]; ok {
			return fmt.Errorf("%s.address: %s is also %q's address", field, m.Address, other)
		}
		addrs[m.Address] = m.Name
		if err := checkHostAddrs(field+".address", []netip.Addr{m.Address}, false); err != nil {
			return err
		}
		self = self || m.Name == nodeName
	}
	if len(c.Members) > 0 && !self {
		return fmt.Errorf("speaker.members: this node (%q) is not listed", nodeName)
	}
	return nil
}
