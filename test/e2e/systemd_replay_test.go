package e2e

// Replaying a systemd unit's sandbox without systemd (this machine's PID 1 is not systemd): the
// test reads deploy/systemd/vipgate-gateway.service, turns its [Service] settings into a
// unitReplay, and starts the command through this test binary ("vg-unit-replay", see init below),
// which applies them to itself the way systemd's exec does, then executes the command:
//
//   - CapabilityBoundingSet, AmbientCapabilities (User=root: permitted = the bounding set),
//   - NoNewPrivileges, UMask,
//   - SystemCallFilter (with SystemCallArchitectures=native and SystemCallErrorNumber) as a seccomp
//     filter, with the argument checks systemd adds for RestrictAddressFamilies,
//     MemoryDenyWriteExecute, LockPersonality and RestrictNamespaces,
//   - ProtectSystem=strict (every mount read-only), ProtectHome, ProcSubset=pid and
//     ProtectProc=invisible (a fresh procfs), and the writable exceptions: StateDirectory,
//     RuntimeDirectory, ReadWritePaths, and /tmp and /var/tmp for PrivateTmp.
//
// Not replayed: PrivateTmp's privacy (/tmp stays the host's, writable), PrivateDevices' private
// /dev, RestrictRealtime and RestrictSUIDSGID (argument checks on sched_setscheduler and chmod),
// ProtectKernelLogs' and ProtectClock's device rules, LimitNOFILE. None of them is what the
// gateway's features need.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// unitReplay is what the replaying process applies to itself before it executes the command.
type unitReplay struct {
	// Caps is the bounding set (capability numbers); Ambient the ambient set.
	Caps, Ambient []int
	NoNewPrivs    bool
	Umask         int
	// Syscalls are the allowed system call numbers (nil: no SystemCallFilter); Errno what a
	// refused one returns.
	Syscalls []uint32
	Errno    int
	// Families are the allowed socket families (nil: any).
	Families           []int
	MDWE               bool // MemoryDenyWriteExecute
	LockPersonality    bool
	RestrictNamespaces bool
	// ReadOnly: ProtectSystem=strict. Writable are the paths left writable (ReadWritePaths, /tmp,
	// /var/tmp); Binds the unit's StateDirectory and RuntimeDirectory, target -> the test's
	// directory behind it (created on a tmpfs parent when the host lacks the target).
	ReadOnly bool
	Writable []string
	Binds    map[string]string
	// Hide are mounted over with an empty read-only tmpfs (ProtectHome).
	Hide []string
	// ProcSubsetPID mounts a fresh procfs with subset=pid,hidepid=invisible.
	ProcSubsetPID bool
}

// systemdUnit is a unit file's [Service] section: each key's values in order.
type systemdUnit map[string][]string

// readSystemdUnit reads the [Service] section of a unit file (no line continuations).
func readSystemdUnit(path string) (systemdUnit, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	u := systemdUnit{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			section = strings.Trim(line, "[]")
		case section == "Service":
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				return nil, fmt.Errorf("%s: %q is not key=value", path, line)
			}
			if strings.HasSuffix(v, "\\") {
				return nil, fmt.Errorf("%s: line continuations are not supported: %q", path, line)
			}
			u[strings.TrimSpace(k)] = append(u[strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	return u, sc.Err()
}

// last is the last value of key ("" if unset).
func (u systemdUnit) last(key string) string {
	if v := u[key]; len(v) > 0 {
		return v[len(v)-1]
	}
	return ""
}

// yes says whether a boolean key is on.
func (u systemdUnit) yes(key string) bool {
	switch strings.ToLower(u.last(key)) {
	case "yes", "true", "on", "1":
		return true
	}
	return false
}

// capNames are the capabilities by number (linux/capability.h).
var capNames = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
	"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
	"CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
	"CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
	"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE"}

// capSet reads the capability lists of key (systemd merges several lines; "~" inverts).
func (u systemdUnit) capSet(key string, unset []int) ([]int, error) {
	if len(u[key]) == 0 {
		return unset, nil
	}
	set := map[int]bool{}
	for _, line := range u[key] {
		invert := strings.HasPrefix(line, "~")
		line = strings.TrimPrefix(line, "~")
		mask := map[int]bool{}
		for _, name := range strings.Fields(line) {
			n := slices.Index(capNames, name)
			if n < 0 {
				return nil, fmt.Errorf("%s: unknown capability %q", key, name)
			}
			mask[n] = true
		}
		if invert {
			for n := range capNames {
				if !mask[n] {
					set[n] = true
				}
			}
			continue
		}
		for n := range mask {
			set[n] = true
		}
	}
	out := []int{}
	for n := range set {
		out = append(out, n)
	}
	sort.Ints(out)
	return out, nil
}

// syscallGroups reads systemd's syscall groups (`systemd-analyze syscall-filter`): group -> members
// (names and @groups).
func syscallGroups() (map[string][]string, error) {
	out, err := exec.Command("systemd-analyze", "syscall-filter").Output()
	if err != nil {
		return nil, fmt.Errorf("systemd-analyze syscall-filter: %w", err)
	}
	groups := map[string][]string{}
	cur := ""
	for _, line := range strings.Split(string(out), "\n") {
		t := strings.TrimSpace(line)
		switch {
		case t == "" || strings.HasPrefix(t, "#"):
		case !strings.HasPrefix(line, " ") && strings.HasPrefix(t, "@"):
			cur = t
			groups[cur] = nil
		case cur != "" && strings.HasPrefix(line, " "):
			groups[cur] = append(groups[cur], t)
		}
	}
	if len(groups["@system-service"]) == 0 {
		return nil, fmt.Errorf("systemd-analyze syscall-filter: no @system-service group in:\n%s", out)
	}
	return groups, nil
}

// expandSyscalls adds the names of name (a syscall or an @group) to set (or removes them).
func expandSyscalls(groups map[string][]string, name string, set map[string]bool, add bool) error {
	if !strings.HasPrefix(name, "@") {
		if add {
			set[name] = true
		} else {
			delete(set, name)
		}
		return nil
	}
	members, ok := groups[name]
	if !ok {
		return fmt.Errorf("unknown syscall group %s", name)
	}
	for _, m := range members {
		if err := expandSyscalls(groups, m, set, add); err != nil {
			return err
		}
	}
	return nil
}

// syscallNumbers reads the amd64 system call numbers from golang.org/x/sys (zsysnum_linux_amd64.go):
// lower-case name -> number.
func syscallNumbers() (map[string]uint32, error) {
	dir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "golang.org/x/sys").Output()
	if err != nil {
		return nil, fmt.Errorf("go list golang.org/x/sys: %w", err)
	}
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(dir)), "unix", "zsysnum_linux_amd64.go"))
	if err != nil {
		return nil, err
	}
	out := map[string]uint32{}
	for _, line := range strings.Split(string(src), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && strings.HasPrefix(f[0], "SYS_") && f[1] == "=" {
			if n, err := strconv.ParseUint(f[2], 10, 32); err == nil {
				out[strings.ToLower(strings.TrimPrefix(f[0], "SYS_"))] = uint32(n)
			}
		}
	}
	return out, nil
}

// socket families by systemd's names.
var addressFamilies = map[string]int{"AF_UNIX": unix.AF_UNIX, "AF_INET": unix.AF_INET, "AF_INET6": unix.AF_INET6,
	"AF_NETLINK": unix.AF_NETLINK, "AF_PACKET": unix.AF_PACKET}

// replayOf turns a unit's [Service] settings into a unitReplay. binds gives, for the unit's
// StateDirectory/RuntimeDirectory targets, the test's directories behind them.
func replayOf(u systemdUnit, binds func(target string) string) (*unitReplay, error) {
	if runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("the seccomp replay knows amd64 only")
	}
	r := &unitReplay{Errno: int(unix.EPERM), Umask: 0o022, Binds: map[string]string{}}
	all := make([]int, len(capNames))
	for i := range all {
		all[i] = i
	}
	var err error
	if r.Caps, err = u.capSet("CapabilityBoundingSet", all); err != nil {
		return nil, err
	}
	if r.Ambient, err = u.capSet("AmbientCapabilities", nil); err != nil {
		return nil, err
	}
	if u.last("User") != "" && u.last("User") != "root" {
		return nil, fmt.Errorf("User=%s: the replay runs as root only", u.last("User"))
	}
	r.NoNewPrivs = u.yes("NoNewPrivileges")
	if m := u.last("UMask"); m != "" {
		n, err := strconv.ParseUint(m, 8, 32)
		if err != nil {
			return nil, fmt.Errorf("UMask=%s: %w", m, err)
		}
		r.Umask = int(n)
	}
	if e := u.last("SystemCallErrorNumber"); e != "" {
		if e != "EPERM" {
			return nil, fmt.Errorf("SystemCallErrorNumber=%s: the replay knows EPERM only", e)
		}
	}
	if len(u["SystemCallFilter"]) > 0 {
		if a := u.last("SystemCallArchitectures"); a != "native" {
			return nil, fmt.Errorf("SystemCallArchitectures=%q: the replay knows native only", a)
		}
		groups, err := syscallGroups()
		if err != nil {
			return nil, err
		}
		nums, err := syscallNumbers()
		if err != nil {
			return nil, err
		}
		// systemd (config_parse_syscall_filter): the first line decides allow- or deny-list; an
		// allow list starts from @default; each later line adds (or with "~" removes) in order.
		set := map[string]bool{}
		if strings.HasPrefix(u["SystemCallFilter"][0], "~") {
			return nil, fmt.Errorf("SystemCallFilter: the replay knows allow lists only")
		}
		if err := expandSyscalls(groups, "@default", set, true); err != nil {
			return nil, err
		}
		for _, line := range u["SystemCallFilter"] {
			add := !strings.HasPrefix(line, "~")
			for _, name := range strings.Fields(strings.TrimPrefix(line, "~")) {
				name, _, _ = strings.Cut(name, ":") // name:errno
				if err := expandSyscalls(groups, name, set, add); err != nil {
					return nil, err
				}
			}
		}
		for name := range set {
			if n, ok := nums[name]; ok { // others do not exist on amd64 (systemd skips them too)
				r.Syscalls = append(r.Syscalls, n)
			}
		}
		sort.Slice(r.Syscalls, func(i, j int) bool { return r.Syscalls[i] < r.Syscalls[j] })
	}
	for _, line := range u["RestrictAddressFamilies"] {
		if strings.HasPrefix(line, "~") {
			return nil, fmt.Errorf("RestrictAddressFamilies=%s: the replay knows allow lists only", line)
		}
		for _, name := range strings.Fields(line) {
			f, ok := addressFamilies[name]
			if !ok {
				return nil, fmt.Errorf("RestrictAddressFamilies: unknown family %s", name)
			}
			r.Families = append(r.Families, f)
		}
	}
	r.MDWE = u.yes("MemoryDenyWriteExecute")
	r.LockPersonality = u.yes("LockPersonality")
	if rn := u.last("RestrictNamespaces"); rn != "" && rn != "yes" && rn != "no" {
		return nil, fmt.Errorf("RestrictNamespaces=%s: the replay knows yes and no only", rn)
	}
	r.RestrictNamespaces = u.yes("RestrictNamespaces")
	switch ps := u.last("ProtectSystem"); ps {
	case "strict":
		r.ReadOnly = true
	case "", "no":
	default:
		return nil, fmt.Errorf("ProtectSystem=%s: the replay knows strict only", ps)
	}
	if u.yes("PrivateTmp") {
		r.Writable = append(r.Writable, "/tmp", "/var/tmp")
	}
	for _, line := range u["ReadWritePaths"] {
		for _, p := range strings.Fields(line) {
			r.Writable = append(r.Writable, strings.TrimLeft(p, "-+"))
		}
	}
	for key, base := range map[string]string{"StateDirectory": "/var/lib", "RuntimeDirectory": "/run"} {
		for _, line := range u[key] {
			for _, d := range strings.Fields(line) {
				target := filepath.Join(base, d)
				r.Binds[target] = binds(target)
			}
		}
	}
	if u.yes("ProtectHome") {
		r.Hide = []string{"/home", "/root", "/run/user"}
	}
	r.ProcSubsetPID = u.last("ProcSubset") == "pid"
	return r, nil
}

// replayCommand is the command line that runs args under r (r is written to dir).
func replayCommand(r *unitReplay, dir string, args ...string) ([]string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "unit-replay.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return nil, err
	}
	return append([]string{self, "vg-unit-replay", path, "--"}, args...), nil
}

// init runs the replay when this test binary is started as "vg-unit-replay SPEC -- COMMAND...":
// before the testing package, on the main thread, which stays locked (every setting below is
// per thread, and the exec happens from it).
func init() {
	if len(os.Args) < 5 || os.Args[1] != "vg-unit-replay" || os.Args[3] != "--" {
		return
	}
	runtime.LockOSThread()
	err := runReplay(os.Args[2], os.Args[4:])
	fmt.Fprintf(os.Stderr, "vg-unit-replay: %v\n", err)
	os.Exit(126)
}

func runReplay(specPath string, argv []string) error {
	b, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var r unitReplay
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	bin, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	// Before the mounts: ProcSubset=pid hides /proc/sys.
	lastCap, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return err
	}
	if err := replayMounts(&r); err != nil {
		return fmt.Errorf("mounts: %w", err)
	}
	syscall.Umask(r.Umask)
	if err := replayCaps(&r, strings.TrimSpace(string(lastCap))); err != nil {
		return fmt.Errorf("capabilities: %w", err)
	}
	if r.NoNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("no_new_privs: %w", err)
		}
	}
	if r.Syscalls != nil {
		prog, err := seccompProgram(&r)
		if err != nil {
			return err
		}
		fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
		// No Go code may run after this but the exec (the filter is this thread's only).
		if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&fprog)), 0, 0); err != nil {
			return fmt.Errorf("seccomp: %w", err)
		}
	}
	return syscall.Exec(bin, argv, os.Environ())
}

// replayMounts gives this thread a mount namespace of its own and makes it what the unit's
// ProtectSystem/ProtectHome/ProcSubset and writable paths describe.
func replayMounts(r *unitReplay) error {
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private: %w", err)
	}
	if r.ProcSubsetPID {
		if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "subset=pid,hidepid=invisible"); err != nil {
			return fmt.Errorf("procfs subset=pid: %w", err)
		}
	}
	// State and runtime directories: the test's directory behind the target. A target the host
	// lacks gets a tmpfs parent in this namespace (nothing is created on the host).
	targets := make([]string, 0, len(r.Binds))
	for t := range r.Binds {
		targets = append(targets, t)
	}
	sort.Strings(targets)
	for _, target := range targets {
		if _, err := os.Stat(target); err != nil {
			parent := filepath.Dir(target)
			if err := unix.Mount("tmpfs", parent, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
				return fmt.Errorf("tmpfs on %s: %w", parent, err)
			}
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
		}
		if err := unix.Mount(r.Binds[target], target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding %s: %w", target, err)
		}
	}
	var writable []string
	if r.ReadOnly {
		writable = append(append(writable, r.Writable...), targets...)
		writable = slices.DeleteFunc(writable, func(w string) bool { _, err := os.Stat(w); return err != nil })
		for _, w := range writable {
			if err := unix.Mount(w, w, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				return fmt.Errorf("binding %s: %w", w, err)
			}
		}
		if err := unix.MountSetattr(-1, "/", unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
			return fmt.Errorf("read-only /: %w", err)
		}
		for _, w := range writable {
			if err := unix.MountSetattr(-1, w, unix.AT_RECURSIVE, &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY}); err != nil {
				return fmt.Errorf("writable %s: %w", w, err)
			}
		}
	}
	for _, h := range r.Hide {
		if _, err := os.Stat(h); err != nil {
			continue
		}
		if err := unix.Mount("tmpfs", h, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755"); err != nil {
			return fmt.Errorf("hiding %s: %w", h, err)
		}
	}
	return nil
}

// replayCaps sets this thread's bounding, inheritable and ambient sets; exec then gives root
// the bounding set as permitted and effective.
func replayCaps(r *unitReplay, lastCap string) error {
	last, err := strconv.Atoi(lastCap)
	if err != nil {
		return fmt.Errorf("cap_last_cap %q: %w", lastCap, err)
	}
	keep := map[int]bool{}
	for _, c := range r.Caps {
		keep[c] = true
	}
	for c := 0; c <= last; c++ {
		if !keep[c] {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
				return fmt.Errorf("dropping %d from the bounding set: %w", c, err)
			}
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	for _, c := range r.Ambient {
		data[c/32].Inheritable |= 1 << (c % 32)
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return err
	}
	for _, c := range r.Ambient {
		if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, uintptr(c), 0, 0); err != nil {
			return fmt.Errorf("ambient %d: %w", c, err)
		}
	}
	return nil
}

// The seccomp filter's pieces (linux/seccomp.h, linux/audit.h).
const (
	auditArchX8664 = 0xc000003e
	x32SyscallBit  = 0x40000000
	seccompArgOff  = 16       // struct seccomp_data: nr, arch, instruction_pointer, args[6]
	shmExec        = 0o100000 // SHM_EXEC (linux/shm.h)
	nsCloneFlags   = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
		unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWTIME
)

// seccompProgram builds the unit's filter: the native architecture only; the allowed system calls,
// some with systemd's argument checks; anything else fails with r.Errno.
func seccompProgram(r *unitReplay) ([]unix.SockFilter, error) {
	allow := bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW}
	fail := func(errno int) bpf.Instruction { return bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(errno)} }
	deny := fail(r.Errno)
	arg := func(i int) bpf.Instruction { return bpf.LoadAbsolute{Off: uint32(seccompArgOff + 8*i), Size: 4} } // low 32 bits
	// maskDeny: the call fails when arg i & mask == want (want == 0: when any bit of mask is set).
	maskDeny := func(i int, mask, want uint32) []bpf.Instruction {
		if want == 0 {
			return []bpf.Instruction{arg(i), bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: mask, SkipFalse: 1}, deny, allow}
		}
		return []bpf.Instruction{arg(i), bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: mask},
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: want, SkipFalse: 1}, deny, allow}
	}
	special := map[uint32][]bpf.Instruction{}
	if r.Families != nil {
		var b []bpf.Instruction
		b = append(b, arg(0))
		for _, f := range r.Families {
			b = append(b, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(f), SkipFalse: 1}, allow)
		}
		special[unix.SYS_SOCKET] = append(b, fail(int(unix.EAFNOSUPPORT)))
	}
	if r.MDWE {
		special[unix.SYS_MMAP] = maskDeny(2, unix.PROT_EXEC|unix.PROT_WRITE, unix.PROT_EXEC|unix.PROT_WRITE)
		special[unix.SYS_MPROTECT] = maskDeny(2, unix.PROT_EXEC, 0)
		special[unix.SYS_PKEY_MPROTECT] = maskDeny(2, unix.PROT_EXEC, 0)
		special[unix.SYS_SHMAT] = maskDeny(2, shmExec, 0)
	}
	if r.LockPersonality {
		special[unix.SYS_PERSONALITY] = []bpf.Instruction{arg(0),
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipFalse: 1}, allow, // PER_LINUX, the persona at start
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0xffffffff, SkipFalse: 1}, allow, // a query
			deny}
	}
	if r.RestrictNamespaces {
		special[unix.SYS_UNSHARE] = maskDeny(0, nsCloneFlags, 0)
		special[unix.SYS_CLONE] = maskDeny(0, nsCloneFlags, 0)
		special[unix.SYS_SETNS] = []bpf.Instruction{deny}
		special[unix.SYS_CLONE3] = []bpf.Instruction{fail(int(unix.ENOSYS))} // flags not readable: libc falls back to clone
	}
	p := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: auditArchX8664, SkipTrue: 1}, deny,
		bpf.LoadAbsolute{Off: 0, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: x32SyscallBit, SkipFalse: 1}, deny,
	}
	for _, nr := range r.Syscalls {
		if b, ok := special[nr]; ok {
			// Each block ends in returns: the number stays in A for the next test.
			p = append(p, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipFalse: uint8(len(b))})
			p = append(p, b...)
			continue
		}
		p = append(p, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipFalse: 1}, allow)
	}
	p = append(p, deny)
	raw, err := bpf.Assemble(p)
	if err != nil {
		return nil, fmt.Errorf("assembling the seccomp filter: %w", err)
	}
	out := make([]unix.SockFilter, len(raw))
	for i, ins := range raw {
		out[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	return out, nil
}
