package cluster

import (
	"context"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
)

// LoadBalancerCleanupFinalizer is the finalizer a LoadBalancer implementation puts on the Services it
// serves (the name Kubernetes' service controller uses): a Service being deleted stays until the
// controller has let go of its IP, so the IP is never handed to another Service while a node may
// still announce it for the old one.
const LoadBalancerCleanupFinalizer = "service.kubernetes.io/load-balancer-cleanup"

// wantsFinalizer tells whether the controller keeps its finalizer on svc: a LoadBalancer Service of
// its class that is not being deleted.
func (c *LBController) wantsFinalizer(svc *corev1.Service) bool {
	if svc.DeletionTimestamp != nil || svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	class := ""
	if svc.Spec.LoadBalancerClass != nil {
		class = *svc.Spec.LoadBalancerClass
	}
	return class == c.conf.LoadBalancerClass
}

// runFinalizers keeps LoadBalancerCleanupFinalizer on the Services the controller serves and takes it
// off those it no longer serves (type or class changed) or that are being deleted, until ctx ends.
// The IP itself is released by reconcile once the Service is gone or no longer served.
func (c *LBController) runFinalizers(ctx context.Context) {
	factory := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithTransform(stripManagedFields))
	inf := factory.Core().V1().Services()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer queue.ShutDown()
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		c.log.Error("finalizers: adding the Service event handler", "err", err)
		return
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	var sw cacheSyncWait
	if !sw.wait(ctx, c.log, "the Service caches of the finalizer loop", inf.Informer().HasSynced) {
		return
	}
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	for {
		key, quit := queue.Get()
		if quit {
			return
		}
		err := c.syncFinalizer(ctx, key)
		if err != nil && ctx.Err() == nil {
			c.log.Warn("finalizer", "service", key, "err", err)
			queue.AddRateLimited(key)
		} else {
			queue.Forget(key)
		}
		queue.Done(key)
	}
}

// syncFinalizer adds or removes the finalizer of one Service, reading it again from the API server
// before each write (a conflict retries).
func (c *LBController) syncFinalizer(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		svc, err := c.client.CoreV1().Services(ns).Get(callCtx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		has := slices.Contains(svc.Finalizers, LoadBalancerCleanupFinalizer)
		want := c.wantsFinalizer(svc)
		// A Service that stopped being a LoadBalancer keeps no stale ingress IP in its status (the
		// IP is released; another Service may get it).
		if svc.DeletionTimestamp == nil && svc.Spec.Type != corev1.ServiceTypeLoadBalancer && len(svc.Status.LoadBalancer.Ingress) > 0 && has {
			svc.Status.LoadBalancer.Ingress = nil
			if svc, err = c.client.CoreV1().Services(ns).UpdateStatus(callCtx, svc, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		switch {
		case want && !has:
			svc.Finalizers = append(svc.Finalizers, LoadBalancerCleanupFinalizer)
		case !want && has:
			svc.Finalizers = slices.DeleteFunc(svc.Finalizers, func(f string) bool { return f == LoadBalancerCleanupFinalizer })
		default:
			return nil
		}
		_, err = c.client.CoreV1().Services(ns).Update(callCtx, svc, metav1.UpdateOptions{})
		if err == nil {
			c.log.Debug("finalizer", "service", key, "present", want)
		}
		return err
	})
}
