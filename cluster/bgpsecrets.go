package cluster

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// bgpSecrets reads the named basic-auth Secrets of one namespace (BGPPeer passwordSecret, the BFD
// key annotation): one informer per name, which lists and watches with the field selector
// metadata.name=NAME. The API server authorizes such a list or watch as a request for that one
// object, so a Role whose rule lists the names in resourceNames grants exactly these Secrets and no
// other (deploy/: the chart's bgp.passwordSecrets; test/e2e/deploy_test.go checks the Role against
// this call). It is the node agent's only access to Secrets: Helm's release Secrets, the membership
// key and every other Secret of the namespace stay unreadable.
//
// A name the RBAC does not grant is refused by the API server: it is logged, counts as synced (an
// agent must not wait for it forever: it proxies Services), and is retried in the background, so
// a Role fixed later takes effect without a restart.
type bgpSecrets struct {
	log     hclog.Logger
	names   []string
	infs    []cache.SharedIndexInformer
	refused []*atomic.Bool
}

// byName selects the object called name, and only basic-auth Secrets: BGP passwords, nothing else.
func byName(name string) func(*metav1.ListOptions) {
	return func(o *metav1.ListOptions) {
		o.FieldSelector = fields.AndSelectors(fields.OneTermEqualSelector("metadata.name", name),
			fields.OneTermEqualSelector("type", string(corev1.SecretTypeBasicAuth))).String()
	}
}

// newBGPSecrets prepares one informer per name (none for no names: then no Secret is read).
func newBGPSecrets(client kubernetes.Interface, ns string, names []string, log hclog.Logger) (*bgpSecrets, error) {
	s := &bgpSecrets{log: log, names: names}
	for _, name := range names {
		inf := coreinformers.NewFilteredSecretInformer(client, ns, 0, cache.Indexers{}, byName(name))
		refused := &atomic.Bool{}
		name := name
		err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			if apierrors.IsForbidden(err) {
				if !refused.Swap(true) {
					log.Error("reading a BGP password Secret is refused: grant it by name (Helm: bgp.passwordSecrets)",
						"namespace", ns, "secret", name, "err", err)
				}
				return
			}
			cache.DefaultWatchErrorHandler(ctx, r, err)
		})
		if err != nil {
			return nil, err
		}
		if err := inf.SetTransform(stripManagedFields); err != nil {
			return nil, err
		}
		s.infs = append(s.infs, inf)
		s.refused = append(s.refused, refused)
	}
	return s, nil
}

// start adds handler to every informer and runs them until ctx ends (wg counts them).
func (s *bgpSecrets) start(ctx context.Context, handler cache.ResourceEventHandler, wg *sync.WaitGroup) error {
	for _, inf := range s.infs {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return err
		}
	}
	for _, inf := range s.infs {
		wg.Add(1)
		go func() { defer wg.Done(); inf.Run(ctx.Done()) }()
	}
	return nil
}

// hasSynced says every name has been listed once, or refused.
func (s *bgpSecrets) hasSynced() bool {
	for i, inf := range s.infs {
		if !inf.HasSynced() && !s.refused[i].Load() {
			return false
		}
	}
	return true
}

// list returns the Secrets read.
func (s *bgpSecrets) list() []*corev1.Secret {
	var out []*corev1.Secret
	for _, inf := range s.infs {
		out = append(out, listAll[*corev1.Secret](inf)...)
	}
	return out
}
