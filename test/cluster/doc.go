// Package testcluster runs a real Kubernetes cluster on one machine, without Docker and without a
// registry, for vipgate's conformance runs, the real-cluster end-to-end tests and `make cluster`.
//
// # Topology
//
// The cluster is built on the netns lab (test/lab, IPv4 only): every Kubernetes node is a lab node,
// the control plane runs in the lab's "lanclient" namespace, BIRD runs on the lab's router and the
// lab's client stands for a user outside the cluster.
//
//	client 198.51.100.10 ── router (BIRD, AS 64512) ── LAN 192.0.2.0/24 ──┬── lanclient 192.0.2.100
//	                                                                        │   etcd, kube-apiserver :6443,
//	                                                                        │   kube-controller-manager,
//	                                                                        │   kube-scheduler, e2e.test
//	                                                                        ├── node1 192.0.2.11  (pods 10.244.1.0/24)
//	                                                                        └── node2 192.0.2.12  (pods 10.244.2.0/24)
//
// Each node has its own network, mount and UTS namespace (hostname = node name): /run, /var/lib and
// /var/log are tmpfs inside it, and the files the kubelet writes under /proc/sys that are not per
// network namespace (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops) are bind-mounted
// stand-ins, so the machine's values never change. A node runs containerd (Debian's 1.6, its own
// root, state and socket, runc with cgroupfs) and the kubelet (cgroup root /<prefix>nodeN in every
// cgroup v1 hierarchy). Pods get their addresses from the bridge and host-local CNI plugins on the
// lab's cbr0; the lab routes every node's pod CIDR via that node. With Spec.CNI CNIFlannel
// (`make cluster CNI=flannel`, flannel.go) the nodes lose cbr0 and those routes instead, and
// Flannel's own DaemonSet (VXLAN backend, nftables mode) connects the pods: flannel.1 in each node's
// network namespace, routes to the other nodes' pod CIDRs over it, pods on cni0 with MTU 1450.
//
// No kube-proxy: Services are vipgate's work, installed from its own Helm chart with the image
// `make image` built (Spec.Proxy selects kube-proxy instead, for the comparison runs). LoadBalancer
// IPs come from vipgate's controller (a MetalLB IPAddressPool) and are announced by BGP to BIRD.
//
// # Clean-up
//
// Everything lives in namespaces, directories and cgroups named with the lab's unique prefix. Close
// stops the kubelets and containerd, kills every process left in the nodes' cgroups (the
// containers) and namespaces (the shims), removes the cgroups, then the lab. A process that died
// without closing leaves names with its PID in them; the next cluster sweeps them (SweepStale).
//
// # Authentication
//
// Static tokens (a system:masters admin, system:node:<name> in system:nodes for each kubelet,
// the controller manager and the scheduler under their usual user names) with the Node and RBAC
// authorizers, so vipgate's least-privilege RBAC is what it runs with. Kubelets serve with a
// self-signed certificate and allow anonymous access (a lab on a LAN of its own).
package testcluster
