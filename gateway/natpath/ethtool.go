package natpath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The ethtool ioctl, for the one thing the XDP attach needs of a device's offloads.

const ethSSFeatures = 4 // ETH_SS_FEATURES: the features' string set

// rxVLANStripped says whether device name strips VLAN tags in its receive path (rx-vlan-hw-parse
// or rx-vlan-stag-hw-parse active): an XDP program there sees a tagged frame as an untagged one.
func rxVLANStripped(name string) (bool, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	// How many features, then their names, then their state.
	info := make([]byte, 20) // struct ethtool_sset_info and one data word
	binary.NativeEndian.PutUint32(info[0:], unix.ETHTOOL_GSSET_INFO)
	binary.NativeEndian.PutUint64(info[8:], 1<<ethSSFeatures)
	if err := ethtool(fd, name, info); err != nil {
		return false, fmt.Errorf("%s: ethtool features: %w", name, err)
	}
	n := int(binary.NativeEndian.Uint32(info[16:]))
	if binary.NativeEndian.Uint64(info[8:]) == 0 || n <= 0 || n > 1024 {
		return false, fmt.Errorf("%s: no ethtool features", name)
	}
	strs := make([]byte, 12+n*32) // struct ethtool_gstrings
	binary.NativeEndian.PutUint32(strs[0:], unix.ETHTOOL_GSTRINGS)
	binary.NativeEndian.PutUint32(strs[4:], ethSSFeatures)
	binary.NativeEndian.PutUint32(strs[8:], uint32(n))
	if err := ethtool(fd, name, strs); err != nil {
		return false, fmt.Errorf("%s: ethtool feature names: %w", name, err)
	}
	blocks := (n + 31) / 32
	feat := make([]byte, 8+blocks*16) // struct ethtool_gfeatures
	binary.NativeEndian.PutUint32(feat[0:], unix.ETHTOOL_GFEATURES)
	binary.NativeEndian.PutUint32(feat[4:], uint32(blocks))
	if err := ethtool(fd, name, feat); err != nil {
		return false, fmt.Errorf("%s: ethtool feature state: %w", name, err)
	}
	for i := range n {
		s := strs[12+i*32 : 12+(i+1)*32]
		s = s[:max(bytes.IndexByte(s, 0), 0)]
		if string(s) != "rx-vlan-hw-parse" && string(s) != "rx-vlan-stag-hw-parse" {
			continue
		}
		active := binary.NativeEndian.Uint32(feat[8+(i/32)*16+8:])
		if active&(1<<(i%32)) != 0 {
			return true, nil
		}
	}
	return false, nil
}

// ethtool runs the ethtool ioctl on device name with the command in data.
func ethtool(fd int, name string, data []byte) error {
	var ifr [40]byte // struct ifreq: the name, then ifr_data
	if len(name) >= unix.IFNAMSIZ {
		return fmt.Errorf("interface name %q too long", name)
	}
	copy(ifr[:], name)
	*(*uintptr)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = uintptr(unsafe.Pointer(&data[0]))
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr[0])))
	runtime.KeepAlive(data)
	if errno != 0 {
		return errno
	}
	return nil
}
