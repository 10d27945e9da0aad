package l2

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// LinkState is one interface of this host with its link state, for the speaker's link-aware
// ownership (speaker.LinkState): a node withdraws from the L2 segments whose VIPs it announces
// on a link that is down.
type LinkState struct {
	Name string
	// Up: administratively up (IFF_UP) and operationally up (IFF_RUNNING: operstate up or unknown;
	// a lost carrier clears it).
	Up bool
	// Prefixes are its addresses with their prefix lengths, masked; link-local ones left out. A
	// link set down may have lost its IPv6 addresses: the speaker remembers the last ones it saw.
	Prefixes []netip.Prefix
}

// linkUp says whether a link carries traffic: IFF_UP and IFF_RUNNING (the kernel sets RUNNING
// while the operstate is up or unknown, so a lost carrier or a lower layer down clears it).
func linkUp(a *netlink.LinkAttrs) bool {
	return a.Flags&net.FlagUp != 0 && a.RawFlags&unix.IFF_RUNNING != 0
}

// LinkStates lists this host's interfaces but loopback, up or not, with their prefixes, in the
// network namespace of the calling thread.
func LinkStates() ([]LinkState, error) {
	links, byLink, err := linksAndAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]LinkState, 0, len(links))
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 {
			continue
		}
		s := LinkState{Name: a.Name, Up: linkUp(a)}
		for _, ad := range byLink[a.Index] {
			if ad.IPNet == nil {
				continue
			}
			if p, err := netip.ParsePrefix(ad.IPNet.String()); err == nil && !p.Addr().IsLinkLocalUnicast() {
				s.Prefixes = append(s.Prefixes, p.Masked())
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// WatchLinks calls changed for every link update the kernel sends (RTNLGRP_LINK) until ctx ends:
// the link's name and whether it is up (linkUp; a deleted link is down). It calls changed with
// name "" when the caller must read every link again: after the subscription starts, and after it
// was lost (the socket's buffer overflowed under a burst of updates: updates were lost) and taken
// again, one second later. It subscribes in the network namespace of the calling thread and
// returns once the first subscription is taken (an error if it cannot be).
//
// Threat model: the socket is a NETLINK_ROUTE socket bound to the link multicast group. Only the
// kernel sends to that group (NETLINK_ROUTE allows no user-space sender to its groups), and the
// library drops messages whose sender port is not the kernel's; what arrives is the kernel's own
// account of the links of this namespace, which whoever can change the links (CAP_NET_ADMIN)
// controls anyway. Nothing from the network reaches it. The worst a flood of real link changes
// (pods' veths) can do is overflow the buffer: then every link is read again.
func WatchLinks(ctx context.Context, changed func(name string, up bool), logf func(msg string, err error)) error {
	subscribe := func() (chan netlink.LinkUpdate, error) {
		ch := make(chan netlink.LinkUpdate, 64)
		err := netlink.LinkSubscribeWithOptions(ch, ctx.Done(), netlink.LinkSubscribeOptions{
			ErrorCallback: func(err error) {
				// The socket closed by ctx fails its last Receive: not worth a line.
				if logf != nil && ctx.Err() == nil {
					logf("link updates", err)
				}
			},
		})
		return ch, err
	}
	ch, err := subscribe()
	if err != nil {
		return fmt.Errorf("subscribing to link updates: %w", err)
	}
	go func() {
		for {
			changed("", false)
			for u := range ch {
				if u.Link == nil {
					continue
				}
				a := u.Link.Attrs()
				changed(a.Name, u.Header.Type != unix.RTM_DELLINK && linkUp(a))
			}
			// The subscription ended: ctx, or the socket failed (updates were lost).
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
				if ch, err = subscribe(); err == nil {
					break
				}
				if logf != nil {
					logf("subscribing to link updates again", err)
				}
			}
		}
	}()
	return nil
}
