package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipgate/vipgate/cluster/mlbstatus"
	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
)

// Event reasons the controller writes on Services and pools.
const (
	EventIPAllocated      = "IPAllocated"
	EventAllocationFailed = "AllocationFailed"
	EventPoolRejected     = "Rejected"
	ControllerComponent   = "vipgate-controller"
)

// LBControllerConfig configures the LoadBalancer IP controller.
type LBControllerConfig struct {
	// LoadBalancerClass is the class this controller serves; "" serves Services without a class.
	LoadBalancerClass string
	// LeaseNamespace and LeaseName name the coordination.k8s.io Lease of the leader election.
	LeaseNamespace, LeaseName string
	// Identity is this replica's name in the Lease (default: host name and pid).
	Identity string
	// StatusNamespace is vipgate's namespace (POD_NAMESPACE), where the leader writes MetalLB's
	// ConfigurationState "controller"; PodName (POD_NAME) is its owner. "" writes no
	// ConfigurationState and no IPAddressPool status.
	StatusNamespace, PodName string
	// Metrics receives the allocator's pool usage after each reconcile of the leader (nil: none).
	Metrics *PoolMetrics
}

// LBController allocates LoadBalancer IPs from MetalLB IPAddressPools and writes them to
// status.loadBalancer.ingress. Only the leader (a Lease) writes; on becoming leader it rebuilds its
// state from every Service's status before it allocates anything new, so a restart or a leader change
// never moves an IP or gives one IP twice.
type LBController struct {
	cfg    *rest.Config
	conf   LBControllerConfig
	log    hclog.Logger
	client kubernetes.Interface

	recorder record.EventRecorder
	alloc    *Allocator
	failed   map[ServiceKey]string
	rejected map[string]string
	// status writes MetalLB's IPAddressPool status and ConfigurationState (nil: not written).
	status *mlbstatus.Writer
}

// NewLBController returns a controller for the cluster cfg points at.
func NewLBController(cfg *rest.Config, conf LBControllerConfig, log hclog.Logger) (*LBController, error) {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if conf.Identity == "" {
		h, _ := os.Hostname()
		conf.Identity = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	if conf.LeaseName == "" {
		conf.LeaseName = "vipgate-controller"
	}
	if conf.LeaseNamespace == "" {
		conf.LeaseNamespace = "vipgate-system"
	}
	return &LBController{cfg: cfg, conf: conf, log: log, client: client, failed: map[ServiceKey]string{}, rejected: map[string]string{}}, nil
}

// Run takes part in the leader election until ctx ends; while leading it allocates.
func (c *LBController) Run(ctx context.Context) error {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	c.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: ControllerComponent})

	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: c.conf.LeaseNamespace, Name: c.conf.LeaseName},
		Client:     c.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.conf.Identity},
	}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		ReleaseOnCancel: true,
		Name:            c.conf.LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				c.log.Info("leading: allocating LoadBalancer IPs", "identity", c.conf.Identity)
				c.lead(ctx)
			},
			OnStoppedLeading: func() {
				c.log.Info("no longer leading", "identity", c.conf.Identity)
				c.conf.Metrics.Observe(nil, 0)
			},
		},
	})
	return nil
}

func (c *LBController) lead(ctx context.Context) {
	c.alloc = nil
	done := make(chan struct{})
	go func() { defer close(done); c.runFinalizers(ctx) }()
	defer func() { <-done }()
	c.status = nil
	if c.conf.StatusNamespace != "" {
		w, err := mlbstatus.New(c.cfg, mlbstatus.Options{Namespace: c.conf.StatusNamespace, Component: mlbstatus.Controller,
			PodName: c.conf.PodName}, c.log.Named("mlbstatus"))
		if err != nil {
			c.log.Error("not writing MetalLB's status resources", "err", err)
		} else {
			c.status = w
			go w.Run(ctx)
		}
	}
	src := NewKubeSource(c.cfg, ControllerComponent, c.log.Named("source"))
	// The pool status writer (mlbstatus) reads each pool's status and writes at its resourceVersion:
	// the controller must see status-only changes, which the nodes' sources skip.
	src.KeepMetalLBStatus()
	if err := src.Run(ctx, func(st *State) { c.reconcile(ctx, st) }); err != nil && ctx.Err() == nil {
		c.log.Error("watching the cluster", "err", err)
	}
}

func (c *LBController) serves(svc *Service) bool {
	return svc.Type == TypeLoadBalancer && svc.LoadBalancerClass == c.conf.LoadBalancerClass
}

// reconcile allocates for every Service of st that needs it and releases what is gone.
func (c *LBController) reconcile(ctx context.Context, st *State) {
	objs := st.MetalLB
	defer c.publishStatus(st)
	defer func() { c.conf.Metrics.Observe(c.alloc, len(c.failed)) }()
	pools, rejected := ParseLBPools(poolsOf(objs))
	seen := map[string]string{}
	for _, r := range rejected {
		seen[r.Object] = r.Reason
		if c.rejected[r.Object] != r.Reason {
			c.log.Warn("rejected", "kind", r.Kind, "object", r.Object, "reason", r.Reason)
			if p := findPool(objs, r.Object); p != nil {
				// MetalLB's types are not in client-go's scheme: refer to the pool by reference.
				ref := &corev1.ObjectReference{APIVersion: "metallb.io/v1beta1", Kind: "IPAddressPool", Namespace: p.Namespace, Name: p.Name, UID: p.UID}
				c.recorder.Event(ref, corev1.EventTypeWarning, EventPoolRejected, r.Reason)
			}
		}
	}
	c.rejected = seen
	first := c.alloc == nil
	if first {
		c.alloc = NewAllocator(pools)
	} else {
		c.alloc.SetPools(pools)
	}
	// Services that already have IPs first: they keep them (state rebuilt from status), and only
	// then do new requests get what is left.
	keys := make([]ServiceKey, 0, len(st.Services))
	for k := range st.Services {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		hi, hj := len(st.Services[keys[i]].LoadBalancerIPs) > 0, len(st.Services[keys[j]].LoadBalancerIPs) > 0
		if hi != hj {
			return hi
		}
		return keys[i].String() < keys[j].String()
	})
	for k := range c.alloc.byKey {
		if svc := st.Services[k]; svc == nil || !c.serves(svc) {
			c.alloc.Release(k)
			delete(c.failed, k)
		}
	}
	nsLabels := map[string]map[string]string{}
	for _, k := range keys {
		svc := st.Services[k]
		if !c.serves(svc) {
			continue
		}
		if _, ok := nsLabels[k.Namespace]; !ok {
			if ns, err := c.client.CoreV1().Namespaces().Get(ctx, k.Namespace, metav1.GetOptions{}); err == nil {
				nsLabels[k.Namespace] = ns.Labels
			} else {
				nsLabels[k.Namespace] = nil
			}
		}
		ips, pool, err := c.alloc.Assign(LBRequest{Service: svc, NamespaceLabels: nsLabels[k.Namespace], Current: svc.LoadBalancerIPs})
		if err != nil {
			reason := allocationFailureReason(err)
			if c.failed[k] != reason {
				c.failed[k] = reason
				c.log.Warn("allocation failed", "service", k.String(), "reason", reason)
				c.event(ctx, k, corev1.EventTypeWarning, EventAllocationFailed, reason)
			}
			continue
		}
		delete(c.failed, k)
		if slices.Equal(ips, svc.LoadBalancerIPs) {
			continue
		}
		if err := c.writeStatus(ctx, k, ips); err != nil {
			c.log.Error("writing status", "service", k.String(), "err", err)
			c.alloc.Release(k)
			continue
		}
		strs := make([]string, len(ips))
		for i, ip := range ips {
			strs[i] = ip.String()
		}
		c.log.Info("allocated", "service", k.String(), "ips", strings.Join(strs, ","), "pool", pool)
		c.event(ctx, k, corev1.EventTypeNormal, EventIPAllocated, fmt.Sprintf("Assigned IP %s from pool %s", strings.Join(strs, ","), pool))
	}
}

// allocationFailureReason is the reason an Assign error gives for the Service's events and log.
func allocationFailureReason(err error) string {
	var pe *PendingError
	if errors.As(err, &pe) {
		return pe.Reason
	}
	return err.Error()
}

func (c *LBController) writeStatus(ctx context.Context, k ServiceKey, ips []netip.Addr) error {
	svc, err := c.client.CoreV1().Services(k.Namespace).Get(ctx, k.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	svc.Status.LoadBalancer.Ingress = nil
	for _, ip := range ips {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String()})
	}
	_, err = c.client.CoreV1().Services(k.Namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
	return err
}

func (c *LBController) event(ctx context.Context, k ServiceKey, typ, reason, msg string) {
	svc, err := c.client.CoreV1().Services(k.Namespace).Get(ctx, k.Name, metav1.GetOptions{})
	if err != nil {
		return
	}
	c.recorder.Event(svc, typ, reason, msg)
}

// publishStatus hands the status writer the pools' counters (MetalLB's IPAddressPool status) and
// the rejected objects (ConfigurationState "controller").
func (c *LBController) publishStatus(st *State) {
	if c.status == nil || c.alloc == nil {
		return
	}
	counts := map[string]mlbstatus.PoolCounts{}
	for _, u := range c.alloc.PoolUsages() {
		pc := counts[u.Pool]
		if u.Family == IPv4 {
			pc.SizeIPv4, pc.AssignedIPv4 = u.Size, int64(u.InUse)
		} else {
			pc.SizeIPv6, pc.AssignedIPv6 = u.Size, int64(u.InUse)
		}
		counts[u.Pool] = pc
	}
	problems := map[string]string{}
	for o, r := range c.rejected {
		problems[o] = r
	}
	for _, r := range st.Rejected {
		problems[r.Kind+" "+r.Object] = r.Reason
	}
	c.status.SetController(poolsOf(st.MetalLB), counts, mlbstatus.ProblemLines(problems))
}

func poolsOf(m *MetalLBConfig) []*metallbv1beta1.IPAddressPool {
	if m == nil {
		return nil
	}
	return m.IPAddressPools
}

func findPool(m *MetalLBConfig, name string) *metallbv1beta1.IPAddressPool {
	for _, p := range poolsOf(m) {
		if p.Namespace+"/"+p.Name == name {
			return p
		}
	}
	return nil
}
