// Package ctsync replicates a gateway's conntrack table to its peer gateway with conntrackd (FTFW
// over unicast UDP), so that the NAT state of a flow outlives the gateway that created it. It
// renders conntrackd's configuration (a pure function), supervises the daemon (start, restart with
// backoff, stop), decides which gateway answers for each SNAT address, and programs the small
// nftables table that SNATs to this gateway's SNAT address. See docs/gateway.md, "SNAT gateways and
// conntrack sync".
package ctsync

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
)

// conntrackd's side of the sync relay (package relay, under this one): conntrackd listens on
// DaemonAddress and sends to RelayAddress, both on loopback, with Config.Port. Nothing from the LAN
// reaches either: the kernel drops a packet from outside to a loopback address (a martian). Only
// the relay listens on the LAN, and it hands conntrackd only what the peer's relay signed.
var (
	DaemonAddress = netip.MustParseAddr("127.0.0.1")
	RelayAddress  = netip.MustParseAddr("127.0.0.2")
)

// Config is what conntrackd needs to know.
type Config struct {
	// Interface carries the sync messages (conntrackd sizes its datagrams to its MTU: the relay
	// sends them on it); LocalAddress is this gateway's address on it, Peer the other gateway's,
	// where the relays listen; Port the UDP port (both ends use the same), of the relays on the
	// LAN and of conntrackd and its relay on loopback.
	Interface    string
	LocalAddress netip.Addr
	Peer         netip.Addr
	Port         int
	// Dir holds conntrackd's config, lock file, control socket and log (vipgate's state dir or a
	// temporary directory; never /etc or /var/run).
	Dir string
	// Ignore are addresses whose flows are not replicated: the gateway's own (BGP sessions,
	// heartbeats, health probes, the sync traffic itself), which mean nothing on the peer.
	Ignore []netip.Addr
}

// Paths are the files conntrackd uses, all inside Config.Dir.
type Paths struct {
	Config, Lock, Socket, Log string
}

// PathsOf returns the files of a Config's directory.
func PathsOf(dir string) Paths {
	return Paths{
		Config: filepath.Join(dir, "conntrackd.conf"),
		Lock:   filepath.Join(dir, "conntrackd.lock"),
		Socket: filepath.Join(dir, "conntrackd.ctl"),
		Log:    filepath.Join(dir, "conntrackd.log"),
	}
}

// ifaceName is what an interface name may look like in the config file (no spaces, braces, quotes
// or comment signs that would change its meaning).
var ifaceName = regexp.MustCompile(`^[A-Za-z0-9_.:@-]{1,15}$`)

// safePath is a directory conntrackd's parser reads back unchanged.
var safePath = regexp.MustCompile(`^/[A-Za-z0-9_./+-]*$`)

// Render returns conntrackd's configuration for c. Choices, and why:
//
//   - Mode FTFW: reliable (acknowledged, resent) replication, the mode the conntrackd manual
//     recommends for fail-over.
//   - DisableExternalCache on: entries received from the peer go straight into this gateway's kernel
//     table. Both gateways forward at the same time (ECMP), so there is no "backup" that could commit
//     an external cache at fail-over: the survivor must already hold the dead gateway's flows when
//     the router moves them, before anything could notice the death.
//   - StartupResync on: a gateway that (re)starts asks its peer for the whole table, so a gateway
//     coming back holds the flows that moved to the peer while it was away (and were created there).
//   - Unicast UDP: a pair needs no multicast; it works across routed links too.
//   - On loopback only (DaemonAddress, RelayAddress): FTFW has no authentication, and whatever
//     reaches conntrackd's port goes into the kernel table or asks for a dump; vipgate's relay
//     carries the datagrams to the peer, signed. Interface stays the sync link: conntrackd packs
//     its datagrams up to that interface's MTU (loopback's would be 64 KiB).
//   - Filter From Kernelspace: TCP, UDP and SCTP only, and not the gateway's own traffic.
//   - Systemd off, Syslog off, its own log file: vipgate supervises it, not systemd.
func Render(c Config) (string, error) {
	if err := c.validate(); err != nil {
		return "", err
	}
	p := PathsOf(c.Dir)
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by vipgate gateway (conntrackSync); overwritten at every start.
Sync {
	Mode FTFW {
		DisableExternalCache on
		StartupResync on
	}
	UDP {
		IPv4_address %s
		IPv4_Destination_Address %s
		Port %d
		Interface %s
		SndSocketBuffer 1249280
		RcvSocketBuffer 1249280
		Checksum on
	}
}
General {
	Systemd off
	HashSize 32768
	HashLimit 262144
	LogFile %s
	Syslog off
	LockFile %s
	UNIX {
		Path %s
	}
	NetlinkBufferSize 2097152
	NetlinkBufferSizeMaxGrowth 8388608
	NetlinkEventsReliable on
	Filter From Kernelspace {
		Protocol Accept {
			TCP
			UDP
			SCTP
		}
`, DaemonAddress, RelayAddress, c.Port, c.Interface, p.Log, p.Lock, p.Socket)
	ignore := []netip.Addr{DaemonAddress, RelayAddress, netip.IPv6Loopback(), c.LocalAddress, c.Peer}
	for _, a := range c.Ignore {
		if a.IsValid() && !contains(ignore, a.Unmap()) {
			ignore = append(ignore, a.Unmap())
		}
	}
	b.WriteString("\t\tAddress Ignore {\n")
	for _, a := range ignore {
		f := "IPv4"
		if a.Is6() {
			f = "IPv6"
		}
		fmt.Fprintf(&b, "\t\t\t%s_address %s\n", f, a)
	}
	b.WriteString("\t\t}\n\t}\n}\n")
	return b.String(), nil
}

func contains(s []netip.Addr, a netip.Addr) bool {
	for _, x := range s {
		if x == a {
			return true
		}
	}
	return false
}

func (c Config) validate() error {
	switch {
	case !ifaceName.MatchString(c.Interface):
		return fmt.Errorf("conntrack sync: interface %q is not an interface name", c.Interface)
	case !c.Peer.IsValid() || !c.LocalAddress.IsValid():
		return fmt.Errorf("conntrack sync: need both a local address and a peer (have %v, %v)", c.LocalAddress, c.Peer)
	case c.Peer.Unmap().Is4() != c.LocalAddress.Unmap().Is4():
		return fmt.Errorf("conntrack sync: local address %s and peer %s are of different families", c.LocalAddress, c.Peer)
	case c.Peer == c.LocalAddress:
		return fmt.Errorf("conntrack sync: the peer %s is the local address", c.Peer)
	case c.Port < 1 || c.Port > 65535:
		return fmt.Errorf("conntrack sync: port %d is out of range 1-65535", c.Port)
	case !safePath.MatchString(c.Dir) || strings.Contains(c.Dir, ".."):
		return fmt.Errorf("conntrack sync: state directory %q must be an absolute path of letters, digits and ./_+-", c.Dir)
	case len(PathsOf(c.Dir).Socket) > 100:
		return fmt.Errorf("conntrack sync: state directory %q is too long for a UNIX socket path", c.Dir)
	}
	return nil
}
