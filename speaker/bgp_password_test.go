package speaker

import (
	"strings"
	"testing"

	metallbv1beta2 "go.universe.tf/metallb/api/v1beta2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/cluster"
)

// TestPeerPasswordSecret: passwordSecret resolves to the basic-auth Secret's password (namespace
// defaulting to the peer's); both fields, a missing Secret or a missing key reject the peer alone,
// and the reason never contains a password.
func TestPeerPasswordSecret(t *testing.T) {
	secret := func(ns, name, pw string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeBasicAuth, Data: map[string][]byte{}}
		if pw != "" {
			s.Data["password"] = []byte(pw)
		}
		return s
	}
	secrets := []*corev1.Secret{secret("metallb-system", "tor", "s3cret"), secret("other", "tor", "elsewhere"), secret("metallb-system", "empty", "")}
	peer := func(name, pw string, ref corev1.SecretReference) *metallbv1beta2.BGPPeer {
		return &metallbv1beta2.BGPPeer{ObjectMeta: metav1.ObjectMeta{Namespace: "metallb-system", Name: name},
			Spec: metallbv1beta2.BGPPeerSpec{MyASN: 64512, ASN: 64512, Address: "192.0.2.1", Password: pw, PasswordSecret: ref}}
	}
	for _, c := range []struct {
		name      string
		p         *metallbv1beta2.BGPPeer
		want, why string
	}{
		{"inline", peer("a", "inline", corev1.SecretReference{}), "inline", ""},
		{"secret in the peer's namespace", peer("b", "", corev1.SecretReference{Name: "tor"}), "s3cret", ""},
		{"secret in another namespace", peer("c", "", corev1.SecretReference{Name: "tor", Namespace: "other"}), "elsewhere", ""},
		{"both", peer("d", "inline", corev1.SecretReference{Name: "tor"}), "", "both password and passwordSecret"},
		{"missing", peer("e", "", corev1.SecretReference{Name: "nope"}), "", "metallb-system/nope does not exist"},
		{"no key", peer("f", "", corev1.SecretReference{Name: "empty"}), "", `has no "password" key`},
	} {
		got, why := peerPassword(c.p, secrets)
		if got != c.want || (c.why == "") != (why == "") || !strings.Contains(why, c.why) {
			t.Errorf("%s: got %q, %q; want %q, %q", c.name, got, why, c.want, c.why)
		}
		for _, s := range secrets {
			if pw := string(s.Data["password"]); pw != "" && strings.Contains(why, pw) {
				t.Errorf("%s: the reason shows a password: %s", c.name, why)
			}
		}
	}
	// Through DecideBGP: the bad peer is a Problem, the good one peers with the Secret's password.
	st := &cluster.State{Nodes: map[string]*cluster.Node{"n1": {Name: "n1"}}, MetalLB: &cluster.MetalLBConfig{
		BGPPeers: []*metallbv1beta2.BGPPeer{peer("good", "", corev1.SecretReference{Name: "tor"}), peer("bad", "", corev1.SecretReference{Name: "nope"})},
		Secrets:  secrets}}
	peers, _, _, problems := DecideBGP(BGPInput{Self: "n1", State: st})
	if len(peers) != 1 || peers[0].Name != "metallb-system/good" || peers[0].Password != "s3cret" {
		t.Errorf("peers %+v: want only metallb-system/good, with the Secret's password", peers)
	}
	if len(problems) != 1 || problems[0].Object != (ObjectRef{"BGPPeer", "metallb-system", "bad"}) {
		t.Errorf("problems %+v: want BGPPeer metallb-system/bad", problems)
	}
}
