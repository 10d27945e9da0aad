// Command vipgate is a kube-proxy replacement and LoadBalancer speaker for bare-metal Kubernetes.
//
//	vipgate node    program this host's kernel for Services (the DaemonSet)
//	vipgate gateway forward LoadBalancer-IP traffic into the cluster from a host in front of it
//	vipgate render  print the ruleset vipgate would program, in nft syntax
//	vipgate explain trace one packet through the live (or rendered) ruleset
//	vipgate status  show a running node's syncs, tables, refused objects and VIPs
//	vipgate version print the version
package main

import (
	"fmt"
	"os"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `vipgate: LoadBalancer IPs and Services for bare-metal Kubernetes.

Usage:
  vipgate node    --config FILE (--manifests DIR | --kubeconfig FILE)   run on a node: program nftables
  vipgate render  --config FILE --manifests DIR [--ingress-devices DEV,... --node-device DEV]
                                                                        print the nftables ruleset (nft -f syntax)
  vipgate controller --kubeconfig FILE                                 allocate LoadBalancer IPs from MetalLB pools (a Deployment)
  vipgate gateway --config FILE (--manifests DIR | --kubeconfig FILE)   run on a gateway in front of the cluster: forward LoadBalancer IPs
  vipgate gateway kubeconfig --server URL [--kubeconfig ADMIN]          print a kubeconfig for a gateway VM (ServiceAccount vipgate-gateway)
  vipgate explain --from SRC --to DST:PORT[/PROTO] [--host]             trace one packet through the live (or rendered) ruleset
  vipgate status  [--admin 127.0.0.1:10249]                             show what vipgate node is doing
  vipgate version                                                       print the version

Run "vipgate COMMAND --help" for a command's flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "node":
		err = runNode(os.Args[2:])
	case "controller":
		err = runController(os.Args[2:])
	case "gateway":
		if len(os.Args) > 2 && os.Args[2] == "kubeconfig" { // gateway_kubeconfig.go
			err = runGatewayKubeconfig(os.Args[3:])
			break
		}
		err = runGateway(os.Args[2:])
	case "render":
		err = runRender(os.Args[2:])
	case "explain":
		err = runExplain(os.Args[2:])
	case "status":
		err = runStatus(os.Args[2:])
	case "version", "--version":
		fmt.Println("vipgate", version)
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "vipgate: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "vipgate:", err)
		os.Exit(1)
	}
}
