package cluster

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// errNotRegular says a path names something other than a regular file (a FIFO, a device, a socket,
// a directory), or a symbolic link to one.
var errNotRegular = errors.New("not a regular file")

// openRegular opens path for reading only if it is a regular file, or a symbolic link to one
// (ConfigMap volumes are symbolic links into a ..data directory), and never blocks doing so:
//
//   - Lstat first, and Stat through a link, so that a FIFO, a device or a socket is refused before
//     anything opens it (opening a FIFO for reading blocks until a writer comes, forever; opening a
//     device can have side effects);
//   - then open with O_NONBLOCK|O_NOCTTY, so that a file swapped for a FIFO between the check and
//     the open does not hang the caller either, and check the opened file again (Fstat) against
//     what was checked (same device and inode).
//
// Reading a regular file is not affected by O_NONBLOCK.
func openRegular(path string) (*os.File, fs.FileInfo, error) {
	lfi, err := os.Lstat(path)
	if err != nil {
		return nil, nil, err
	}
	fi := lfi
	if lfi.Mode()&fs.ModeSymlink != 0 {
		if fi, err = os.Stat(path); err != nil {
			return nil, nil, err
		}
	}
	if !fi.Mode().IsRegular() {
		return nil, fi, fmt.Errorf("%w (%s)", errNotRegular, fileType(fi.Mode()))
	}
	fh, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fi, err
	}
	ofi, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, fi, err
	}
	if !ofi.Mode().IsRegular() || !os.SameFile(fi, ofi) {
		fh.Close()
		return nil, ofi, fmt.Errorf("%w (it changed while being opened)", errNotRegular)
	}
	return fh, ofi, nil
}

// fileType names a non-regular file's type for an error message.
func fileType(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "mode " + m.String()
}

// checkTrusted refuses a file or directory that someone other than root or vipgate's own user could
// have written: world-writable (unless a directory with the sticky bit, such as /tmp, where nobody
// can replace another user's file), or owned by another user. Whoever can write vipgate's manifests
// or config can steer every Service on the node.
func checkTrusted(what string, fi fs.FileInfo) error {
	perm := fi.Mode().Perm()
	if perm&0o002 != 0 && !(fi.IsDir() && fi.Mode()&fs.ModeSticky != 0) {
		return fmt.Errorf("%s is world-writable (mode %#o): any local user could change it; fix it with `chmod o-w`", what, perm)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if uid := os.Geteuid(); st.Uid != 0 && int(st.Uid) != uid {
			return fmt.Errorf("%s is owned by uid %d, neither root nor vipgate's user (uid %d)", what, st.Uid, uid)
		}
	}
	return nil
}

// readRegular reads at most limit bytes of a regular file opened with openRegular; more is an error.
func readRegular(fh *os.File, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(fh, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return data, nil
}
