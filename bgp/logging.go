package bgp

import (
	"context"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// hclogHandler forwards GoBGP's slog records to vipgate's hclog logger, so one process has one log
// format. GoBGP logs every FSM transition at Info; those are useful and rare, so levels map 1:1.
type hclogHandler struct {
	log   hclog.Logger
	attrs []any
	group string
}

func newSlogLogger(l hclog.Logger) *slog.Logger {
	return slog.New(&hclogHandler{log: l})
}

func (h *hclogHandler) Enabled(_ context.Context, level slog.Level) bool {
	return h.log.GetLevel() <= hclogLevel(level)
}

func (h *hclogHandler) Handle(_ context.Context, r slog.Record) error {
	if h.log.GetLevel() > hclogLevel(r.Level) {
		return nil
	}
	args := make([]any, 0, len(h.attrs)+2*r.NumAttrs())
	args = append(args, h.attrs...)
	r.Attrs(func(a slog.Attr) bool {
		args = append(args, h.key(a.Key), a.Value.Resolve().Any())
		return true
	})
	h.log.Log(hclogLevel(r.Level), r.Message, args...)
	return nil
}

func (h *hclogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	n := *h
	n.attrs = append([]any(nil), h.attrs...)
	for _, a := range attrs {
		n.attrs = append(n.attrs, h.key(a.Key), a.Value.Resolve().Any())
	}
	return &n
}

func (h *hclogHandler) WithGroup(name string) slog.Handler {
	n := *h
	n.group = h.key(name)
	return &n
}

func (h *hclogHandler) key(k string) string {
	if h.group == "" {
		return k
	}
	return h.group + "." + k
}

func hclogLevel(l slog.Level) hclog.Level {
	switch {
	case l < slog.LevelInfo:
		return hclog.Debug
	case l < slog.LevelWarn:
		return hclog.Info
	case l < slog.LevelError:
		return hclog.Warn
	}
	return hclog.Error
}
