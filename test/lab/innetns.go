package lab

import (
	"fmt"
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
