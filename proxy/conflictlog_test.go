package proxy

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"

	"github.com/vipgate/vipgate/cluster"
)

type recordedEvents struct{ events []string }

func (r *recordedEvents) Event(ref *corev1.ObjectReference, eventType, reason, message string) {
	r.events = append(r.events, ref.Namespace+"/"+ref.Name+" "+string(ref.UID)+" "+eventType+" "+reason+": "+message)
}

// TestConflictLog: a conflict is logged and recorded as an Event on its Service once, when it
// appears, although every sync reports it; its resolution is logged.
func TestConflictLog(t *testing.T) {
	var buf bytes.Buffer
	ev := &recordedEvents{}
	c := &conflictLog{log: hclog.New(&hclog.LoggerOptions{Output: &buf}), events: ev}
	key := cluster.ServiceKey{Namespace: "default", Name: "aaa-capture"}
	st := &cluster.State{Services: map[cluster.ServiceKey]*cluster.Service{key: {Key: key, UID: "u-1"}}}
	conflict := cluster.Rejection{Kind: "Service", Object: "default/aaa-capture", Reason: "udp 10.96.0.10:53 is held by Service kube-system/kube-dns"}
	c.report(st, []cluster.Rejection{conflict})
	c.report(st, []cluster.Rejection{conflict})
	if len(ev.events) != 1 || !strings.Contains(ev.events[0], "default/aaa-capture u-1 Warning Rejected: vipgate does not program part of this Service: udp 10.96.0.10:53") {
		t.Errorf("events %q", ev.events)
	}
	if n := strings.Count(buf.String(), "not programmed"); n != 1 {
		t.Errorf("logged %d times:\n%s", n, buf.String())
	}
	c.report(st, nil)
	if !strings.Contains(buf.String(), "conflict resolved") {
		t.Errorf("resolution not logged:\n%s", buf.String())
	}
}
