package main

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

var testOpts = Options{Platform: Platform{Arch: "amd64"}, Created: time.Unix(0, 0).UTC()}

// fakeBinary writes a stand-in for the vipgate binary.
func fakeBinary(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "vipgate")
	if err := os.WriteFile(p, []byte(content), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

func build(t *testing.T, spec Spec, opts Options) (Result, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "image.tar")
	r, err := Build(spec, opts, out)
	if err != nil {
		t.Fatal(err)
	}
	return r, out
}

func TestReproducible(t *testing.T) {
	bin := fakeBinary(t, "#!/bin/true\nversion one\n")
	first, firstFile := build(t, VipgateSpec(bin, "0.2.0"), testOpts)
	// Touch the input: the host's mtime and permissions must not leak into the image.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(bin, later, later); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	second, secondFile := build(t, VipgateSpec(bin, "0.2.0"), testOpts)
	if first.Digest != second.Digest {
		t.Errorf("same inputs, different digests: %s, %s", first.Digest, second.Digest)
	}
	a, _ := os.ReadFile(firstFile)
	b, _ := os.ReadFile(secondFile)
	if string(a) != string(b) {
		t.Errorf("same inputs, different archives")
	}

	changed := fakeBinary(t, "#!/bin/true\nversion two\n")
	later1 := testOpts
	later1.Created = time.Unix(1, 0).UTC()
	arm := testOpts
	arm.Platform = Platform{Arch: "arm64"}
	for name, tc := range map[string]struct {
		spec Spec
		opts Options
	}{
		"binary":            {VipgateSpec(changed, "0.2.0"), testOpts},
		"version":           {VipgateSpec(bin, "0.2.1"), testOpts},
		"SOURCE_DATE_EPOCH": {VipgateSpec(bin, "0.2.0"), later1},
		"arch":              {VipgateSpec(bin, "0.2.0"), arm},
	} {
		r, _ := build(t, tc.spec, tc.opts)
		if r.Digest == first.Digest {
			t.Errorf("changed %s, same digest %s", name, r.Digest)
		}
	}
}

// readArchive returns the files of an archive by name.
func readArchive(t *testing.T, file string) map[string][]byte {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(testOpts.Created) {
			t.Errorf("archive entry %s: owner %d:%d (%q:%q), mtime %v; want 0:0, no names, the epoch", h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

func TestArchive(t *testing.T) {
	r, file := build(t, VipgateSpec(fakeBinary(t, "x"), "0.2.0"), testOpts)
	files := readArchive(t, file)

	if got, want := string(files["oci-layout"]), `{"imageLayoutVersion":"1.0.0"}`; got != want {
		t.Errorf("oci-layout = %s, want %s", got, want)
	}
	var index v1.IndexManifest
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("index.json has %d manifests, want 1", len(index.Manifests))
	}
	desc := index.Manifests[0]
	if desc.Digest != r.Digest {
		t.Errorf("index.json digest %s, Build reported %s", desc.Digest, r.Digest)
	}
	wantAnn := map[string]string{
		"io.containerd.image.name":          "ghcr.io/vipgate/vipgate:0.2.0",
		"org.opencontainers.image.ref.name": "0.2.0",
	}
	if diff := cmp.Diff(wantAnn, desc.Annotations); diff != "" {
		t.Errorf("index.json annotations (-want +got):\n%s", diff)
	}

	// go-containerregistry's own reader checks digests, sizes and diff IDs.
	idx, err := layout.ImageIndexFromPath(extractArchive(t, file))
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Errorf("validating the layout: %v", err)
	}
	img, err := idx.Image(r.Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" || !cfg.Created.Time.Equal(testOpts.Created) {
		t.Errorf("config: os %s, architecture %s, created %v; want linux, amd64, the epoch", cfg.OS, cfg.Architecture, cfg.Created)
	}
	if diff := cmp.Diff([]string{"/usr/local/bin/vipgate"}, cfg.Config.Entrypoint); diff != "" {
		t.Errorf("entrypoint (-want +got):\n%s", diff)
	}
	if cfg.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", cfg.Config.User)
	}
	for _, k := range []string{"title", "version", "source", "licenses"} {
		if cfg.Config.Labels["org.opencontainers.image."+k] == "" {
			t.Errorf("label org.opencontainers.image.%s missing", k)
		}
	}
	if v := cfg.Config.Labels["org.opencontainers.image.version"]; v != "0.2.0" {
		t.Errorf("version label %q, want 0.2.0", v)
	}
}

// extractArchive unpacks an archive into a temporary directory (an OCI image layout).
func extractArchive(t *testing.T, file string) string {
	t.Helper()
	dir := t.TempDir()
	for name, b := range readArchive(t, file) {
		if strings.HasSuffix(name, "/") {
			continue
		}
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// layerEntry is what the tests compare of a layer's tar entries.
type layerEntry struct {
	Name     string
	Type     byte
	Mode     int64
	UID, GID int
	Uname    string
	Gname    string
	Link     string
	MTime    int64
}

func layerEntries(t *testing.T, spec Spec) ([]layerEntry, map[string]string) {
	t.Helper()
	es, err := expand(spec.Contents)
	if err != nil {
		t.Fatal(err)
	}
	img, err := Image(spec, es, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v; want 1", len(layers), err)
	}
	rc, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	zr, err := gzip.NewReader(rc)
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("gzip header: name %q, mtime %v; want neither", zr.Name, zr.ModTime)
	}
	var got []layerEntry
	contents := map[string]string{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, layerEntry{h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Uname, h.Gname, h.Linkname, h.ModTime.Unix()})
		b, _ := io.ReadAll(tr)
		contents[h.Name] = string(b)
	}
	return got, contents
}

func TestVipgateLayer(t *testing.T) {
	got, contents := layerEntries(t, VipgateSpec(fakeBinary(t, "binary"), "0.2.0"))
	dir := func(name string, mode int64) layerEntry { return layerEntry{Name: name, Type: tar.TypeDir, Mode: mode} }
	file := func(name string, mode int64) layerEntry { return layerEntry{Name: name, Type: tar.TypeReg, Mode: mode} }
	want := []layerEntry{
		dir("etc/", 0o755),
		file("etc/group", 0o644),
		file("etc/passwd", 0o644),
		dir("tmp/", 0o1777),
		dir("usr/", 0o755),
		dir("usr/local/", 0o755),
		dir("usr/local/bin/", 0o755),
		file("usr/local/bin/vipgate", 0o755), // 0700 on the host: the spec's mode wins
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer entries (-want +got):\n%s", diff)
	}
	if contents["usr/local/bin/vipgate"] != "binary" {
		t.Errorf("vipgate = %q, want the binary's bytes", contents["usr/local/bin/vipgate"])
	}
	for _, line := range []string{"root:x:0:0:", "nonroot:x:65532:65532:"} {
		if !strings.Contains(contents["etc/passwd"], line) {
			t.Errorf("/etc/passwd lacks %q:\n%s", line, contents["etc/passwd"])
		}
	}
	for _, line := range []string{"root:x:0:", "nonroot:x:65532:"} {
		if !strings.Contains(contents["etc/group"], line) {
			t.Errorf("/etc/group lacks %q:\n%s", line, contents["etc/group"])
		}
	}
}

func TestGenericLayer(t *testing.T) {
	src := t.TempDir()
	for p, content := range map[string]string{"conf/a.yaml": "a", "conf/sub/b.yaml": "b", "tool": "t"} {
		if err := os.MkdirAll(filepath.Join(src, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, p), []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("a.yaml", filepath.Join(src, "conf/current")); err != nil {
		t.Fatal(err)
	}
	var spec Spec
	spec.Name = "registry.example/tool:1"
	for _, f := range []string{src + "/tool:/bin/tool:0755", src + "/conf:/etc/tool"} {
		c, err := ParseFile(f)
		if err != nil {
			t.Fatal(err)
		}
		spec.Contents = append(spec.Contents, c)
	}
	link, _ := ParseLink("/usr/bin/tool=/bin/tool")
	tmp, _ := ParseDir("/tmp:1777")
	spec.Contents = append(spec.Contents, link, tmp)

	got, _ := layerEntries(t, spec)
	want := []layerEntry{
		{Name: "bin/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "bin/tool", Type: tar.TypeReg, Mode: 0o755},
		{Name: "etc/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "etc/tool/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "etc/tool/a.yaml", Type: tar.TypeReg, Mode: 0o640},
		{Name: "etc/tool/current", Type: tar.TypeSymlink, Mode: 0o777, Link: "a.yaml"},
		{Name: "etc/tool/sub/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "etc/tool/sub/b.yaml", Type: tar.TypeReg, Mode: 0o640},
		{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777},
		{Name: "usr/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/bin/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/bin/tool", Type: tar.TypeSymlink, Mode: 0o777, Link: "/bin/tool"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer entries (-want +got):\n%s", diff)
	}
}

func TestExpandConflicts(t *testing.T) {
	for name, tc := range map[string]struct {
		contents []Content
		wantErr  bool
	}{
		"same file twice":                   {[]Content{{Dst: "/a", Data: []byte("1")}, {Dst: "/a", Data: []byte("2")}}, true},
		"file under a file":                 {[]Content{{Dst: "/a", Data: []byte("1")}, {Dst: "/a/b", Data: []byte("2")}}, true},
		"dir modes differ":                  {[]Content{{Dst: "/t", Dir: true, Mode: 0o700}, {Dst: "/t", Dir: true, Mode: 0o755}}, true},
		"explicit dir after implied parent": {[]Content{{Dst: "/t/x", Data: []byte("1")}, {Dst: "/t", Dir: true, Mode: 0o777 | fs.ModeSticky}}, false},
		"implied parent after explicit dir": {[]Content{{Dst: "/t", Dir: true, Mode: 0o777 | fs.ModeSticky}, {Dst: "/t/x", Data: []byte("1")}}, false},
	} {
		t.Run(name, func(t *testing.T) {
			es, err := expand(tc.contents)
			if (err != nil) != tc.wantErr {
				t.Fatalf("expand: err %v, want error %v", err, tc.wantErr)
			}
			if err == nil {
				if m := es["t"].mode; m != 0o777|fs.ModeSticky {
					t.Errorf("/t mode %v, want the explicit drwxrwxrwt", m)
				}
			}
		})
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		parse   func(string) (Content, error)
		want    Content
		wantErr bool
	}{
		{"bin/x:/x", ParseFile, Content{Src: "bin/x", Dst: "/x"}, false},
		{"bin/x:/x:0755", ParseFile, Content{Src: "bin/x", Dst: "/x", Mode: 0o755}, false},
		{"bin/x:/x:4755", ParseFile, Content{Src: "bin/x", Dst: "/x", Mode: 0o755 | fs.ModeSetuid}, false},
		{"bin/x", ParseFile, Content{}, true},
		{"bin/x:/x:9", ParseFile, Content{}, true},
		{"bin/x:/x:17777", ParseFile, Content{}, true},
		{"/bin/sh=/bin/busybox", ParseLink, Content{Dst: "/bin/sh", Link: "/bin/busybox"}, false},
		{"/bin/sh", ParseLink, Content{}, true},
		{"/tmp:1777", ParseDir, Content{Dst: "/tmp", Dir: true, Mode: 0o777 | fs.ModeSticky}, false},
		{"/data", ParseDir, Content{Dst: "/data", Dir: true}, false},
	} {
		got, err := tc.parse(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("%q: err %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%q (-want +got):\n%s", tc.in, diff)
		}
	}
}

func TestParseLdd(t *testing.T) {
	out := `	linux-vdso.so.1 (0x00007ffd6b5f2000)
	libcurl.so.4 => /lib/x86_64-linux-gnu/libcurl.so.4 (0x00007f2b0c2e0000)
	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2b0c0ff000)
	/lib64/ld-linux-x86-64.so.2 (0x00007f2b0c3b4000)
`
	got, err := parseLdd(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libcurl.so.4", "/lib64/ld-linux-x86-64.so.2"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parseLdd (-want +got):\n%s", diff)
	}
	if _, err := parseLdd("\tlibfoo.so.1 => not found\n"); err == nil {
		t.Error("a missing library is not an error")
	}
}

func TestTestImagesTable(t *testing.T) {
	seen := map[string]string{}
	for _, spec := range TestImages("bin") {
		file, err := archiveName(spec.Name)
		if err != nil {
			t.Error(err)
			continue
		}
		if other, ok := seen[file]; ok {
			t.Errorf("%s and %s both write %s", spec.Name, other, file)
		}
		seen[file] = spec.Name
		if len(spec.Entrypoint) == 0 && len(spec.Cmd) == 0 {
			t.Errorf("%s: neither entrypoint nor cmd", spec.Name)
		}
	}
}
