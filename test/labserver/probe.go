package main

import (
	"bufio"
	"flag"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// maxCount bounds --count: traffic generators in the lab are bounded.
const maxCount = 100000

// maxInFlight bounds concurrent probes in --count mode.
const maxInFlight = 1000

type target struct {
	proto string // "tcp", "udp" or "http"
	addr  string
}

func targetFlags(fs *flag.FlagSet) func() (target, error) {
	tcp := fs.String("tcp", "", "TCP target HOST:PORT")
	udp := fs.String("udp", "", "UDP target HOST:PORT")
	web := fs.String("http", "", "HTTP target HOST:PORT (GET /)")
	return func() (target, error) {
		var ts []target
		for _, t := range []target{{"tcp", *tcp}, {"udp", *udp}, {"http", *web}} {
			if t.addr != "" {
				ts = append(ts, t)
			}
		}
		if len(ts) != 1 {
			return target{}, fmt.Errorf("need exactly one of --tcp, --udp or --http HOST:PORT")
		}
		return ts[0], nil
	}
}

// result is the outcome of one probe.
type result struct {
	reply string // the server's line, without newline
	kind  string // error kind, "" on success
	err   error
}

func probeMain(args []string) int {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	getTarget := targetFlags(fs)
	timeout := fs.Duration("timeout", time.Second, "per-probe timeout")
	count := fs.Int("count", 0, "send this many probes and print a summary")
	interval := fs.Duration("interval", 10*time.Millisecond, "time between probes with --count")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	t, err := getTarget()
	if err != nil {
		fmt.Fprintf(os.Stderr, "probe: %v\n", err)
		return 2
	}
	if *count > maxCount || *count < 0 {
		fmt.Fprintf(os.Stderr, "probe: --count must be 0..%d\n", maxCount)
		return 2
	}
	if *count == 0 {
		r := probeOnce(t, *timeout)
		if r.kind != "" {
			fmt.Printf("error=%s\n", r.kind)
			fmt.Fprintf(os.Stderr, "probe %s %s: %v\n", t.proto, t.addr, r.err)
			return 1
		}
		fmt.Println(r.reply)
		return 0
	}
	fmt.Println(probeMany(t, *timeout, *count, *interval))
	return 0
}

// probeOnce opens a fresh connection (TCP) or socket (UDP), so every probe
// is a new flow for conntrack and the load balancer.
func probeOnce(t target, timeout time.Duration) result {
	if t.proto == "http" {
		return probeHTTP(t, timeout)
	}
	deadline := time.Now().Add(timeout)
	c, err := net.DialTimeout(t.proto, t.addr, timeout)
	if err != nil {
		return result{kind: errorKind(err), err: err}
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	if t.proto == "udp" {
		if _, err := c.Write([]byte("probe\n")); err != nil {
			return result{kind: errorKind(err), err: err}
		}
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return result{kind: errorKind(err), err: err}
	}
	return result{reply: strings.TrimRight(line, "\r\n")}
}

// probeHTTP fetches / with a fresh connection and returns the body's first line.
func probeHTTP(t target, timeout time.Duration) result {
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + t.addr + "/")
	if err != nil {
		return result{kind: errorKind(err), err: err}
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil {
		return result{kind: errorKind(err), err: err}
	}
	if resp.StatusCode != http.StatusOK {
		return result{kind: "failed", err: fmt.Errorf("HTTP %s", resp.Status)}
	}
	return result{reply: strings.TrimRight(line, "\r\n")}
}

// probeMany sends count probes, one every interval (concurrently, so a slow
// timeout does not stretch the schedule), and summarizes them. The longest
// gap is measured from the first lost probe of the longest loss run to the
// next successful one: for a failover that is the outage a client saw.
func probeMany(t target, timeout time.Duration, count int, interval time.Duration) string {
	results := make([]result, count)
	sent := make([]time.Time, count)
	sem := make(chan struct{}, maxInFlight)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range count {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		sem <- struct{}{}
		sent[i] = time.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = probeOnce(t, timeout)
			<-sem
		}()
	}
	wg.Wait()

	ok, lost := 0, 0
	pods, srcs, errs := map[string]int{}, map[string]int{}, map[string]int{}
	var maxGap time.Duration
	maxRun, run, runStart := 0, 0, 0
	endRun := func(end time.Time) {
		if run == 0 {
			return
		}
		if gap := end.Sub(sent[runStart]); gap > maxGap {
			maxGap = gap
		}
		maxRun = max(maxRun, run)
		run = 0
	}
	for i, r := range results {
		if r.kind != "" {
			lost++
			errs[r.kind]++
			if run == 0 {
				runStart = i
			}
			run++
			continue
		}
		ok++
		endRun(sent[i])
		f := fields(r.reply)
		pods[f["name"]]++
		if ap, err := netip.ParseAddrPort(f["src"]); err == nil {
			srcs[ap.Addr().String()]++
		}
	}
	if count > 0 {
		endRun(sent[count-1].Add(interval))
	}
	return fmt.Sprintf("sent=%d ok=%d lost=%d max_gap_ms=%d max_gap_probes=%d pods=%s srcs=%s errors=%s",
		count, ok, lost, maxGap.Milliseconds(), maxRun, counts(pods), counts(srcs), counts(errs))
}

// fields splits "k=v k=v" into a map.
func fields(line string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

// counts renders a count map as "a:1,b:2" (sorted), or "-" when empty.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s:%d", k, m[k]))
	}
	return strings.Join(parts, ",")
}
