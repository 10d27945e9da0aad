package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// entry is one tar entry of a layer, before it is written. A regular file's bytes come from data
// or, when data is nil, from the host file src.
type entry struct {
	path string // clean, relative to the root, no trailing slash
	typ  byte   // tar.TypeReg, tar.TypeDir or tar.TypeSymlink
	mode fs.FileMode
	link string
	src  string
	data []byte
	// implied marks a directory created only as the parent of another entry.
	implied bool
}

// entries is a layer's content keyed by path.
type entries map[string]entry

// add records e, creating missing parent directories (0755). Two different entries for one path
// are an error, except that a directory given explicitly wins over one implied as a parent.
func (es entries) add(e entry) error {
	if old, ok := es[e.path]; ok {
		switch {
		case old.typ != tar.TypeDir || e.typ != tar.TypeDir:
			return fmt.Errorf("/%s is given twice", e.path)
		case e.implied:
		case old.implied:
			es[e.path] = e
		case old.mode != e.mode:
			return fmt.Errorf("/%s is given twice, with modes %v and %v", e.path, old.mode, e.mode)
		}
		return nil
	}
	if dir := path.Dir(e.path); dir != "." {
		if p, ok := es[dir]; ok && p.typ != tar.TypeDir {
			return fmt.Errorf("/%s: parent /%s is not a directory", e.path, dir)
		}
		if err := es.add(entry{path: dir, typ: tar.TypeDir, mode: defaultDirMode, implied: true}); err != nil {
			return err
		}
	}
	es[e.path] = e
	return nil
}

const defaultDirMode fs.FileMode = 0755

// expand reads the host to turn contents into layer entries: it stats and walks sources, asks ldd
// for shared libraries and busybox for its applets. Busybox links come last and never replace an
// entry another item provides.
func expand(contents []Content) (entries, error) {
	es := entries{}
	var busyboxes []Content
	for _, c := range contents {
		var err error
		switch {
		case c.Busybox:
			busyboxes = append(busyboxes, c)
			err = addFile(es, c.Src, c.Dst, c.Mode)
		case c.Libs:
			err = addLibs(es, c.Src)
		case c.Link != "":
			err = addEntry(es, c.Dst, entry{typ: tar.TypeSymlink, mode: 0777, link: c.Link})
		case c.Dir:
			mode := c.Mode
			if mode == 0 {
				mode = defaultDirMode
			}
			err = addEntry(es, c.Dst, entry{typ: tar.TypeDir, mode: mode})
		case c.Data != nil:
			mode := c.Mode
			if mode == 0 {
				mode = 0644
			}
			err = addEntry(es, c.Dst, entry{typ: tar.TypeReg, mode: mode, data: c.Data})
		case c.Src != "" && c.Dst != "":
			err = addTree(es, c.Src, c.Dst, c.Mode)
		default:
			err = fmt.Errorf("content %+v: nothing to add", c)
		}
		if err != nil {
			return nil, err
		}
	}
	for _, c := range busyboxes {
		if err := addApplets(es, c.Src, c.Dst); err != nil {
			return nil, err
		}
	}
	return es, nil
}

func addEntry(es entries, dst string, e entry) error {
	p, err := cleanDst(dst)
	if err != nil {
		return err
	}
	e.path = p
	return es.add(e)
}

// addFile adds the host file src (symlinks followed) at dst.
func addFile(es entries, src, dst string, mode fs.FileMode) error {
	fi, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("adding %s: %w", src, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("adding %s: not a regular file", src)
	}
	if mode == 0 {
		mode = fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	}
	return addEntry(es, dst, entry{typ: tar.TypeReg, mode: mode, src: src})
}

// addTree adds a host file, or a host directory with everything below it, at dst. Modes come from
// the host (mode, when set, replaces the top item's); symbolic links are kept as links.
func addTree(es entries, src, dst string, mode fs.FileMode) error {
	fi, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("adding %s: %w", src, err)
	}
	if !fi.IsDir() {
		return addFile(es, src, dst, mode)
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("adding %s: %w", p, err)
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := path.Join(dst, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("adding %s: %w", p, err)
		}
		perm := info.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		if rel == "." && mode != 0 {
			perm = mode
		}
		switch {
		case d.IsDir():
			return addEntry(es, target, entry{typ: tar.TypeDir, mode: perm})
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("adding %s: %w", p, err)
			}
			return addEntry(es, target, entry{typ: tar.TypeSymlink, mode: 0777, link: link})
		case d.Type().IsRegular():
			return addEntry(es, target, entry{typ: tar.TypeReg, mode: perm, src: p})
		default:
			return fmt.Errorf("adding %s: unsupported file type %v", p, d.Type())
		}
	})
}

// addLibs adds what ldd lists for the host executable exe (libraries and the dynamic loader), each
// at the path ldd prints, with the content of the file it resolves to. A static executable adds
// nothing.
func addLibs(es entries, exe string) error {
	out, err := exec.Command("ldd", exe).CombinedOutput()
	if strings.Contains(string(out), "not a dynamic executable") || strings.Contains(string(out), "statically linked") {
		return nil // a static executable needs nothing
	}
	if err != nil {
		return fmt.Errorf("ldd %s: %w: %s", exe, err, strings.TrimSpace(string(out)))
	}
	libs, err := parseLdd(string(out))
	if err != nil {
		return fmt.Errorf("ldd %s: %w", exe, err)
	}
	for _, lib := range libs {
		p, err := cleanDst(lib)
		if err != nil {
			return err
		}
		if _, ok := es[p]; ok {
			continue // shared with another executable
		}
		if err := addFile(es, lib, lib, 0); err != nil {
			return err
		}
	}
	return nil
}

// parseLdd returns the absolute paths in ldd's output, e.g.
//
//	linux-vdso.so.1 (0x00007ffd...)                              (skipped: in the kernel)
//	libcurl.so.4 => /lib/x86_64-linux-gnu/libcurl.so.4 (0x...)
//	/lib64/ld-linux-x86-64.so.2 (0x...)
func parseLdd(out string) ([]string, error) {
	var libs []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if _, rest, ok := strings.Cut(line, "=>"); ok {
			line = strings.TrimSpace(rest)
			if strings.HasPrefix(line, "not found") {
				return nil, fmt.Errorf("missing library: %s", sc.Text())
			}
		}
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "/") {
			continue
		}
		libs = append(libs, f[0])
	}
	slices.Sort(libs)
	return slices.Compact(libs), sc.Err()
}

// addApplets links every applet the host busybox src lists (--list-full, e.g. "usr/bin/wget") to
// dst, unless the path is taken.
func addApplets(es entries, src, dst string) error {
	out, err := exec.Command(src, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("%s --list-full: %w", src, err)
	}
	target := "/" + strings.TrimPrefix(path.Clean("/"+dst), "/")
	for _, applet := range strings.Fields(string(out)) {
		p, err := cleanDst(applet)
		if err != nil {
			return err
		}
		if _, ok := es[p]; ok || p == "linuxrc" { // linuxrc: busybox as init, not a command
			continue
		}
		if err := es.add(entry{path: p, typ: tar.TypeSymlink, mode: 0777, link: target}); err != nil {
			return err
		}
	}
	return nil
}

// writeLayer writes es as a tar stream in path order, every entry owned by 0:0 with no user or
// group names and the modification time mtime, so the bytes depend only on paths, modes, link
// targets and file contents.
func writeLayer(w io.Writer, es entries, mtime time.Time) error {
	tw := tar.NewWriter(w)
	for _, p := range slices.Sorted(maps.Keys(es)) {
		e := es[p]
		hdr := &tar.Header{
			Typeflag: e.typ,
			Name:     e.path,
			Mode:     tarMode(e.mode),
			ModTime:  mtime,
			Linkname: e.link,
		}
		var body io.Reader
		switch e.typ {
		case tar.TypeDir:
			hdr.Name += "/"
		case tar.TypeReg:
			if e.data != nil {
				hdr.Size = int64(len(e.data))
				body = bytes.NewReader(e.data)
			} else {
				b, err := os.ReadFile(e.src)
				if err != nil {
					return fmt.Errorf("reading %s: %w", e.src, err)
				}
				hdr.Size = int64(len(b))
				body = bytes.NewReader(b)
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("writing /%s: %w", e.path, err)
		}
		if body != nil {
			if _, err := io.Copy(tw, body); err != nil {
				return fmt.Errorf("writing /%s: %w", e.path, err)
			}
		}
	}
	return tw.Close()
}

// tarMode converts Go's file mode to the Unix permission bits tar stores.
func tarMode(m fs.FileMode) int64 {
	n := int64(m & fs.ModePerm)
	if m&fs.ModeSetuid != 0 {
		n |= 04000
	}
	if m&fs.ModeSetgid != 0 {
		n |= 02000
	}
	if m&fs.ModeSticky != 0 {
		n |= 01000
	}
	return n
}

// gzipLayer compresses a tar stream with a fixed gzip header (no name, zero mtime) at the best
// compression level: the output depends only on the input and Go's compress/flate.
func gzipLayer(tarball []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(tarball); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
