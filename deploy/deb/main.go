// Command deb builds vipgate's Debian package for a gateway host with nfpm (as a Go library, no
// Docker, no debhelper): the static binary, the systemd unit of the gateway mode, an example
// GatewayConfig as a conffile, a sysctl drop-in that turns forwarding on, maintainer scripts and
// the copyright file.
//
//	deb --binary bin/vipgate-linux-amd64 --version 0.2.0 --arch amd64 --repo . --out bin/vipgate_0.2.0_amd64.deb
//
// The same inputs give the same bytes: every timestamp is SOURCE_DATE_EPOCH (default 0), every
// owner root, and nfpm writes the archive members in a fixed order. `make deb` runs it.
//
// It is a Go module of its own so that nfpm's dependencies (go-git, openpgp, sprig, ~120 modules)
// stay out of the main module's go.mod; it needs no vipgate code, only files of the repository.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "deb:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("deb", flag.ContinueOnError)
	var o Options
	fs.StringVar(&o.Binary, "binary", "", "the static vipgate binary, built for --arch (CGO_ENABLED=0)")
	fs.StringVar(&o.Version, "version", "", "package version (the VERSION file)")
	fs.StringVar(&o.Arch, "arch", runtime.GOARCH, "GOARCH of the binary: amd64 or arm64")
	fs.StringVar(&o.Repo, "repo", ".", "the vipgate repository (for deploy/systemd and deploy/examples)")
	out := fs.String("out", "", "the .deb to write (default: vipgate_VERSION_ARCH.deb)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.Binary == "" || o.Version == "" {
		return fmt.Errorf("--binary and --version are required")
	}
	var err error
	if o.MTime, err = sourceDateEpoch(os.Getenv("SOURCE_DATE_EPOCH")); err != nil {
		return err
	}
	if *out == "" {
		*out = FileName(o.Version, o.Arch)
	}
	size, err := Build(o, *out)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s (%.1f MB)\n", *out, float64(size)/1e6)
	return nil
}

// sourceDateEpoch is the time of every entry: SOURCE_DATE_EPOCH, else the epoch itself, so that a
// build without it is reproducible too (as deploy/image).
func sourceDateEpoch(s string) (time.Time, error) {
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970 (git log -1 --format=%%ct)", s)
	}
	return time.Unix(n, 0).UTC(), nil
}
