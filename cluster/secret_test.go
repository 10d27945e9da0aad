package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/test/apiserver"
)

// TestDecodeBGPSecret: a basic-auth Secret with a password (data or stringData) is read for BGPPeer
// passwordSecret; any other Secret is rejected alone, with a reason that shows no secret data.
func TestDecodeBGPSecret(t *testing.T) {
	for _, c := range []struct {
		name, doc, err string
		password       string
	}{
		{"data", "apiVersion: v1\nkind: Secret\nmetadata: {name: tor, namespace: metallb-system}\ntype: kubernetes.io/basic-auth\ndata: {password: czNjcmV0}\n", "", "s3cret"},
		{"stringData", "apiVersion: v1\nkind: Secret\nmetadata: {name: tor}\ntype: kubernetes.io/basic-auth\nstringData: {password: plain}\n", "", "plain"},
		{"opaque", "apiVersion: v1\nkind: Secret\nmetadata: {name: tor}\ntype: Opaque\nstringData: {password: hidden1}\n", "type: \"Opaque\"", ""},
		{"no password", "apiVersion: v1\nkind: Secret\nmetadata: {name: tor}\ntype: kubernetes.io/basic-auth\nstringData: {username: u}\n", "data.password: required", ""},
		{"unknown field", "apiVersion: v1\nkind: Secret\nmetadata: {name: tor}\ntype: kubernetes.io/basic-auth\nstringData: {password: hidden2}\nextra: 1\n", "extra", ""},
	} {
		ds := decodeDocument([]byte(c.doc))
		if len(ds) != 1 {
			t.Fatalf("%s: %d objects", c.name, len(ds))
		}
		d := ds[0]
		if c.err != "" {
			if d.err == nil || !strings.Contains(d.err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.name, d.err, c.err)
			}
			if d.err != nil && (strings.Contains(d.err.Error(), "hidden")) {
				t.Errorf("%s: the error shows the secret: %v", c.name, d.err)
			}
			continue
		}
		s, ok := d.metallb.(*corev1.Secret)
		if d.err != nil || !ok || string(s.Data["password"]) != c.password || s.StringData != nil {
			t.Errorf("%s: %v %+v", c.name, d.err, d.metallb)
		}
	}
}

// TestKubeSourceBGPSecrets: against a real kube-apiserver, WatchBGPSecrets reads the basic-auth
// Secrets of its namespace only: not other types, not other namespaces; changes arrive.
func TestKubeSourceBGPSecrets(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	srv := apiserver.Start(t, apiserver.Options{})
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	must := mustFor(t)
	srv.CreateNamespaces(t, "vipgate-system")
	mk := func(ns, name string, typ corev1.SecretType, pw string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: typ,
			Data: map[string][]byte{"password": []byte(pw), "username": []byte("u")}}
	}
	must(c.CoreV1().Secrets("vipgate-system").Create(ctx, mk("vipgate-system", "tor", corev1.SecretTypeBasicAuth, "one"), metav1.CreateOptions{}))
	must(c.CoreV1().Secrets("vipgate-system").Create(ctx, mk("vipgate-system", "opaque", corev1.SecretTypeOpaque, "x"), metav1.CreateOptions{}))
	must(c.CoreV1().Secrets("default").Create(ctx, mk("default", "elsewhere", corev1.SecretTypeBasicAuth, "y"), metav1.CreateOptions{}))

	rec := newStateRecorder()
	src := NewKubeSource(srv.RESTConfig(), "node1", hclog.NewNullLogger())
	src.WatchBGPSecrets("vipgate-system", []string{"tor", "opaque", "elsewhere"})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- src.Run(runCtx, rec.onChange) }()
	defer func() { stop(); <-done }()

	names := func(st *State) string {
		var out []string
		for _, s := range st.MetalLB.Secrets {
			out = append(out, s.Namespace+"/"+s.Name+"="+string(s.Data["password"]))
		}
		return strings.Join(out, ",")
	}
	rec.wait(t, "the basic-auth Secret of vipgate-system only", func(st *State) bool { return names(st) == "vipgate-system/tor=one" })
	sec := mk("vipgate-system", "tor", corev1.SecretTypeBasicAuth, "two")
	must(c.CoreV1().Secrets("vipgate-system").Update(ctx, sec, metav1.UpdateOptions{}))
	rec.wait(t, "the changed password", func(st *State) bool { return names(st) == "vipgate-system/tor=two" })
}
