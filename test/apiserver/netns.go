package apiserver

import (
	"context"
	"fmt"
	"net"
	"runtime"

	"github.com/vishvananda/netns"
)

// InNetns runs f on an OS thread that has entered the named network namespace (as created by
// `ip netns add`), then moves the thread back. A socket keeps the namespace it was created in, so a
// listener or connection made inside f stays usable from any goroutine afterwards. ns "" runs f
// directly.
func InNetns(ns string, f func() error) error {
	if ns == "" {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		// The thread is locked for the goroutine's life. If moving it back fails, it is never
		// unlocked, so the runtime retires the thread with the goroutine instead of reusing a thread
		// that sits in the wrong namespace.
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("getting the current network namespace: %w", err)
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(ns)
		if err != nil {
			errc <- fmt.Errorf("opening network namespace %s: %w", ns, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("entering network namespace %s: %w", ns, err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("leaving network namespace %s: %w", ns, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

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
