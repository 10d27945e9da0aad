package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipgate/vipgate/test/apiserver"
	"github.com/vipgate/vipgate/test/lab"
)

// startKubeNodes registers every lab node as a Node (its InternalIP) with the API server srv and
// starts `vipgate node` on it against srv, with the lab's node config plus extra(n) (nil: none).
// On failure the test's log gets each agent's last lines.
func startKubeNodes(ctx context.Context, t *testing.T, l *lab.Lab, srv *apiserver.Server, bin string, extra func(*lab.Node) string) map[string]*lab.Proc {
	t.Helper()
	procs := map[string]*lab.Proc{}
	for _, n := range l.Nodes() {
		if _, err := srv.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name},
			Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IPv4.String()}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		config := labNodeConfig(n)
		if extra != nil {
			config += extra(n)
		}
		cfg := filepath.Join(t.TempDir(), n.Name+".yaml")
		if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := l.Start(n.Name, "", append([]string{bin, "node", "--config", cfg, "--kubeconfig", srv.Kubeconfig}, memberKeyArgs(t)...)...)
		if err != nil {
			t.Fatal(err)
		}
		procs[n.Name] = p
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range procs {
				t.Logf("--- vipgate on %s:\n%s", name, p.Tail(30))
			}
		}
	})
	return procs
}
