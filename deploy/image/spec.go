package main

import (
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"time"
)

// Spec describes one single-layer image: its reference, its runtime config and what goes into its
// layer. It is plain data; expand turns its Contents into layer entries (the only step that reads
// the host), and build turns those into an OCI archive.
type Spec struct {
	// Name is the full reference the archive is tagged with, e.g. "registry.k8s.io/pause:3.10.2".
	Name       string
	Entrypoint []string
	Cmd        []string
	// User is the default user ("65532:65532"); empty means root.
	User       string
	Env        []string
	WorkingDir string
	Labels     map[string]string
	Contents   []Content
}

// Content is one item of a layer. Exactly one of its shapes is used:
//
//	Src + Dst            a host file, or a host directory copied recursively
//	Dst + Data           a file with the given bytes
//	Dst + Link           a symbolic link Dst -> Link
//	Dst + Dir            an empty directory
//	Src + Libs           the shared libraries (and loader) a host ELF executable needs, at the
//	                     paths ldd reports, so the executable runs when copied at the same path
//	Src + Dst + Busybox  a busybox binary at Dst plus a symlink to it for every applet it lists
//	                     (--list-full), except where another item already provides the path
//
// Mode is the permission (with setuid/setgid/sticky bits); zero means the source's permission for
// files and 0755 for directories. Every entry belongs to uid 0, gid 0.
type Content struct {
	Src     string
	Dst     string
	Mode    fs.FileMode
	Data    []byte
	Link    string
	Dir     bool
	Libs    bool
	Busybox bool
}

// Platform is the image's os/architecture (GOOS is always linux).
type Platform struct {
	Arch    string // GOARCH
	Variant string // e.g. "v7" for arm, "v8" for arm64; may be empty
}

// Options are the inputs every image shares.
type Options struct {
	Platform Platform
	// Created is the fixed time of every tar entry and of the image config.
	Created time.Time
}

// ParseFile parses "src:dst[:mode]" (mode in octal, e.g. 0755 or 1777).
func ParseFile(s string) (Content, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return Content{}, fmt.Errorf("file %q: want src:dst[:mode]", s)
	}
	c := Content{Src: parts[0], Dst: parts[1]}
	if len(parts) == 3 {
		m, err := ParseMode(parts[2])
		if err != nil {
			return Content{}, fmt.Errorf("file %q: %w", s, err)
		}
		c.Mode = m
	}
	return c, nil
}

// ParseLink parses "link=target".
func ParseLink(s string) (Content, error) {
	link, target, ok := strings.Cut(s, "=")
	if !ok || link == "" || target == "" {
		return Content{}, fmt.Errorf("link %q: want link=target", s)
	}
	return Content{Dst: link, Link: target}, nil
}

// ParseDir parses "dst[:mode]", an empty directory.
func ParseDir(s string) (Content, error) {
	dst, mode, hasMode := strings.Cut(s, ":")
	if dst == "" {
		return Content{}, fmt.Errorf("dir %q: want dst[:mode]", s)
	}
	c := Content{Dst: dst, Dir: true}
	if hasMode {
		m, err := ParseMode(mode)
		if err != nil {
			return Content{}, fmt.Errorf("dir %q: %w", s, err)
		}
		c.Mode = m
	}
	return c, nil
}

// ParseMode parses an octal permission such as "0755" or "1777" into an fs.FileMode with the
// setuid, setgid and sticky bits mapped to Go's flags.
func ParseMode(s string) (fs.FileMode, error) {
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil || n > 07777 {
		return 0, fmt.Errorf("mode %q: want octal permission bits such as 0755", s)
	}
	m := fs.FileMode(n & 0777)
	if n&04000 != 0 {
		m |= fs.ModeSetuid
	}
	if n&02000 != 0 {
		m |= fs.ModeSetgid
	}
	if n&01000 != 0 {
		m |= fs.ModeSticky
	}
	return m, nil
}

// cleanDst turns an image path ("/usr/local/bin/x", "usr/local/bin/x/") into the form used in the
// layer ("usr/local/bin/x"). Cleaning against "/" keeps every path inside the root.
func cleanDst(p string) (string, error) {
	c := path.Clean("/" + p)
	if c == "/" {
		return "", fmt.Errorf("path %q: the root itself cannot be an entry", p)
	}
	return strings.TrimPrefix(c, "/"), nil
}
