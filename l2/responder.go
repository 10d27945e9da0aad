package l2

import (
	"net"
	"net/netip"
	"time"

	"github.com/hashicorp/go-hclog"
)

// ownerFunc tells a responder whether to answer for ip on the named
// interface: DropNone to answer, DropNotOurs or DropWrongInterface not to.
// It is the only way a responder learns about ownership, so a responder can
// never answer for an address the Announcer does not currently own.
type ownerFunc func(ip netip.Addr, iface string) DropReason

// responder is one open socket answering for one address family on one
// interface. arpResponder and ndpResponder implement it.
type responder interface {
	// iface is the interface the socket was opened on, as it was then.
	iface() *net.Interface
	// gratuitous announces ip with this interface's MAC address.
	gratuitous(ip netip.Addr) error
	// close stops the read loop and closes the socket. It waits for the
	// read loop to return.
	close() error
}

// countOutcome records one handled packet in the metrics. Anything that
// parsed as a valid question counts as a received request, whatever we did
// with it, so requests_received - replies_sent is what we ignored.
func countOutcome(m *metrics, iface, family string, r DropReason) {
	if r.isRequest() {
		m.requests.WithLabelValues(iface, family).Inc()
	}
	if r != DropNone {
		m.dropped.WithLabelValues(iface, family, r.String()).Inc()
	}
}

// readErrorPause is how long a read loop waits after a socket error other
// than close. Errors such as ENETDOWN are reported once per event by the
// kernel; the pause only keeps a persistent error from spinning a CPU.
const readErrorPause = 100 * time.Millisecond

// errorLimiter rate-limits log lines on hot paths: one per interval.
type errorLimiter struct {
	interval time.Duration
	last     time.Time
}

func (l *errorLimiter) log(logger hclog.Logger, msg string, args ...any) {
	now := time.Now()
	if now.Sub(l.last) < l.interval {
		return
	}
	l.last = now
	logger.Warn(msg, args...)
}
