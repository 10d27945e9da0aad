package apiserver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// EnvKubeControllerManager points at kube-controller-manager (default: next to kube-apiserver, the
// module's bin/ from `make k8s`).
const EnvKubeControllerManager = "VIPGATE_KUBE_CONTROLLER_MANAGER"

// StartTokenControllers runs kube-controller-manager with two controllers only, as a cluster has
// them: the service-account token controller, which fills kubernetes.io/service-account-token
// Secrets (a token signed with the server's service-account key, and the CA), and the root CA
// publisher, which writes the ConfigMap kube-root-ca.crt in every namespace. The test is skipped
// without the binary; t.Cleanup stops it.
func (s *Server) StartTokenControllers(t testing.TB) {
	t.Helper()
	bin := os.Getenv(EnvKubeControllerManager)
	if bin == "" {
		bin = filepath.Join(filepath.Dir(s.apiBin), "kube-controller-manager")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("kube-controller-manager not found (%v): set %s or run `make k8s`", err, EnvKubeControllerManager)
	}
	p, err := s.spawn("kube-controller-manager", bin,
		"--kubeconfig", s.Kubeconfig,
		"--controllers", "serviceaccount-token-controller,root-ca-certificate-publisher-controller",
		"--service-account-private-key-file", s.pki.ServiceAccountKey,
		"--root-ca-file", s.pki.CACert,
		"--use-service-account-credentials=false",
		"--leader-elect=false",
		"--secure-port=0",
		"--v=1",
	)
	if err != nil {
		t.Fatalf("starting kube-controller-manager: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(p.logPath); err == nil {
				lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
				t.Logf("--- kube-controller-manager log:\n%s", strings.Join(lines[max(0, len(lines)-30):], "\n"))
			}
		}
		p.stop(time.Second)
	})
}
