package cluster

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// ConfigAPIVersion is the apiVersion of vipgate's own configuration files.
const ConfigAPIVersion = "vipgate.io/v1alpha1"

// The kinds of configuration file.
const (
	KindNodeConfig    = "NodeConfig"
	KindGatewayConfig = "GatewayConfig"
)

// Configuration defaults.
const (
	DefaultMasqueradeBit       = 14 // mark 0x4000, kube-proxy's default
	DefaultHealthzBindAddress  = "127.0.0.1:10256"
	DefaultMetricsBindAddress  = "127.0.0.1:10249"
	DefaultTableName           = "vipgate"
	DefaultHealthCheckInterval = 5 * time.Second
	// DefaultDrainTimeout is how long a draining node keeps its established flows on a gateway.
	DefaultDrainTimeout = 5 * time.Minute
	// DefaultFlowTimeout is how long an idle flow keeps its entry in a gateway's connection table.
	DefaultFlowTimeout = time.Hour
)

// maxConfigSize bounds a configuration file; a config is a few hundred bytes.
const maxConfigSize = 1 << 20

// tableNameRE is what vipgate accepts as an nftables table name: short, and safe to print in any
// nft command line.
var tableNameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`)

// Logging is the logging configuration shared by both kinds.
type Logging struct {
	// Level is the minimum level written (logLevel: trace, debug, info, warn, error; default info).
	Level hclog.Level
	// JSON selects JSON lines (logFormat: json) rather than text (logFormat: text, the default).
	JSON bool
}

// NewLogger builds the root logger this configuration describes, writing to w (os.Stderr if nil).
func (l Logging) NewLogger(name string, w io.Writer) hclog.Logger {
	if w == nil {
		w = os.Stderr
	}
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: l.Level, JSONFormat: l.JSON, Output: w})
}

// NodeConfig configures vipgate on a Kubernetes node (the kube-proxy replacement and the speaker).
// Every address is parsed; see docs/configuration.md for the file format.
type NodeConfig struct {
	// NodeName is this node's name as Kubernetes knows it (default: the host name, lower-cased).
	NodeName string
	// NodeIPs are the node's addresses, at most one per family.
	NodeIPs []netip.Addr
	// ClusterCIDRs are the pod networks: traffic from them is pod traffic.
	ClusterCIDRs []netip.Prefix
	// ServiceCIDRs are the cluster-IP ranges.
	ServiceCIDRs []netip.Prefix
	// NodePortAddresses are the local addresses NodePorts answer on (default: NodeIPs as /32 and /128).
	NodePortAddresses []netip.Prefix
	// MasqueradeAll masquerades all traffic to cluster IPs, not only traffic from outside ClusterCIDRs.
	MasqueradeAll bool
	// MasqueradeBit is the packet-mark bit that flags packets for masquerading (default 14).
	MasqueradeBit int
	// NodeZone is this node's zone, for topology hints (default: the topology.kubernetes.io/zone node
	// label from NodeLabels).
	NodeZone string
	// NodeLabels are this node's labels (for the speaker's node selectors).
	NodeLabels map[string]string
	// HealthzBindAddress serves vipgate's own /healthz (default 127.0.0.1:10256).
	HealthzBindAddress netip.AddrPort
	// MetricsBindAddress serves /metrics (default 127.0.0.1:10249).
	MetricsBindAddress netip.AddrPort
	// HealthCheckAddresses are where the per-Service healthCheckNodePort servers listen (default:
	// NodeIPs).
	HealthCheckAddresses []netip.Addr
	// TableName is the nftables table vipgate owns (default "vipgate"), in both the ip and ip6
	// families.
	TableName string
	// ServiceProxyName, when set, makes vipgate program only the Services (and EndpointSlices)
	// labelled service.kubernetes.io/service-proxy-name with this value, as Cilium's
	// k8s-service-proxy-name, so that it can run beside another service proxy. Empty (the default):
	// kube-proxy's choice, every Service without that label. See ServiceProxyFilter.
	ServiceProxyName string
	// ExternalIPs says which addresses Services may claim besides their cluster IPs (externalIPs,
	// LoadBalancer IPs); see ExternalIPPolicy.
	ExternalIPs ExternalIPPolicy
	// ServiceLimits bound what one Service may cost the node (limits.go).
	ServiceLimits ServiceLimits
	// Speaker configures the L2 speakers' membership (speakerconfig.go).
	Speaker SpeakerConfig
	// SymmetricReturn routes replies back out of the interface their connection came in on
	// (symreturn.go).
	SymmetricReturn SymmetricReturn
	// Logging is logLevel and logFormat.
	Logging Logging
}

// ExternalIPPolicy is the node's policy for the addresses a Service claims besides its cluster IPs:
// spec.externalIPs, which anyone who may create a Service can set to any address
// (CVE-2020-8554), and status.loadBalancer.ingress. An address the policy refuses is not programmed
// for that Service; the Service's other entries are (the refusal is reported like a rejection).
// Special addresses (loopback, link-local, multicast, ...) are refused whatever the policy says.
type ExternalIPPolicy struct {
	// AllowedCIDRs are the only ranges spec.externalIPs may use, like the externalip-webhook's
	// allowed CIDRs. Empty (the default) allows none: Kubernetes deprecated externalIPs (KEP-5707)
	// and future conformance expects a service proxy not to support them by default, as the API
	// server's DenyServiceExternalIPs admission. 0.0.0.0/0 and ::/0 give kube-proxy's behaviour
	// (any address). It does not apply to LoadBalancer IPs, which the LoadBalancer controller
	// assigns.
	AllowedCIDRs []netip.Prefix
	// AllowNodeIPs lets an external or LoadBalancer IP equal a node's address (a node IP of this
	// config, a local address NodePorts answer on, or any Node's address): such an entry takes the
	// node's own traffic on that port (kubelet, ssh) away. Off by default; setups that give
	// LoadBalancer Services the node's address (k3s ServiceLB) turn it on.
	AllowNodeIPs bool
	// AllowClusterCIDRs lets an external or LoadBalancer IP lie inside serviceCIDRs or clusterCIDRs
	// (pods), where it would shadow a cluster IP the API server may allocate later, or a pod. Off by
	// default.
	AllowClusterCIDRs bool
}

// externalIPPolicyFile is the on-disk form of ExternalIPPolicy.
type externalIPPolicyFile struct {
	AllowedCIDRs      []string `json:"allowedCIDRs"`
	AllowNodeIPs      bool     `json:"allowNodeIPs"`
	AllowClusterCIDRs bool     `json:"allowClusterCIDRs"`
}

// MasqueradeMark is the packet mark value of MasqueradeBit (0x4000 by default).
func (c *NodeConfig) MasqueradeMark() uint32 { return 1 << c.MasqueradeBit }

// NodeIP returns the node IP of family f.
func (c *NodeConfig) NodeIP(f Family) (netip.Addr, bool) {
	for _, a := range c.NodeIPs {
		if FamilyOf(a) == f {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// nodeConfigFile is the on-disk form of NodeConfig; its field names are the file format.
type nodeConfigFile struct {
	APIVersion           string               `json:"apiVersion"`
	Kind                 string               `json:"kind"`
	NodeName             string               `json:"nodeName"`
	NodeIPs              []string             `json:"nodeIPs"`
	ClusterCIDRs         []string             `json:"clusterCIDRs"`
	ServiceCIDRs         []string             `json:"serviceCIDRs"`
	NodePortAddresses    []string             `json:"nodePortAddresses"`
	MasqueradeAll        bool                 `json:"masqueradeAll"`
	MasqueradeBit        *int                 `json:"masqueradeBit"`
	NodeZone             string               `json:"nodeZone"`
	NodeLabels           map[string]string    `json:"nodeLabels"`
	HealthzBindAddress   string               `json:"healthzBindAddress"`
	MetricsBindAddress   string               `json:"metricsBindAddress"`
	HealthCheckAddresses []string             `json:"healthCheckAddresses"`
	TableName            string               `json:"tableName"`
	ServiceProxyName     string               `json:"serviceProxyName"`
	ExternalIPs          externalIPPolicyFile `json:"externalIPs"`
	ServiceLimits        serviceLimitsFile    `json:"serviceLimits"`
	Speaker              *speakerConfigFile   `json:"speaker"`
	SymmetricReturn      *symmetricReturnFile `json:"symmetricReturn"`
	LogLevel             string               `json:"logLevel"`
	LogFormat            string               `json:"logFormat"`
}

// Forwarding is how the gateway sends Service traffic into the cluster.
type Forwarding string

// Forwarding modes.
const (
	// ForwardDirect routes to the pod IPs themselves (the gateway needs routes to the pod networks).
	ForwardDirect Forwarding = "direct"
	// ForwardNodePort sends to a node's NodePort (works with any CNI).
	ForwardNodePort Forwarding = "nodePort"
	// ForwardRoute sends the packet unchanged (no NAT) to a node, whose own Service rules (vipgate
	// node or kube-proxy) take it to a pod; the node answers the client directly (direct server
	// return). The gateway keeps no per-flow state, so any gateway of a group can carry any flow.
	ForwardRoute Forwarding = "route"
)

// SNATMode says when the gateway rewrites the client's source address to its own.
type SNATMode string

// SNAT modes.
const (
	// SNATAuto masquerades only where the client address is lost anyway and SNAT makes the return
	// path independent of the cluster's routing: nodePort forwarding to a Service with
	// externalTrafficPolicy Cluster (the node masquerades such traffic itself). Direct forwarding and
	// eTP=Local Services keep the client address; their replies must be routed back through the
	// gateway (docs/gateway.md).
	SNATAuto SNATMode = "auto"
	// SNATAlways always masquerades.
	SNATAlways SNATMode = "always"
	// SNATNever never masquerades (the cluster must route replies back through the gateway).
	SNATNever SNATMode = "never"
)

// GatewayConfig configures vipgate as a gateway outside the cluster that receives VIP traffic and
// forwards it to the nodes or pods.
type GatewayConfig struct {
	// GatewayIPs are the gateway's own addresses, at most one per family.
	GatewayIPs []netip.Addr
	// Forwarding is direct or nodePort (default nodePort).
	Forwarding Forwarding
	// SNAT is auto, always or never (default auto).
	SNAT SNATMode
	// HealthCheckInterval is how often backends are probed (default 5s).
	HealthCheckInterval time.Duration
	// ClusterCIDRs are the pod networks, ServiceCIDRs the cluster-IP ranges.
	ClusterCIDRs []netip.Prefix
	ServiceCIDRs []netip.Prefix
	// TableName is the nftables table vipgate owns (default "vipgate").
	TableName string
	// Nodes are the cluster's nodes and their addresses, for nodePort forwarding when the source
	// knows no Node objects (a directory of manifests without Nodes). Node objects win when present.
	Nodes []Node
	// MaglevTableSize is the number of consistent-hash slots per VIP port (a prime, 251-65537; 0
	// means derived from the backends: the smallest of 1021 ... 65537 that is >= 100 x backends).
	MaglevTableSize int
	// DrainTimeout is how long a draining node keeps its established flows on the gateways (label
	// vipgate.io/drain; 0: DefaultDrainTimeout); after it the node leaves the connection table.
	DrainTimeout time.Duration
	// FlowTimeout is how long an idle flow keeps its entry in the gateways' connection table
	// (forwarding: route; 0: DefaultFlowTimeout).
	FlowTimeout time.Duration
	// HashKeyFile holds the key (the membership key file's format: the first line's key) the flow
	// hash's seed is derived from: the jhash seed of the Maglev rules and of the NAT fast path,
	// which must be secret and equal on the gateways of a group. Default: the membership's key
	// (speaker.memberKeyFile); without either the public default seed (a /status warning).
	HashKeyFile string
	// RouteFastPath forwards route mode's packets from a netdev ingress chain with fwd rather than
	// with dup at prerouting (docs/gateway.md; default DefaultRouteFastPath with forwarding: route);
	// RouteFastPathDevices are the interfaces VIP traffic arrives on (empty: every up interface but
	// loopback).
	RouteFastPath        bool
	RouteFastPathDevices []string
	// NATFastPath forwards forwarding direct's and nodePort's flows with a tc BPF program that
	// rewrites and sends them itself, without the IP stack and conntrack (docs/gateway.md; default
	// DefaultNATFastPath with those modes; the family's table forwards what it does not take).
	NATFastPath NATFastPath
	// Name is this gateway's name among the gateways of its group (default: the host name). It is
	// the member name of the speakers' membership and the node name MetalLB selectors see.
	Name string
	// Labels are what the nodeSelectors of L2Advertisements, BGPAdvertisements and BGPPeers are
	// matched against on a gateway, as a node's labels are on a node. They are the labels of every
	// gateway of the group (keep them the same in every gateway's config); vipgate adds
	// kubernetes.io/hostname (the member's name) and vipgate.io/role: gateway.
	Labels map[string]string
	// Speaker configures the membership of the gateways' L2 speakers: speaker.members lists the
	// gateways of the group (empty: this gateway alone).
	Speaker SpeakerConfig
	// MetricsBindAddress serves /metrics and /status (default 127.0.0.1:10249), as on a node.
	MetricsBindAddress netip.AddrPort
	// Logging is logLevel and logFormat.
	Logging Logging
	// SNATAddresses are the source addresses the gateways of the group masquerade to, per gateway
	// (the same list in every gateway's config). Each gateway SNATs to its own, answers ARP/NDP for
	// it while alive, and a surviving gateway takes a dead one's over, so replies to the dead
	// gateway's flows reach a gateway that holds their NAT state (ConntrackSync). Empty: masquerade
	// to the gateway's own address.
	SNATAddresses []GatewaySNATAddresses
	// ConntrackSync replicates the gateway's conntrack table to its peer with conntrackd.
	ConntrackSync ConntrackSync
	// ServiceLimits bound what one Service may cost the gateway (limits.go).
	ServiceLimits ServiceLimits
}

// GatewaySNATAddresses are one gateway's SNAT source addresses, at most one per family.
type GatewaySNATAddresses struct {
	// Gateway is the gateway's name (its name:, a member of speaker.members).
	Gateway   string
	Addresses []netip.Addr
}

// ConntrackSync configures conntrackd (FTFW over unicast UDP) between the two gateways of a pair.
type ConntrackSync struct {
	Enabled bool
	// Interface carries the sync traffic (a dedicated link is best; default: the interface of the
	// gateway IP of Peer's family, found at start).
	Interface string
	// Peer is the other gateway's address on that link; LocalAddress this gateway's (default: the
	// gatewayIP of Peer's family).
	Peer         netip.Addr
	LocalAddress netip.Addr
	// Port is the UDP port of the sync messages (default 3780, conntrackd's).
	Port int
	// Conntrackd is the path of the conntrackd binary (default: conntrackd from PATH).
	Conntrackd string
	// StateDir holds conntrackd's config, lock file, control socket, log and pid file (default: a
	// fresh temporary directory, removed on exit).
	StateDir string
	// KeyFile holds the keys that authenticate the sync datagrams between the gateways' relays, in
	// the membership key file's format (one per line, the first signs, any verifies; default: the
	// membership's, speaker.memberKeyFile or --member-key-file). The channel's own keys are derived
	// from them. Without a key conntrack sync does not start.
	KeyFile string
}

// DefaultConntrackSyncPort is conntrackd's default UDP port.
const DefaultConntrackSyncPort = 3780

// SNATAddressesOf returns the SNAT addresses of the named gateway (nil if it has none).
func (c *GatewayConfig) SNATAddressesOf(name string) []netip.Addr {
	for _, g := range c.SNATAddresses {
		if g.Gateway == name {
			return g.Addresses
		}
	}
	return nil
}

// GatewayRoleLabel is the label every gateway carries for MetalLB nodeSelectors, so a BGPPeer or an
// advertisement can be meant for gateways only (vipgate.io/role: gateway) or nodes only
// (vipgate.io/role NotIn [gateway]).
const GatewayRoleLabel = "vipgate.io/role"

// gatewayNodeFile is one entry of a GatewayConfig's nodes list.
type gatewayNodeFile struct {
	Name      string   `json:"name"`
	Addresses []string `json:"addresses"`
}

// gatewayConfigFile is the on-disk form of GatewayConfig.
type gatewayConfigFile struct {
	APIVersion          string             `json:"apiVersion"`
	Kind                string             `json:"kind"`
	GatewayIPs          []string           `json:"gatewayIPs"`
	Forwarding          string             `json:"forwarding"`
	SNAT                string             `json:"snat"`
	HealthCheckInterval string             `json:"healthCheckInterval"`
	ClusterCIDRs        []string           `json:"clusterCIDRs"`
	ServiceCIDRs        []string           `json:"serviceCIDRs"`
	TableName           string             `json:"tableName"`
	Nodes               []gatewayNodeFile  `json:"nodes"`
	MaglevTableSize     int                `json:"maglevTableSize"`
	DrainTimeout        string             `json:"drainTimeout"`
	FlowTimeout         string             `json:"flowTimeout"`
	HashKeyFile         string             `json:"hashKeyFile"`
	RouteFastPath       *routeFastPathFile `json:"routeFastPath"`
	NATFastPath         *natFastPathFile   `json:"natFastPath"`
	Name                string             `json:"name"`
	Labels              map[string]string  `json:"labels"`
	Speaker             *speakerConfigFile `json:"speaker"`
	MetricsBindAddress  string             `json:"metricsBindAddress"`
	LogLevel            string             `json:"logLevel"`
	LogFormat           string             `json:"logFormat"`
	SNATAddresses       []gatewaySNATFile  `json:"snatAddresses"`
	ConntrackSync       *conntrackSyncFile `json:"conntrackSync"`
	ServiceLimits       serviceLimitsFile  `json:"serviceLimits"`
}

// gatewaySNATFile is one entry of a GatewayConfig's snatAddresses.
type gatewaySNATFile struct {
	Gateway   string   `json:"gateway"`
	Addresses []string `json:"addresses"`
}

// conntrackSyncFile is the on-disk form of ConntrackSync.
type conntrackSyncFile struct {
	Enabled      *bool  `json:"enabled"`
	Interface    string `json:"interface"`
	Peer         string `json:"peer"`
	LocalAddress string `json:"localAddress"`
	Port         int    `json:"port"`
	Conntrackd   string `json:"conntrackd"`
	StateDir     string `json:"stateDir"`
	KeyFile      string `json:"keyFile"`
}

// parseGatewaySync decodes snatAddresses and conntrackSync into c.
func parseGatewaySync(c *GatewayConfig, f *gatewayConfigFile) error {
	for i, g := range f.SNATAddresses {
		addrs, err := parseAddrList(fmt.Sprintf("snatAddresses[%d].addresses", i), g.Addresses)
		if err != nil {
			return err
		}
		c.SNATAddresses = append(c.SNATAddresses, GatewaySNATAddresses{Gateway: g.Gateway, Addresses: addrs})
	}
	cs := f.ConntrackSync
	if cs == nil {
		return nil
	}
	// A conntrackSync section means "on" unless it says enabled: false.
	c.ConntrackSync = ConntrackSync{Enabled: cs.Enabled == nil || *cs.Enabled, Interface: cs.Interface,
		Port: cmp.Or(cs.Port, DefaultConntrackSyncPort), Conntrackd: cs.Conntrackd, StateDir: cs.StateDir, KeyFile: cs.KeyFile}
	var err error
	if cs.Peer != "" {
		if c.ConntrackSync.Peer, err = parseIP("conntrackSync.peer", cs.Peer); err != nil {
			return err
		}
	}
	if cs.LocalAddress != "" {
		if c.ConntrackSync.LocalAddress, err = parseIP("conntrackSync.localAddress", cs.LocalAddress); err != nil {
			return err
		}
	}
	return nil
}

// validateGatewaySync checks snatAddresses and conntrackSync.
func (c *GatewayConfig) validateGatewaySync() error {
	members := map[string]bool{c.Name: true}
	for _, m := range c.Speaker.Members {
		members[m.Name] = true
	}
	seenGw := map[string]bool{}
	seenAddr := map[netip.Addr]string{}
	for i, g := range c.SNATAddresses {
		field := fmt.Sprintf("snatAddresses[%d]", i)
		if !members[g.Gateway] {
			return fmt.Errorf("%s.gateway: %q is neither this gateway (name: %s) nor in speaker.members", field, g.Gateway, c.Name)
		}
		if seenGw[g.Gateway] {
			return fmt.Errorf("%s.gateway: %q is listed twice", field, g.Gateway)
		}
		seenGw[g.Gateway] = true
		if len(g.Addresses) == 0 {
			return fmt.Errorf("%s.addresses: gateway %q needs at least one address", field, g.Gateway)
		}
		if err := checkHostAddrs(field+".addresses", g.Addresses, true); err != nil {
			return err
		}
		for j, a := range g.Addresses {
			if o, ok := seenAddr[a]; ok {
				return fmt.Errorf("%s.addresses[%d]: %s is gateway %q's too: each gateway needs its own SNAT address", field, j, a, o)
			}
			seenAddr[a] = g.Gateway
			if slices.Contains(c.GatewayIPs, a) {
				return fmt.Errorf("%s.addresses[%d]: %s is this gateway's own gatewayIP; a SNAT address must be a spare address that moves to the peer when this gateway dies", field, j, a)
			}
			for _, m := range c.Speaker.Members {
				if m.Address == a {
					return fmt.Errorf("%s.addresses[%d]: %s is the member address of %q; a SNAT address must be a spare address", field, j, a, m.Name)
				}
			}
		}
	}
	if len(c.SNATAddresses) > 0 && !seenGw[c.Name] {
		return fmt.Errorf("snatAddresses: no entry for this gateway (name: %s)", c.Name)
	}
	cs := c.ConntrackSync
	if !cs.Enabled {
		return nil
	}
	if !cs.Peer.IsValid() {
		return errors.New("conntrackSync.peer: required (the other gateway's address on the sync link)")
	}
	if err := checkHostAddrs("conntrackSync.peer", []netip.Addr{cs.Peer}, true); err != nil {
		return err
	}
	if cs.LocalAddress.IsValid() {
		if err := checkHostAddrs("conntrackSync.localAddress", []netip.Addr{cs.LocalAddress}, true); err != nil {
			return err
		}
		if cs.LocalAddress.Is4() != cs.Peer.Is4() {
			return fmt.Errorf("conntrackSync.localAddress: %s and peer %s are of different families", cs.LocalAddress, cs.Peer)
		}
		if cs.LocalAddress == cs.Peer {
			return fmt.Errorf("conntrackSync.peer: %s is this gateway's own localAddress", cs.Peer)
		}
	} else if !slices.ContainsFunc(c.GatewayIPs, func(a netip.Addr) bool { return a.Is4() == cs.Peer.Is4() }) {
		return fmt.Errorf("conntrackSync.localAddress: required: no gatewayIP of the family of peer %s", cs.Peer)
	}
	if slices.Contains(c.GatewayIPs, cs.Peer) {
		return fmt.Errorf("conntrackSync.peer: %s is this gateway's own gatewayIP", cs.Peer)
	}
	if cs.Port < 1 || cs.Port > 65535 {
		return fmt.Errorf("conntrackSync.port: %d is out of range 1-65535", cs.Port)
	}
	if cs.Interface != "" && (len(cs.Interface) > 15 || strings.ContainsAny(cs.Interface, "/ \t\n\"{}#")) {
		return fmt.Errorf("conntrackSync.interface: %q is not an interface name", cs.Interface)
	}
	if cs.Conntrackd != "" && (!strings.HasPrefix(cs.Conntrackd, "/") || strings.ContainsAny(cs.Conntrackd, "\n\x00")) {
		return fmt.Errorf("conntrackSync.conntrackd: %q is not an absolute path", cs.Conntrackd)
	}
	if cs.StateDir != "" && (!strings.HasPrefix(cs.StateDir, "/") || strings.ContainsAny(cs.StateDir, " \t\n\"{}#\x00") || strings.Contains(cs.StateDir, "..")) {
		return fmt.Errorf("conntrackSync.stateDir: %q is not an absolute path without spaces, quotes, braces or '..'", cs.StateDir)
	}
	if cs.KeyFile != "" && (!strings.HasPrefix(cs.KeyFile, "/") || strings.ContainsAny(cs.KeyFile, "\n\x00")) {
		return fmt.Errorf("conntrackSync.keyFile: %q is not an absolute path", cs.KeyFile)
	}
	// With SNAT to the gateway's own address, replies of the flows a dead gateway NATed go to a dead
	// address: no synced state can save them.
	if c.Forwarding != ForwardRoute && c.SNAT != SNATNever && len(c.SNATAddresses) == 0 {
		return errors.New("conntrackSync: needs snatAddresses with snat: " + string(c.SNAT) + " (each gateway's SNAT address moves to the survivor, so replies reach the gateway that has the synced NAT state)")
	}
	return nil
}

// readConfigFile reads a configuration file, bounded in size, with the care of the manifest
// directory: a regular file (or a link to one, as in a ConfigMap volume) opened without blocking,
// not world-writable, owned by root or vipgate's user. (Its directory is not checked: a ConfigMap
// volume's directory is world-writable inside the pod, where nobody else runs.) It returns the bytes with ${NAME} expanded
// and the redaction that keeps the expanded values out of error messages.
func readConfigFile(path string) ([]byte, redaction, error) {
	fh, fi, err := openRegular(path)
	if err != nil {
		return nil, nil, fmt.Errorf("reading config %s: %w", path, err)
	}
	defer fh.Close()
	if err := checkTrusted("config "+path, fi); err != nil {
		return nil, nil, err
	}
	data, err := readRegular(fh, maxConfigSize)
	if err != nil {
		return nil, nil, fmt.Errorf("reading config %s: %w", path, err)
	}
	out, red, err := expandEnv(data)
	if err != nil {
		return nil, nil, fmt.Errorf("config %s: %w", path, err)
	}
	return out, red, nil
}

// envRef is a ${NAME} reference in a config file.
var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// redaction maps each value expandEnv put into a config to the reference it came from.
type redaction map[string]string

// error returns err with every expanded value replaced by its ${NAME}: whatever the config's
// parser quotes back (a bad node name, the line of a YAML error), a value that came from the
// environment (a token, a password) never reaches a log line. A nil err stays nil.
func (r redaction) error(err error) error {
	if err == nil || len(r) == 0 {
		return err
	}
	msg := err.Error()
	// Longest values first, so that a value inside another is not replaced inside it.
	vals := slices.Collect(maps.Keys(r))
	slices.SortFunc(vals, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	changed := false
	for _, v := range vals {
		if strings.Contains(msg, v) {
			msg = strings.ReplaceAll(msg, v, "${"+r[v]+"}")
			changed = true
		}
	}
	if !changed {
		return err
	}
	return errors.New(msg)
}

// expandEnv replaces ${NAME} with the environment variable NAME, so one ConfigMap serves every node
// of a DaemonSet (nodeName: ${NODE_NAME}, nodeIPs: ["${NODE_IP}"] from the downward API). An unset
// variable is an error: an empty node name or address must not pass silently. Only the ${NAME} form
// is expanded; a lone $ stays as it is. The redaction returned lists the non-empty values put in.
func expandEnv(data []byte) ([]byte, redaction, error) {
	var missing []string
	red := redaction{}
	out := envRef.ReplaceAllFunc(data, func(m []byte) []byte {
		name := string(envRef.FindSubmatch(m)[1])
		v, ok := os.LookupEnv(name)
		if !ok {
			missing = append(missing, name)
		}
		if v != "" {
			red[v] = name
		}
		return []byte(v)
	})
	if len(missing) > 0 {
		return nil, nil, fmt.Errorf("environment variables referenced but not set: %s", strings.Join(missing, ", "))
	}
	return out, red, nil
}

// configKind reads apiVersion and kind, and checks apiVersion.
func configKind(data []byte) (string, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return "", errors.New("empty config")
	}
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return "", fmt.Errorf("malformed config: %w", err)
	}
	if tm.APIVersion != ConfigAPIVersion {
		return "", fmt.Errorf("apiVersion: %q is not supported (want %s)", tm.APIVersion, ConfigAPIVersion)
	}
	if tm.Kind != KindNodeConfig && tm.Kind != KindGatewayConfig {
		return "", fmt.Errorf("kind: %q is not supported (want %s or %s)", tm.Kind, KindNodeConfig, KindGatewayConfig)
	}
	return tm.Kind, nil
}

// LoadConfig reads a configuration file of either kind and returns *NodeConfig or *GatewayConfig.
func LoadConfig(path string) (any, error) {
	data, red, err := readConfigFile(path)
	if err != nil {
		return nil, err
	}
	kind, err := configKind(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, red.error(err))
	}
	var cfg any
	if kind == KindNodeConfig {
		cfg, err = ParseNodeConfig(data)
	} else {
		cfg, err = ParseGatewayConfig(data)
	}
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, red.error(err))
	}
	return cfg, nil
}

// LoadNodeConfig reads, defaults and validates a NodeConfig file.
func LoadNodeConfig(path string) (*NodeConfig, error) {
	data, red, err := readConfigFile(path)
	if err != nil {
		return nil, err
	}
	c, err := ParseNodeConfig(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, red.error(err))
	}
	return c, nil
}

// LoadGatewayConfig reads, defaults and validates a GatewayConfig file.
func LoadGatewayConfig(path string) (*GatewayConfig, error) {
	data, red, err := readConfigFile(path)
	if err != nil {
		return nil, err
	}
	c, err := ParseGatewayConfig(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, red.error(err))
	}
	return c, nil
}

// hostname is os.Hostname, replaceable in tests.
var hostname = os.Hostname

// ParseNodeConfig decodes a NodeConfig strictly (unknown or duplicate fields are errors), applies the
// defaults and validates it.
func ParseNodeConfig(data []byte) (*NodeConfig, error) {
	kind, err := configKind(data)
	if err != nil {
		return nil, err
	}
	if kind != KindNodeConfig {
		return nil, fmt.Errorf("kind: %q, want %s", kind, KindNodeConfig)
	}
	var f nodeConfigFile
	if err := strict(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", KindNodeConfig, err)
	}
	c := &NodeConfig{
		NodeName:      f.NodeName,
		MasqueradeAll: f.MasqueradeAll,
		MasqueradeBit: DefaultMasqueradeBit,
		NodeZone:      f.NodeZone,
		NodeLabels:    f.NodeLabels,
		TableName:     cmp.Or(f.TableName, DefaultTableName),

		ServiceProxyName: f.ServiceProxyName,
	}
	if c.NodeName == "" {
		// Like kube-proxy without --hostname-override.
		h, err := hostname()
		if err != nil {
			return nil, fmt.Errorf("nodeName: not set and the host name is unknown: %w", err)
		}
		c.NodeName = strings.ToLower(h)
	}
	if f.MasqueradeBit != nil {
		c.MasqueradeBit = *f.MasqueradeBit
	}
	if c.NodeZone == "" {
		c.NodeZone = c.NodeLabels[ZoneLabel]
	}
	if c.NodeIPs, err = parseAddrList("nodeIPs", f.NodeIPs); err != nil {
		return nil, err
	}
	if c.ClusterCIDRs, err = parsePrefixList("clusterCIDRs", f.ClusterCIDRs); err != nil {
		return nil, err
	}
	if c.ServiceCIDRs, err = parsePrefixList("serviceCIDRs", f.ServiceCIDRs); err != nil {
		return nil, err
	}
	if c.NodePortAddresses, err = parsePrefixList("nodePortAddresses", f.NodePortAddresses); err != nil {
		return nil, err
	}
	c.ExternalIPs = ExternalIPPolicy{AllowNodeIPs: f.ExternalIPs.AllowNodeIPs, AllowClusterCIDRs: f.ExternalIPs.AllowClusterCIDRs}
	if c.ExternalIPs.AllowedCIDRs, err = parsePrefixList("externalIPs.allowedCIDRs", f.ExternalIPs.AllowedCIDRs); err != nil {
		return nil, err
	}
	if c.ServiceLimits, err = parseServiceLimits(f.ServiceLimits); err != nil {
		return nil, err
	}
	if len(f.NodePortAddresses) == 0 {
		for _, a := range c.NodeIPs {
			c.NodePortAddresses = append(c.NodePortAddresses, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	if c.HealthCheckAddresses, err = parseAddrList("healthCheckAddresses", f.HealthCheckAddresses); err != nil {
		return nil, err
	}
	if len(f.HealthCheckAddresses) == 0 {
		c.HealthCheckAddresses = slices.Clone(c.NodeIPs)
	}
	if c.HealthzBindAddress, err = parseAddrPort("healthzBindAddress", cmp.Or(f.HealthzBindAddress, DefaultHealthzBindAddress)); err != nil {
		return nil, err
	}
	if c.MetricsBindAddress, err = parseAddrPort("metricsBindAddress", cmp.Or(f.MetricsBindAddress, DefaultMetricsBindAddress)); err != nil {
		return nil, err
	}
	if c.Logging, err = parseLogging(f.LogLevel, f.LogFormat); err != nil {
		return nil, err
	}
	if c.Speaker, err = parseSpeakerConfig(f.Speaker); err != nil {
		return nil, err
	}
	if c.SymmetricReturn, err = parseSymmetricReturn(f.SymmetricReturn); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Validate checks a NodeConfig's values and their consistency; the error names the field and value.
func (c *NodeConfig) Validate() error {
	if err := checkName("nodeName", c.NodeName, validation.IsDNS1123Subdomain); err != nil {
		return err
	}
	if len(c.NodeIPs) == 0 {
		return errors.New("nodeIPs: at least one node IP is required")
	}
	if err := checkHostAddrs("nodeIPs", c.NodeIPs, true); err != nil {
		return err
	}
	families := familiesOf(c.NodeIPs)
	for _, l := range []struct {
		field    string
		prefixes []netip.Prefix
	}{{"clusterCIDRs", c.ClusterCIDRs}, {"serviceCIDRs", c.ServiceCIDRs}} {
		if err := checkPrefixes(l.field, l.prefixes, families, "nodeIPs"); err != nil {
			return err
		}
	}
	if err := checkPrefixes("nodePortAddresses", c.NodePortAddresses, nil, ""); err != nil {
		return err
	}
	if c.MasqueradeBit < 0 || c.MasqueradeBit > 31 {
		return fmt.Errorf("masqueradeBit: %d is out of range 0-31", c.MasqueradeBit)
	}
	for k, v := range c.NodeLabels {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			return fmt.Errorf("nodeLabels: key %q is invalid: %s", k, strings.Join(msgs, "; "))
		}
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			return fmt.Errorf("nodeLabels[%s]: value %q is invalid: %s", k, v, strings.Join(msgs, "; "))
		}
	}
	if err := checkBind("healthzBindAddress", c.HealthzBindAddress); err != nil {
		return err
	}
	if err := checkBind("metricsBindAddress", c.MetricsBindAddress); err != nil {
		return err
	}
	if c.HealthzBindAddress == c.MetricsBindAddress {
		return fmt.Errorf("metricsBindAddress: %s is the same as healthzBindAddress", c.MetricsBindAddress)
	}
	if err := checkHostAddrs("healthCheckAddresses", c.HealthCheckAddresses, false); err != nil {
		return err
	}
	if err := c.Speaker.validate(c.NodeName); err != nil {
		return err
	}
	if c.SymmetricReturn.Enabled() {
		if err := c.SymmetricReturn.validate(c.MasqueradeMark()); err != nil {
			return err
		}
	}
	if c.ServiceProxyName != "" {
		// A label value, since it is matched against one.
		if msgs := validation.IsValidLabelValue(c.ServiceProxyName); len(msgs) > 0 {
			return fmt.Errorf("serviceProxyName: %q is invalid: %s", c.ServiceProxyName, strings.Join(msgs, "; "))
		}
	}
	return checkTableName(c.TableName)
}

// ParseGatewayConfig decodes a GatewayConfig strictly, applies the defaults and validates it.
func ParseGatewayConfig(data []byte) (*GatewayConfig, error) {
	kind, err := configKind(data)
	if err != nil {
		return nil, err
	}
	if kind != KindGatewayConfig {
		return nil, fmt.Errorf("kind: %q, want %s", kind, KindGatewayConfig)
	}
	var f gatewayConfigFile
	if err := strict(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", KindGatewayConfig, err)
	}
	c := &GatewayConfig{
		Forwarding:          Forwarding(cmp.Or(f.Forwarding, string(ForwardNodePort))),
		SNAT:                SNATMode(cmp.Or(f.SNAT, string(SNATAuto))),
		HealthCheckInterval: DefaultHealthCheckInterval,
		TableName:           cmp.Or(f.TableName, DefaultTableName),
		MaglevTableSize:     f.MaglevTableSize,
		Name:                f.Name,
		Labels:              map[string]string{},
	}
	if c.Name == "" {
		if c.Name, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("name: not set and the host name is unknown: %w", err)
		}
		c.Name = strings.ToLower(c.Name)
	}
	for k, v := range f.Labels {
		c.Labels[k] = v
	}
	c.Labels["kubernetes.io/hostname"] = c.Name
	c.Labels[GatewayRoleLabel] = "gateway"
	if c.Speaker, err = parseSpeakerConfig(f.Speaker); err != nil {
		return nil, err
	}
	if c.MetricsBindAddress, err = parseAddrPort("metricsBindAddress", cmp.Or(f.MetricsBindAddress, DefaultMetricsBindAddress)); err != nil {
		return nil, err
	}
	if f.HealthCheckInterval != "" {
		if c.HealthCheckInterval, err = time.ParseDuration(f.HealthCheckInterval); err != nil {
			return nil, fmt.Errorf("healthCheckInterval: %q is not a duration (like 5s or 500ms)", f.HealthCheckInterval)
		}
	}
	if f.DrainTimeout != "" {
		if c.DrainTimeout, err = time.ParseDuration(f.DrainTimeout); err != nil {
			return nil, fmt.Errorf("drainTimeout: %q is not a duration (like 5m or 30s)", f.DrainTimeout)
		}
		if c.DrainTimeout == 0 {
			return nil, errors.New("drainTimeout: 0 is not allowed (leave it out for the default 5m; 1s for almost no grace)")
		}
	}
	if f.FlowTimeout != "" {
		if c.FlowTimeout, err = time.ParseDuration(f.FlowTimeout); err != nil {
			return nil, fmt.Errorf("flowTimeout: %q is not a duration (like 1h or 10m)", f.FlowTimeout)
		}
		if c.FlowTimeout == 0 {
			return nil, errors.New("flowTimeout: 0 is not allowed (leave it out for the default 1h)")
		}
	}
	c.HashKeyFile = f.HashKeyFile
	if c.RouteFastPath, c.RouteFastPathDevices, err = parseRouteFastPath(f.RouteFastPath, Forwarding(f.Forwarding)); err != nil {
		return nil, err
	}
	if c.NATFastPath, err = parseNATFastPath(f.NATFastPath, Forwarding(f.Forwarding)); err != nil {
		return nil, err
	}
	if c.GatewayIPs, err = parseAddrList("gatewayIPs", f.GatewayIPs); err != nil {
		return nil, err
	}
	if c.ClusterCIDRs, err = parsePrefixList("clusterCIDRs", f.ClusterCIDRs); err != nil {
		return nil, err
	}
	if c.ServiceCIDRs, err = parsePrefixList("serviceCIDRs", f.ServiceCIDRs); err != nil {
		return nil, err
	}
	if c.Logging, err = parseLogging(f.LogLevel, f.LogFormat); err != nil {
		return nil, err
	}
	for i, n := range f.Nodes {
		node := Node{Name: n.Name}
		if node.Addresses, err = parseAddrList(fmt.Sprintf("nodes[%d].addresses", i), n.Addresses); err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, node)
	}
	if err := parseGatewaySync(c, &f); err != nil {
		return nil, err
	}
	if c.ServiceLimits, err = parseServiceLimits(f.ServiceLimits); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Validate checks a GatewayConfig's values and their consistency.
func (c *GatewayConfig) Validate() error {
	if len(c.GatewayIPs) == 0 {
		return errors.New("gatewayIPs: at least one gateway IP is required")
	}
	if err := checkHostAddrs("gatewayIPs", c.GatewayIPs, true); err != nil {
		return err
	}
	switch c.Forwarding {
	case ForwardDirect, ForwardNodePort, ForwardRoute:
	default:
		return fmt.Errorf("forwarding: %q is not supported (want %s, %s or %s)", c.Forwarding, ForwardDirect, ForwardNodePort, ForwardRoute)
	}
	switch c.SNAT {
	case SNATAuto, SNATAlways, SNATNever:
	default:
		return fmt.Errorf("snat: %q is not supported (want auto, always or never)", c.SNAT)
	}
	if c.HealthCheckInterval < 100*time.Millisecond || c.HealthCheckInterval > time.Hour {
		return fmt.Errorf("healthCheckInterval: %s is out of range 100ms-1h", c.HealthCheckInterval)
	}
	families := familiesOf(c.GatewayIPs)
	if err := checkPrefixes("clusterCIDRs", c.ClusterCIDRs, families, "gatewayIPs"); err != nil {
		return err
	}
	if c.Forwarding == ForwardRoute && c.SNAT == SNATAlways {
		return errors.New("snat: always cannot be done with forwarding: route (the gateway does not NAT; the nodes answer the clients directly)")
	}
	if c.Forwarding == ForwardDirect && len(c.ClusterCIDRs) == 0 {
		return errors.New("clusterCIDRs: required with forwarding: direct (the gateway routes to pod IPs)")
	}
	if err := checkPrefixes("serviceCIDRs", c.ServiceCIDRs, families, "gatewayIPs"); err != nil {
		return err
	}
	// 0 is the default (DefaultDrainTimeout, DefaultFlowTimeout).
	if c.DrainTimeout != 0 && (c.DrainTimeout < time.Second || c.DrainTimeout > 24*time.Hour) {
		return fmt.Errorf("drainTimeout: %s is out of range 1s-24h", c.DrainTimeout)
	}
	if c.FlowTimeout != 0 && (c.FlowTimeout < time.Second || c.FlowTimeout > 24*time.Hour) {
		return fmt.Errorf("flowTimeout: %s is out of range 1s-24h", c.FlowTimeout)
	}
	// The prime test is math/big's, as maglev.IsPrime's (cluster may not import the dataplane's
	// leaves): exact for every int, so the two cannot disagree about a size.
	if c.MaglevTableSize != 0 && (c.MaglevTableSize < 251 || c.MaglevTableSize > 65537 || !big.NewInt(int64(c.MaglevTableSize)).ProbablyPrime(0)) {
		return fmt.Errorf("maglevTableSize: %d is not a prime between 251 and 65537 (e.g. 1021, 4093, 16381)", c.MaglevTableSize)
	}
	if errs := validation.IsDNS1123Subdomain(c.Name); len(errs) > 0 {
		return fmt.Errorf("name: %q is not a valid member name: %s", c.Name, strings.Join(errs, "; "))
	}
	for k, v := range c.Labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("labels: key %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Errorf("labels: value %q of %q: %s", v, k, strings.Join(errs, "; "))
		}
	}
	if err := c.Speaker.validate(c.Name); err != nil {
		return err
	}
	if err := c.validateGatewaySync(); err != nil {
		return err
	}
	if err := checkBind("metricsBindAddress", c.MetricsBindAddress); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i, n := range c.Nodes {
		field := fmt.Sprintf("nodes[%d]", i)
		if errs := validation.IsDNS1123Subdomain(n.Name); len(errs) > 0 {
			return fmt.Errorf("%s.name: %q is not a valid node name: %s", field, n.Name, strings.Join(errs, "; "))
		}
		if seen[n.Name] {
			return fmt.Errorf("%s.name: node %q is listed twice", field, n.Name)
		}
		seen[n.Name] = true
		if len(n.Addresses) == 0 {
			return fmt.Errorf("%s.addresses: node %q needs at least one address", field, n.Name)
		}
		if err := checkHostAddrs(field+".addresses", n.Addresses, true); err != nil {
			return err
		}
	}
	return checkTableName(c.TableName)
}

func parseAddrList(field string, in []string) ([]netip.Addr, error) {
	var out []netip.Addr
	for i, s := range in {
		a, err := parseIP(fmt.Sprintf("%s[%d]", field, i), s)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// parsePrefixList parses CIDRs keeping host bits, so that Validate can refuse them by name.
func parsePrefixList(field string, in []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, s := range in {
		f := fmt.Sprintf("%s[%d]", field, i)
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fieldErr(f, "%q is not a valid CIDR", s)
		}
		if p.Addr().Zone() != "" || p.Addr().Is4In6() {
			return nil, fieldErr(f, "%q: zones and IPv4-mapped IPv6 prefixes are not allowed", s)
		}
		out = append(out, p)
	}
	return out, nil
}

func parseAddrPort(field, s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fieldErr(field, "%q is not an IP:port (IPv6 as [addr]:port)", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

func parseLogging(level, format string) (Logging, error) {
	var l Logging
	l.Level = hclog.Info
	if level != "" {
		l.Level = hclog.LevelFromString(level)
		if l.Level == hclog.NoLevel || l.Level == hclog.Off {
			return l, fmt.Errorf("logLevel: %q is not a level (want trace, debug, info, warn or error)", level)
		}
	}
	switch format {
	case "", "text":
	case "json":
		l.JSON = true
	default:
		return l, fmt.Errorf("logFormat: %q is not supported (want text or json)", format)
	}
	return l, nil
}

// checkHostAddrs checks a list of own addresses: usable unicast, no duplicates, and (if onePerFamily)
// at most one per family.
func checkHostAddrs(field string, addrs []netip.Addr, onePerFamily bool) error {
	seen := map[Family]netip.Addr{}
	for i, a := range addrs {
		f := fmt.Sprintf("%s[%d]", field, i)
		if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() {
			return fieldErr(f, "%s is not a usable unicast address", a)
		}
		if slices.Contains(addrs[:i], a) {
			return fieldErr(f, "%s is listed twice", a)
		}
		if prev, ok := seen[FamilyOf(a)]; ok && onePerFamily {
			return fieldErr(f, "%s: only one %s address allowed (already have %s)", a, familyName(FamilyOf(a)), prev)
		}
		seen[FamilyOf(a)] = a
	}
	return nil
}

// checkPrefixes checks that CIDRs have no host bits and, when families is not nil, that each is of a
// family the host has an address in (otherwise the host could not serve it).
func checkPrefixes(field string, prefixes []netip.Prefix, families []Family, familiesField string) error {
	for i, p := range prefixes {
		f := fmt.Sprintf("%s[%d]", field, i)
		if p != p.Masked() {
			return fieldErr(f, "%s has host bits set (did you mean %s?)", p, p.Masked())
		}
		if slices.Contains(prefixes[:i], p) {
			return fieldErr(f, "%s is listed twice", p)
		}
		if families != nil && !slices.Contains(families, FamilyOf(p.Addr())) {
			return fieldErr(f, "%s is %s but %s has no %s address", p, familyName(FamilyOf(p.Addr())), familiesField, familyName(FamilyOf(p.Addr())))
		}
	}
	return nil
}

func checkBind(field string, ap netip.AddrPort) error {
	if !ap.IsValid() || ap.Port() == 0 {
		return fieldErr(field, "%s needs an address and a non-zero port", ap)
	}
	return nil
}

func checkTableName(name string) error {
	if !tableNameRE.MatchString(name) {
		return fmt.Errorf("tableName: %q is invalid (a letter, then up to 63 letters, digits, _ or -)", name)
	}
	return nil
}

func familiesOf(addrs []netip.Addr) []Family {
	var fs []Family
	for _, a := range addrs {
		if !slices.Contains(fs, FamilyOf(a)) {
			fs = append(fs, FamilyOf(a))
		}
	}
	return fs
}

// routeFastPathFile is the gateway file's routeFastPath: {enabled: true, devices: [eth0]}.
type routeFastPathFile struct {
	Enabled *bool    `json:"enabled"`
	Devices []string `json:"devices"`
}

// DefaultRouteFastPath says whether forwarding: route uses the netdev fast path when the file does
// not say: it does (docs/gateway-results.md, "Per-packet cost"); `routeFastPath: {enabled: false}` keeps
// the dup shape only.
const DefaultRouteFastPath = true

// parseRouteFastPath reads routeFastPath for forwarding fwd ("" is the default, nodePort).
func parseRouteFastPath(f *routeFastPathFile, fwd Forwarding) (bool, []string, error) {
	if f == nil {
		return DefaultRouteFastPath && fwd == ForwardRoute, nil, nil
	}
	on := DefaultRouteFastPath
	if f.Enabled != nil {
		on = *f.Enabled
	}
	if fwd != ForwardRoute && (f.Enabled != nil && on || len(f.Devices) > 0) {
		return false, nil, fmt.Errorf("routeFastPath: only with forwarding: %s", ForwardRoute)
	}
	for _, d := range f.Devices {
		if err := ValidInterfaceName(d); err != nil {
			return false, nil, fmt.Errorf("routeFastPath.devices: %q is not an interface name: %w", d, err)
		}
	}
	return on && fwd == ForwardRoute, slices.Clone(f.Devices), nil
}

// NATFastPath is the gateway's NAT fast path (forwarding direct and nodePort).
type NATFastPath struct {
	Enabled bool
	// Devices are the interfaces it takes packets from, the clients' and the replies' (empty:
	// every up interface but loopback and devices with a master, re-read at each sync).
	Devices []string
	// FlowTableSize is its flow table's size in entries, two per flow (0: the default, 262,144).
	FlowTableSize int
	// SNATPortMin..SNATPortMax are the ports it masquerades to (0: the default, 61000-65535).
	SNATPortMin, SNATPortMax uint16
	// Attach is where its program runs on each device: "auto" (the default, ""): XDP where the
	// driver runs it natively (not veths, not under VLANs), tc elsewhere; "xdp"; "tc"
	// (gateway/natpath's AttachMode).
	Attach string
}

// natFastPathFile is the gateway file's natFastPath: {enabled: true, devices: [eth0],
// flowTableSize: 262144, snatPorts: "61000-65535", attach: auto}.
type natFastPathFile struct {
	Enabled       *bool    `json:"enabled"`
	Devices       []string `json:"devices"`
	FlowTableSize *int     `json:"flowTableSize"`
	SNATPorts     string   `json:"snatPorts"`
	Attach        string   `json:"attach"`
}

// DefaultNATFastPath says whether forwarding direct and nodePort use the NAT fast path when the
// file does not say: they do (docs/gateway.md, "NAT fast path").
const DefaultNATFastPath = true

// parseNATFastPath reads natFastPath for forwarding fwd ("" is the default, nodePort).
func parseNATFastPath(f *natFastPathFile, fwd Forwarding) (NATFastPath, error) {
	nat := fwd == "" || fwd == ForwardNodePort || fwd == ForwardDirect
	if f == nil {
		return NATFastPath{Enabled: DefaultNATFastPath && nat}, nil
	}
	out := NATFastPath{Enabled: DefaultNATFastPath}
	if f.Enabled != nil {
		out.Enabled = *f.Enabled
	}
	if !nat && (f.Enabled != nil && out.Enabled || len(f.Devices) > 0 || f.FlowTableSize != nil || f.SNATPorts != "" || f.Attach != "") {
		return NATFastPath{}, fmt.Errorf("natFastPath: only with forwarding: %s or %s (route has routeFastPath)", ForwardNodePort, ForwardDirect)
	}
	out.Enabled = out.Enabled && nat
	for _, d := range f.Devices {
		if err := ValidInterfaceName(d); err != nil {
			return NATFastPath{}, fmt.Errorf("natFastPath.devices: %q is not an interface name: %w", d, err)
		}
	}
	out.Devices = slices.Clone(f.Devices)
	if f.FlowTableSize != nil {
		if n := *f.FlowTableSize; n < 1024 || n > 1<<26 {
			return NATFastPath{}, fmt.Errorf("natFastPath.flowTableSize: %d: must be 1024 to %d entries (two per flow)", n, 1<<26)
		}
		out.FlowTableSize = *f.FlowTableSize
	}
	if f.SNATPorts != "" {
		lo, hi, ok := strings.Cut(f.SNATPorts, "-")
		a, errA := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
		b, errB := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
		if !ok || errA != nil || errB != nil || a == 0 || a > b {
			return NATFastPath{}, fmt.Errorf("natFastPath.snatPorts: %q is not a port range like 61000-65535", f.SNATPorts)
		}
		if b-a < 1023 {
			return NATFastPath{}, fmt.Errorf("natFastPath.snatPorts: %q: at least 1024 ports (each backend port takes one per masqueraded flow)", f.SNATPorts)
		}
		// What the program does not take conntrack masquerades to ports on one side of the range
		// (the larger): keep 1,024 for it.
		if a < 2048 && b > 64511 {
			return NATFastPath{}, fmt.Errorf("natFastPath.snatPorts: %q: leave 1,024 ports above 1023 on one side for the flows conntrack masquerades (e.g. 61000-65535)", f.SNATPorts)
		}
		out.SNATPortMin, out.SNATPortMax = uint16(a), uint16(b)
	}
	switch f.Attach {
	case "", "auto", "xdp", "tc":
		out.Attach = f.Attach
	default:
		return NATFastPath{}, fmt.Errorf("natFastPath.attach: %q: auto, xdp or tc", f.Attach)
	}
	return out, nil
}

// ValidInterfaceName says why d cannot be a Linux interface name, as the kernel's dev_valid_name
// does (nil: it can): such a name in the config could only ever fail to be hooked, at every sync.
func ValidInterfaceName(d string) error {
	switch {
	case d == "":
		return errors.New("empty")
	case len(d) > 15:
		return fmt.Errorf("%d bytes, longer than 15 (IFNAMSIZ-1)", len(d))
	case d == "." || d == "..":
		return errors.New("a path component, not a name")
	}
	for _, r := range d {
		switch {
		case r == '/' || r == ':':
			return fmt.Errorf("%q is not allowed", r)
		case r == '"' || r == 0:
			return fmt.Errorf("%q is not allowed here", r) // the kernel would take '"': nft text would not
		case r <= ' ' || r == 0x7f:
			return errors.New("white space or control characters")
		}
	}
	return nil
}
