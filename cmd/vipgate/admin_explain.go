package main

import (
	"encoding/json"
	"net/http"

	"github.com/vipgate/vipgate/explain"
	"github.com/vipgate/vipgate/speaker"
)

// /explain on the admin endpoint: the speaker's current decisions for the LoadBalancer IPs of one
// Service (?service=NAMESPACE/NAME) or one IP (?vip=ADDR), with each speaker's reason, as
// speaker.Explanation JSON. `vipgate explain --service/--vip` reads it (explain.FetchSpeaker).
//
// Threat model: it is served on the admin endpoint's socket, so it has that socket's exposure:
// metricsBindAddress, 127.0.0.1:10249 by default (local processes only; a wider address is the
// operator's choice and is logged as such). Whoever reaches it can read what /status already
// shows (VIPs, owners, reasons, peers), plus the other speakers' candidacy and the BGP attributes
// the manifests configure; no secret (BGP passwords, membership keys) is in the document. It
// changes nothing: GET and HEAD only, and the query is one Service key or one address, parsed
// strictly (a longer or malformed query is a 400). The answer is computed from the speaker's
// State for that one IP's Services, so a request costs one IP's decision per speaker.

// speakerExplainer is what a speaker implements to answer /explain (l2Speaker: its Controller).
type speakerExplainer interface {
	Explain(q speaker.ExplainQuery) (speaker.Explanation, error)
}

// maxExplainQuery bounds the query string: a namespace (63) and a name (253), or an address.
const maxExplainQuery = 512

// Explain explains the VIPs q names as this speaker decides them now.
func (s *l2Speaker) Explain(q speaker.ExplainQuery) (speaker.Explanation, error) {
	return s.ctrl.Explain(q)
}

// explainer returns the speaker behind the VIP lister (nil: none runs here).
func (a *adminServer) explainer() speakerExplainer {
	a.mu.Lock()
	v := a.vips
	a.mu.Unlock()
	if c, ok := v.(ctsyncStatus); ok {
		v = c.vipLister
	}
	e, _ := v.(speakerExplainer)
	return e
}

func (a *adminServer) serveExplain(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if len(r.URL.RawQuery) > maxExplainQuery {
		http.Error(w, "query too long", http.StatusBadRequest)
		return
	}
	qv := r.URL.Query()
	if len(qv["service"]) > 1 || len(qv["vip"]) > 1 {
		http.Error(w, "one service or one vip", http.StatusBadRequest)
		return
	}
	q, err := explain.ParseQuery(qv.Get("service"), qv.Get("vip"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e := a.explainer()
	if e == nil {
		http.Error(w, "no speaker runs in this agent", http.StatusNotFound)
		return
	}
	out, err := e.Explain(q)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		a.log.Debug("writing /explain", "err", err)
	}
}
