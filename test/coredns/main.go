// Command coredns is the cluster DNS of the vipgate test cluster: CoreDNS built from its Go
// modules with only the plugins a Kubernetes cluster DNS needs, the documented way for custom
// builds (import coremain, the wanted plugins, and set dnsserver.Directives).
//
// It lives in its own module so that CoreDNS's dependencies (its own k8s.io/client-go among
// them) stay out of the main vipgate module. Build it with
//
//	cd test/coredns && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o ../../bin/coredns .
//
// The Corefile the cluster uses is in test/cluster/manifests/coredns.yaml.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/file"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// directives is the plugin chain order: the compiled-in plugins, in the order of CoreDNS's own
// plugin.cfg (which is what core/dnsserver/zdirectives.go is generated from). A plugin earlier in
// this list sees a query first, whatever the order in the Corefile.
var directives = []string{
	"reload",
	"bind",
	"ready",
	"health",
	"prometheus", // package plugin/metrics
	"errors",
	"log",
	"loadbalance",
	"cache",
	"hosts",
	"kubernetes",
	"file",
	"loop",
	"forward",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
