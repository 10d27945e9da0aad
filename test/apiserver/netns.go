package apiserver

import (
	"context"
	"net"

	"github.com/vipgate/vipgate/test/lab"
)

// InNetns is lab.InNetns: f on a thread in the named network namespace.
var InNetns = lab.InNetns

// DialerInNetns returns a dial function (for rest.Config.Dial or http.Transport.DialContext) whose
// sockets are created inside the named network namespace, so that a test process in the root
// namespace can talk to a server that listens inside a lab namespace. ns "" dials normally.
func DialerInNetns(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if ns == "" {
		var d net.Dialer
		return d.DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := InNetns(ns, func() error {
			// The whole connect happens on the namespaced thread; net.Dialer creates the socket in
			// the calling thread's namespace before it parks on the poller.
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			conn = c
			return err
		})
		if err != nil {
			if conn != nil {
				conn.Close()
			}
			return nil, err
		}
		return conn, nil
	}
}
