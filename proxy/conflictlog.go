package proxy

import (
	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vipgate/vipgate/cluster"
)

// conflictLog reports the node's conflicts and refusals (dataplane SyncReport.Conflicts: entries
// held by another Service, addresses the externalIPs policy refuses). Every sync reports all of
// them; each is logged, and recorded as a Warning Event on its Service, once when it appears, and
// logged again when it is resolved. /status always lists all of them.
type conflictLog struct {
	log    hclog.Logger
	events ServiceEventer
	seen   map[cluster.Rejection]bool
}

func (c *conflictLog) report(st *cluster.State, conflicts []cluster.Rejection) {
	now := make(map[cluster.Rejection]bool, len(conflicts))
	// byName finds a conflict's Service by the name the Rejection gives it (ServiceKey.String), built
	// once there is a new conflict to record.
	var byName map[string]*cluster.Service
	for _, r := range conflicts {
		now[r] = true
		if c.seen[r] {
			continue
		}
		c.log.Warn("not programmed", "kind", r.Kind, "object", r.Object, "reason", r.Reason)
		if c.events == nil || r.Kind != "Service" {
			continue
		}
		if byName == nil {
			byName = make(map[string]*cluster.Service, len(st.Services))
			for k, svc := range st.Services {
				byName[k.String()] = svc
			}
		}
		svc := byName[r.Object]
		if svc == nil {
			continue
		}
		c.events.Event(&corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: svc.Key.Namespace, Name: svc.Key.Name, UID: types.UID(svc.UID)},
			corev1.EventTypeWarning, cluster.EventReasonRejected, "vipgate does not program part of this Service: "+r.Reason)
	}
	for r := range c.seen {
		if !now[r] {
			c.log.Info("conflict resolved", "kind", r.Kind, "object", r.Object, "was", r.Reason)
		}
	}
	c.seen = now
}
