// Command labserver is the workload of vipgate's netns lab: a tiny server
// that tells each client who answered and which addresses it saw, and the
// probes that ask.
//
//	labserver serve --name POD --port 8080,8081 [--http 8088] [--ready FILE]
//	labserver probe --tcp|--udp|--http HOST:PORT [--timeout 1s] [--count N --interval 10ms]
//	labserver hold  --tcp HOST:PORT --conns N --duration D [--interval 200ms]
//
// Every answer is one line:
//
//	name=<pod> src=<ip>:<port> dst=<ip>:<port>
//
// where src is the client address the server saw (after any NAT) and dst the
// address the client reached (after any DNAT); IPv6 addresses are bracketed.
// A failed probe prints one line "error=<kind>" with kind one of refused,
// timeout, reset, unreachable, prohibited, blocked, closed or failed, and
// exits with status 1, so tests can tell a reject from a drop.
package main

import (
	"fmt"
	"os"
)

const usage = `usage:
  labserver serve --name POD --port 8080[,8081...] [--http PORT] [--ready FILE]
  labserver probe --tcp|--udp|--http HOST:PORT [--timeout 1s] [--count N --interval 10ms]
  labserver hold  --tcp HOST:PORT --conns N --duration D [--interval 200ms]
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var code int
	switch os.Args[1] {
	case "serve":
		code = serveMain(os.Args[2:])
	case "probe":
		code = probeMain(os.Args[2:])
	case "hold":
		code = holdMain(os.Args[2:])
	default:
		fmt.Fprint(os.Stderr, usage)
		code = 2
	}
	os.Exit(code)
}
