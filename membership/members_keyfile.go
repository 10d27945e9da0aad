package membership

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// maxKeyFile bounds what ReadKeyFile reads: a key file holds a few lines.
const maxKeyFile = 64 << 10

// ReadKeyFile reads a membership key file (ParseKeys) after checking that it is safe
// to trust: a regular file (a FIFO or a device would hang or feed start-up forever), readable by
// its owner and at most its group, never by others.
//
// The file is opened with O_NONBLOCK, so opening a FIFO does not wait for a writer, and checked
// with fstat on the opened descriptor (no window between the check and the read). Symbolic links
// are followed on purpose: a Kubernetes Secret volume is a tree of links (key -> ..data/key ->
// ..2026_12_07_.../key) that the kubelet swaps atomically on a rotation. The mode check is what the
// kubelet gives a Secret mounted with defaultMode 0400 (the chart and the manifests), and stays
// compatible with 0440 and with an fsGroup, which adds group read; the kubelet's default, 0644,
// is refused.
func ReadKeyFile(path string) ([][]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("reading the membership key file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("membership key file %s: %w", path, err)
	}
	if err := checkKeyFileMode(st.Mode()); err != nil {
		return nil, fmt.Errorf("membership key file %s: %w", path, err)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("reading the membership key file %s: %w", path, err)
	}
	if len(data) > maxKeyFile {
		return nil, fmt.Errorf("membership key file %s: larger than %d bytes", path, maxKeyFile)
	}
	keys, err := ParseKeys(data)
	if err != nil {
		return nil, fmt.Errorf("membership key file %s: %w", path, err)
	}
	return keys, nil
}

// errKeyFileMode is wrapped by the errors of checkKeyFileMode.
var errKeyFileMode = errors.New("unsafe key file")

// checkKeyFileMode: a regular file, no permission for others, no write for the group.
func checkKeyFileMode(mode fs.FileMode) error {
	if !mode.IsRegular() {
		return fmt.Errorf("%w: not a regular file (%s)", errKeyFileMode, mode.Type())
	}
	if p := mode.Perm(); p&0o027 != 0 {
		return fmt.Errorf("%w: mode %04o lets others read or the group write it; want 0400, 0600 or 0440 "+
			"(chmod 0600, or defaultMode: 0400 on the Secret volume)", errKeyFileMode, p)
	}
	return nil
}
