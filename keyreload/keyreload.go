// Package keyreload reloads a key file on a period and hands changed keys to whoever uses them:
// a rotated Secret takes effect without a restart. The speakers' membership (cmd/vipgate) and
// the gateways' conntrack sync relay (gateway/) reload their keys with it. It knows no key
// format: the caller reads and applies.
package keyreload

import (
	"bytes"
	"context"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Reloader reads Path with Read every Period and calls Apply with the keys when they differ from
// the last ones applied. A file that cannot be read, or keys Apply refuses, keep the previous
// keys: logged at error with Failed; a change taken is logged at info with Reloaded.
type Reloader struct {
	Path   string
	Period time.Duration
	Read   func(path string) ([][]byte, error)
	Apply  func(keys [][]byte) error
	Log    hclog.Logger
	// Failed and Reloaded are the log messages ("keeping the previous keys", "keys reloaded").
	Failed, Reloaded string
}

// Run reloads until ctx ends; keys are the keys in use when it starts.
func (r Reloader) Run(ctx context.Context, keys [][]byte) {
	t := time.NewTicker(r.Period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if next, changed := r.once(keys); changed {
			keys = next
		}
	}
}

// once reads the file and applies its keys if they changed; it returns the keys in use after it
// and whether they changed.
func (r Reloader) once(keys [][]byte) ([][]byte, bool) {
	next, err := r.Read(r.Path)
	if err == nil && slices.EqualFunc(keys, next, bytes.Equal) {
		return keys, false
	}
	if err == nil {
		err = r.Apply(next)
	}
	if err != nil {
		r.Log.Error(r.Failed, "err", err)
		return keys, false
	}
	r.Log.Info(r.Reloaded, "keys", len(next))
	return next, true
}
