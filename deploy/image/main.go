// Command image builds reproducible single-layer OCI images without Docker and writes each as an
// OCI image layout tarball that `ctr images import`, skopeo (oci-archive:) and, once extracted,
// crane accept. The same inputs give the same bytes, hence the same digest: every tar entry has a
// fixed mtime (SOURCE_DATE_EPOCH, else 0), uid/gid 0 and no user/group names, entries are sorted,
// and gzip writes no name or time.
//
//	image vipgate --binary bin/vipgate --version 0.2.0 --out bin/vipgate-image.tar
//	image vipgate-index --binary amd64=bin/vipgate-linux-amd64 --binary arm64=bin/vipgate-linux-arm64 \
//	    --version 0.2.0 --out bin/vipgate-image-multiarch.tar
//	image test-images --bin bin --out bin/images
//	image build --name registry.example/x:1 --entrypoint /x --file bin/x:/x:0755 \
//	    [--cmd arg]... [--user 65532] [--env K=V]... [--label K=V]... [--dir /tmp:1777]... \
//	    [--link /bin/sh=/bin/busybox]... [--libs /usr/bin/curl]... [--busybox /bin/busybox:/bin/busybox] \
//	    --out x.tar
//
// Every command takes --arch (default: $GOARCH, else the host's) and --variant.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  image vipgate --binary FILE --version VERSION --out FILE.tar [--name REPOSITORY]
  image vipgate-index --binary ARCH=FILE... --version VERSION --out FILE.tar [--name REPOSITORY]
  image test-images --bin DIR --out DIR [--only NAME]...
  image build --name REF --out FILE.tar [--entrypoint ARG]... [--cmd ARG]... [--user U] [--env K=V]...
              [--label K=V]... [--workdir DIR] [--file SRC:DST[:MODE]]... [--dir DST[:MODE]]...
              [--link LINK=TARGET]... [--libs EXE]... [--busybox SRC:DST]...
common flags: --arch GOARCH --variant V (SOURCE_DATE_EPOCH sets the timestamps, default 0)`

func run(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("no command\n%s", usage)
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	arch := fs.String("arch", defaultArch(), "GOARCH of the image")
	variant := fs.String("variant", "", "platform variant (e.g. v8 for arm64)")
	out := fs.String("out", "", "output archive (vipgate, build) or directory (test-images)")
	opts := func() (Options, error) {
		created, err := createdTime(os.Getenv("SOURCE_DATE_EPOCH"))
		return Options{Platform: Platform{Arch: *arch, Variant: *variant}, Created: created}, err
	}
	report := func(r Result, file string) {
		fmt.Fprintf(stdout, "%s %s %s (%.1f MB)\n", r.Name, r.Digest, file, float64(r.Size)/1e6)
	}

	switch cmd {
	case "vipgate":
		binary := fs.String("binary", "", "the static vipgate binary")
		version := fs.String("version", "", "image tag and org.opencontainers.image.version (the VERSION file)")
		repo := fs.String("name", Repository, "image repository")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if *binary == "" || *version == "" || *out == "" {
			return fmt.Errorf("vipgate: --binary, --version and --out are required")
		}
		o, err := opts()
		if err != nil {
			return err
		}
		spec := VipgateSpec(*binary, strings.TrimSpace(*version))
		spec.Name = *repo + ":" + strings.TrimSpace(*version)
		r, err := Build(spec, o, *out)
		if err != nil {
			return err
		}
		report(r, *out)
		return nil

	case "vipgate-index":
		// One multi-platform image (an OCI image index) from one binary per architecture.
		var binaries list
		fs.Var(&binaries, "binary", "ARCH=FILE: the static vipgate binary for GOARCH ARCH (repeatable)")
		version := fs.String("version", "", "image tag and org.opencontainers.image.version (the VERSION file)")
		repo := fs.String("name", Repository, "image repository")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if len(binaries) == 0 || *version == "" || *out == "" {
			return fmt.Errorf("vipgate-index: --binary ARCH=FILE (one per architecture), --version and --out are required")
		}
		o, err := opts()
		if err != nil {
			return err
		}
		v := strings.TrimSpace(*version)
		var images []PlatformImage
		for _, b := range binaries {
			arch, file, ok := strings.Cut(b, "=")
			if !ok || arch == "" || file == "" {
				return fmt.Errorf("vipgate-index: --binary %q: want ARCH=FILE, e.g. arm64=bin/vipgate-linux-arm64", b)
			}
			p := Platform{Arch: arch}
			if arch == "arm64" {
				p.Variant = "v8" // what registries and containerd record for arm64
			}
			images = append(images, PlatformImage{Spec: VipgateSpec(file, v), Platform: p})
		}
		r, err := BuildIndex(*repo+":"+v, images, o.Created, *out)
		if err != nil {
			return err
		}
		report(r, *out)
		return nil

	case "test-images":
		bin := fs.String("bin", "bin", "directory with the built binaries (pause, agnhost)")
		var only list
		fs.Var(&only, "only", "build only the image whose repository ends in this name (repeatable)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if *out == "" {
			return fmt.Errorf("test-images: --out is required")
		}
		o, err := opts()
		if err != nil {
			return err
		}
		built := 0
		for _, spec := range TestImages(*bin) {
			file, err := archiveName(spec.Name)
			if err != nil {
				return err
			}
			if len(only) > 0 && !only.has(strings.TrimSuffix(file, ".tar")) {
				continue
			}
			r, err := Build(spec, o, filepath.Join(*out, file))
			if err != nil {
				return err
			}
			report(r, filepath.Join(*out, file))
			built++
		}
		if built == 0 {
			return fmt.Errorf("test-images: no image matches --only %v", only)
		}
		return nil

	case "build":
		var spec Spec
		var entrypoint, cmdArgs, env, labels, files, dirs, links, libs, busyboxes list
		fs.StringVar(&spec.Name, "name", "", "full image reference, registry/repository:tag")
		fs.Var(&entrypoint, "entrypoint", "entrypoint argument (repeatable)")
		fs.Var(&cmdArgs, "cmd", "cmd argument (repeatable)")
		fs.StringVar(&spec.User, "user", "", "default user (uid[:gid])")
		fs.StringVar(&spec.WorkingDir, "workdir", "", "working directory")
		fs.Var(&env, "env", "K=V (repeatable)")
		fs.Var(&labels, "label", "K=V (repeatable)")
		fs.Var(&files, "file", "SRC:DST[:MODE], a file or a directory tree (repeatable)")
		fs.Var(&dirs, "dir", "DST[:MODE], an empty directory (repeatable)")
		fs.Var(&links, "link", "LINK=TARGET, a symbolic link (repeatable)")
		fs.Var(&libs, "libs", "EXE: the shared libraries ldd lists for EXE, at the same paths (repeatable)")
		fs.Var(&busyboxes, "busybox", "SRC:DST, busybox at DST and a link for each of its applets (repeatable)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if spec.Name == "" || *out == "" {
			return fmt.Errorf("build: --name and --out are required")
		}
		spec.Entrypoint, spec.Cmd, spec.Env = entrypoint, cmdArgs, env
		if len(spec.Env) == 0 {
			spec.Env = []string{defaultPath}
		}
		for _, l := range labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				return fmt.Errorf("label %q: want K=V", l)
			}
			if spec.Labels == nil {
				spec.Labels = map[string]string{}
			}
			spec.Labels[k] = v
		}
		for _, f := range files {
			c, err := ParseFile(f)
			if err != nil {
				return err
			}
			spec.Contents = append(spec.Contents, c)
		}
		for _, d := range dirs {
			c, err := ParseDir(d)
			if err != nil {
				return err
			}
			spec.Contents = append(spec.Contents, c)
		}
		for _, l := range links {
			c, err := ParseLink(l)
			if err != nil {
				return err
			}
			spec.Contents = append(spec.Contents, c)
		}
		for _, l := range libs {
			spec.Contents = append(spec.Contents, Content{Src: l, Libs: true})
		}
		for _, b := range busyboxes {
			c, err := ParseFile(b)
			if err != nil {
				return err
			}
			c.Busybox = true
			spec.Contents = append(spec.Contents, c)
		}
		o, err := opts()
		if err != nil {
			return err
		}
		r, err := Build(spec, o, *out)
		if err != nil {
			return err
		}
		report(r, *out)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

// archiveName is the file an image is written to under test-images' --out: the repository's last
// element, e.g. "agnhost.tar" for registry.k8s.io/e2e-test-images/agnhost:2.63.0.
func archiveName(ref string) (string, error) {
	t, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return "", fmt.Errorf("image name %q: %w", ref, err)
	}
	return path.Base(t.RepositoryStr()) + ".tar", nil
}

func defaultArch() string {
	if a := os.Getenv("GOARCH"); a != "" {
		return a
	}
	return runtime.GOARCH
}

// list is a repeatable string flag.
type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }
func (l list) has(s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}
