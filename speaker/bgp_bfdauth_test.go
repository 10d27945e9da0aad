package speaker

import (
	"strings"
	"testing"
	"time"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metallbv1beta2 "go.universe.tf/metallb/api/v1beta2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/bgp"
	"github.com/vipgate/vipgate/cluster"
)

// TestBFDAuthAnnotations: a BGPPeer's vipgate.io/bfd-auth* annotations give its BFD session RFC 5880
// authentication with the basic-auth Secret's password as the key; an unusable setting is a
// Problem and the peer peers without BFD (never with unauthenticated BFD), and no reason shows the
// key. A BFDProfile's vipgate.io/bfd-max-detect-time bounds the detection time.
func TestBFDAuthAnnotations(t *testing.T) {
	const ns = "metallb-system"
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tor-bfd"}, Type: corev1.SecretTypeBasicAuth,
		Data: map[string][]byte{"password": []byte("bfd-s3cret")}}
	long := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "long"}, Type: corev1.SecretTypeBasicAuth,
		Data: map[string][]byte{"password": []byte("bfd-s3cret-far-too-long-for-sha1")}}
	prof := &metallbv1beta1.BFDProfile{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fast",
		Annotations: map[string]string{BFDMaxDetectTimeAnnotation: "2s"}}}
	peer := func(name string, ann map[string]string) *metallbv1beta2.BGPPeer {
		return &metallbv1beta2.BGPPeer{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
			Spec: metallbv1beta2.BGPPeerSpec{MyASN: 64512, ASN: 64512, Address: "192.0.2.1", BFDProfile: "fast"}}
	}
	for _, c := range []struct {
		name string
		ann  map[string]string
		want *bgp.BFDAuth // nil: no BFD
		why  string
	}{
		{"none", nil, &bgp.BFDAuth{}, ""},
		{"meticulous sha1", map[string]string{BFDAuthAnnotation: "meticulous-keyed-sha1", BFDAuthKeyIDAnnotation: "7", BFDAuthSecretAnnotation: "tor-bfd"},
			&bgp.BFDAuth{Type: "meticulous-keyed-sha1", KeyID: 7, Key: "bfd-s3cret"}, ""},
		{"default key id", map[string]string{BFDAuthAnnotation: "keyed-md5", BFDAuthSecretAnnotation: "tor-bfd"},
			&bgp.BFDAuth{Type: "keyed-md5", KeyID: 1, Key: "bfd-s3cret"}, ""},
		{"unknown type", map[string]string{BFDAuthAnnotation: "simple-password", BFDAuthSecretAnnotation: "tor-bfd"}, nil, "simple-password"},
		{"bad key id", map[string]string{BFDAuthAnnotation: "keyed-sha1", BFDAuthKeyIDAnnotation: "256", BFDAuthSecretAnnotation: "tor-bfd"}, nil, "key ID"},
		{"no secret", map[string]string{BFDAuthAnnotation: "keyed-sha1"}, nil, "needs " + BFDAuthSecretAnnotation},
		{"missing secret", map[string]string{BFDAuthAnnotation: "keyed-sha1", BFDAuthSecretAnnotation: "nope"}, nil, "does not exist"},
		{"key too long", map[string]string{BFDAuthAnnotation: "keyed-sha1", BFDAuthSecretAnnotation: "long"}, nil, "at most 20"},
		{"secret without type", map[string]string{BFDAuthSecretAnnotation: "tor-bfd"}, nil, "without " + BFDAuthAnnotation},
	} {
		st := &cluster.State{Nodes: map[string]*cluster.Node{"n1": {Name: "n1"}}, MetalLB: &cluster.MetalLBConfig{
			BGPPeers: []*metallbv1beta2.BGPPeer{peer("p", c.ann)}, BFDProfiles: []*metallbv1beta1.BFDProfile{prof},
			Secrets: []*corev1.Secret{secret, long}}}
		peers, _, _, problems := DecideBGP(BGPInput{Self: "n1", State: st})
		if len(peers) != 1 {
			t.Fatalf("%s: peers %+v, want the peer (with or without BFD)", c.name, peers)
		}
		got := peers[0].BFD
		switch {
		case c.want == nil && got != nil:
			t.Errorf("%s: BFD %+v, want none", c.name, got)
		case c.want != nil && (got == nil || got.Auth != *c.want || got.MaxDetectTime != 2*time.Second):
			t.Errorf("%s: BFD %+v, want auth %+v and a 2s bound", c.name, got, *c.want)
		}
		var reasons []string
		for _, p := range problems {
			reasons = append(reasons, p.Reason)
		}
		all := strings.Join(reasons, "; ")
		if c.why != "" && !strings.Contains(all, c.why) || c.why == "" && all != "" {
			t.Errorf("%s: problems %q, want one saying %q", c.name, all, c.why)
		}
		if strings.Contains(all, "s3cret") {
			t.Errorf("%s: a problem shows the key: %s", c.name, all)
		}
	}
}
