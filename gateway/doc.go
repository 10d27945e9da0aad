// Package gateway is `vipgate gateway`: a host in front of the cluster that owns the LoadBalancer
// IPs and forwards their traffic to the nodes (forwarding nodePort, route) or the pods (direct).
// It builds its nftables tables with the dataplane's model and programs them through the
// dataplane's exported API; the nftables engine itself (encoding, diff, netlink, render, trace)
// stays in package dataplane, which never imports this one. See README.md.
package gateway
