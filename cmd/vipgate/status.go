package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/vipgate/vipgate/cluster"
)

const statusHelp = `Usage: vipgate status [--admin ADDR | --config FILE] [--output text|json]

Shows what "vipgate node" (or "vipgate gateway") on this host is doing, from its admin endpoint (/status on
metricsBindAddress, 127.0.0.1:10249 by default): the last sync, what the tables hold, the objects
it refused and why, and the LoadBalancer IPs with who announces them.

Flags:
`

func runStatus(args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	admin := fs.String("admin", "", "admin endpoint of vipgate node (its metricsBindAddress; default from --config, else 127.0.0.1:10249)")
	config := fs.String("config", "", "NodeConfig or GatewayConfig file (for its metricsBindAddress)")
	output := fs.String("output", "text", "output format: text or json")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the node")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), statusHelp)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *output != "text" && *output != "json" {
		return fmt.Errorf("--output %q: want text or json", *output)
	}
	if *admin == "" {
		*admin = cluster.DefaultMetricsBindAddress
		if *config != "" {
			cfg, err := cluster.LoadConfig(*config)
			if err != nil {
				return err
			}
			switch c := cfg.(type) {
			case *cluster.NodeConfig:
				*admin = c.MetricsBindAddress.String()
			case *cluster.GatewayConfig:
				*admin = c.MetricsBindAddress.String()
			}
		}
	}
	body, st, err := fetchStatus(*admin, *timeout)
	if err != nil {
		return err
	}
	if *output == "json" {
		_, err := os.Stdout.Write(body)
		return err
	}
	writeStatus(os.Stdout, st, time.Now())
	return nil
}

// fetchStatus GETs /status from the admin endpoint and decodes it.
func fetchStatus(admin string, timeout time.Duration) ([]byte, *NodeStatus, error) {
	url := admin
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	url = strings.TrimSuffix(url, "/") + "/status"
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("asking vipgate node at %s (is it running, with this metricsBindAddress?): %w", admin, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	var st NodeStatus
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, nil, fmt.Errorf("decoding %s: %w", url, err)
	}
	return body, &st, nil
}

// writeStatus prints the status on one screen.
func writeStatus(w io.Writer, st *NodeStatus, now time.Time) {
	fmt.Fprintf(w, "node:      %s   (vipgate %s, up %s)\n", st.Node, st.Version, now.Sub(st.Started).Round(time.Second))
	fmt.Fprintf(w, "source:    %s\n", st.Source)
	fmt.Fprintf(w, "table:     %s\n", st.Table)
	if st.LastSync != nil {
		kind := "incremental"
		if st.LastSync.Full {
			kind = "full"
		}
		fmt.Fprintf(w, "last sync: %s ago, %s, took %s, %d changes\n", now.Sub(st.LastSync.Time).Round(time.Second), kind, st.LastSync.Duration, st.LastSync.Changes)
	} else {
		fmt.Fprintln(w, "last sync: none yet")
	}
	if st.LastError != "" {
		when := ""
		if st.LastErrorTime != nil {
			when = fmt.Sprintf(" (%s ago)", now.Sub(*st.LastErrorTime).Round(time.Second))
		}
		fmt.Fprintf(w, "LAST SYNC FAILED%s: %s\n", when, st.LastError)
	}
	for _, warn := range st.Warnings {
		fmt.Fprintf(w, "WARNING:   %s\n", warn)
	}
	fmt.Fprintf(w, "services:  %d   endpoints: %d\n", st.Services, st.Endpoints)
	for _, t := range st.Tables {
		total := 0
		var sets []string
		for s, n := range t.Elements {
			total += n
			sets = append(sets, fmt.Sprintf("%s=%d", s, n))
		}
		sort.Strings(sets)
		fmt.Fprintf(w, "IPv%d:      %d chains, %d sets, %d elements", t.Family, t.Chains, t.Sets, total)
		if len(sets) > 0 {
			fmt.Fprintf(w, " (%s)", strings.Join(sets, " "))
		}
		fmt.Fprintln(w)
	}
	if len(st.Rejected) == 0 {
		fmt.Fprintln(w, "rejected:  none")
	} else {
		fmt.Fprintf(w, "rejected:  %d\n", len(st.Rejected))
		for _, r := range st.Rejected {
			src := ""
			if r.Source != "" {
				src = " [" + r.Source + "]"
			}
			fmt.Fprintf(w, "  %s %s%s: %s\n", r.Kind, r.Object, src, r.Reason)
		}
	}
	if len(st.VIPs) == 0 {
		fmt.Fprintln(w, "VIPs:      none reported")
		return
	}
	fmt.Fprintf(w, "VIPs:      %d\n", len(st.VIPs))
	for _, v := range st.VIPs {
		here := "not announced here"
		if v.Announced {
			here = "announced here"
		}
		line := fmt.Sprintf("  %-20s %-24s %-4s %s", v.IP, v.Service, v.Mode, here)
		if v.Announcer != "" {
			line += " (announcer " + v.Announcer + ")"
		}
		if len(v.Peers) > 0 {
			line += " peers " + strings.Join(v.Peers, ",")
		}
		if v.Reason != "" {
			line += ": " + v.Reason
		}
		fmt.Fprintln(w, line)
	}
}
