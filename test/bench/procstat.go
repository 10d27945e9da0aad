package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Readers of /proc for the gateway rows: a process's CPU time, the BPF maps a process holds and
// their memory, the kernel's slab caches (conntrack's), a namespace's conntrack count, and the
// gateway's Prometheus counters. The parsers are pure (their input is the file's text) and tested
// in gwparse_test.go.

// clockTick is USER_HZ, the unit of /proc/<pid>/stat's times (100 on every Linux architecture
// Go supports).
const clockTick = 10 * time.Millisecond

// parseProcStat reads a process's parent and CPU time (user + system) from /proc/<pid>/stat. The
// command name (field 2) is in parentheses and may hold spaces and parentheses: the fields are
// counted after its last ')'.
func parseProcStat(s string) (ppid int, cpu time.Duration, err error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/<pid>/stat: no command name in %q", firstLines(s, 1))
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("/proc/<pid>/stat: %d fields after the command name", len(f))
	}
	ppid, err1 := strconv.Atoi(f[1])
	ut, err2 := strconv.ParseInt(f[11], 10, 64)
	st, err3 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, fmt.Errorf("/proc/<pid>/stat: bad numbers in %q", firstLines(s, 1))
	}
	return ppid, time.Duration(ut+st) * clockTick, nil
}

// procTreeCPU is the CPU time of pid and of its children (nginx's workers under its master).
func procTreeCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	_, total, err := parseProcStat(string(b))
	if err != nil {
		return 0, err
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // gone meanwhile
		}
		if ppid, cpu, err := parseProcStat(string(b)); err == nil && ppid == pid {
			total += cpu
		}
	}
	return total, nil
}

// bpfMapInfo is one BPF map a process holds, from /proc/<pid>/fdinfo/<fd>.
type bpfMapInfo struct {
	id, mapType, maxEntries, keySize, valueSize int
	memlock                                     int64 // the kernel's estimate of the map's memory, bytes
}

// parseFDInfo reads a BPF map's fdinfo; ok is false for a descriptor that is not a map.
func parseFDInfo(s string) (m bpfMapInfo, ok bool) {
	fields := map[string]*int{"map_type": &m.mapType, "max_entries": &m.maxEntries, "key_size": &m.keySize,
		"value_size": &m.valueSize, "map_id": &m.id}
	seen := 0
	for _, l := range strings.Split(s, "\n") {
		k, v, found := strings.Cut(l, ":")
		if !found {
			continue
		}
		v = strings.TrimSpace(v)
		if p, ok := fields[k]; ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				return bpfMapInfo{}, false
			}
			*p = n
			seen++
		}
		if k == "memlock" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return bpfMapInfo{}, false
			}
			m.memlock = n
			seen++
		}
	}
	return m, seen == len(fields)+1
}

// processMaps lists the BPF maps pid holds open, each once.
func processMaps(pid int) ([]bpfMapInfo, error) {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var maps []bpfMapInfo
	seen := map[int]bool{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if m, ok := parseFDInfo(string(b)); ok && !seen[m.id] {
			seen[m.id] = true
			maps = append(maps, m)
		}
	}
	return maps, nil
}

// slabCache is one line of /proc/slabinfo.
type slabCache struct {
	active, objects, objSize int
}

// bytes is the memory of the cache's objects (its slabs' slack aside).
func (c slabCache) bytes() int64 { return int64(c.objects) * int64(c.objSize) }

// parseSlabinfo reads /proc/slabinfo (version 2.1): name, active objects, objects, object size.
func parseSlabinfo(s string) (map[string]slabCache, error) {
	caches := map[string]slabCache{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "slabinfo") || strings.HasPrefix(l, "#") {
			continue
		}
		f := strings.Fields(l)
		if len(f) < 4 {
			continue
		}
		var c slabCache
		var err error
		if c.active, err = strconv.Atoi(f[1]); err != nil {
			return nil, fmt.Errorf("/proc/slabinfo: %q", l)
		}
		if c.objects, err = strconv.Atoi(f[2]); err != nil {
			return nil, fmt.Errorf("/proc/slabinfo: %q", l)
		}
		if c.objSize, err = strconv.Atoi(f[3]); err != nil {
			return nil, fmt.Errorf("/proc/slabinfo: %q", l)
		}
		caches[f[0]] = c
	}
	if len(caches) == 0 {
		return nil, fmt.Errorf("/proc/slabinfo: no caches")
	}
	return caches, nil
}

// readSlab reads one cache of /proc/slabinfo (the zero value when the kernel has none by that name).
func readSlab(name string) (slabCache, error) {
	b, err := os.ReadFile("/proc/slabinfo")
	if err != nil {
		return slabCache{}, err
	}
	caches, err := parseSlabinfo(string(b))
	if err != nil {
		return slabCache{}, err
	}
	return caches[name], nil
}

// parseCounters reads the samples of one Prometheus counter family by label value from the text
// exposition format: `name{label="value"} 123` lines.
func parseCounters(text, name, label string) map[string]float64 {
	out := map[string]float64{}
	prefix := name + "{"
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		labels, rest, ok := strings.Cut(l[len(prefix):], "}")
		if !ok {
			continue
		}
		var value string
		for _, kv := range strings.Split(labels, ",") {
			if k, v, ok := strings.Cut(kv, "="); ok && k == label {
				value = strings.Trim(v, `"`)
			}
		}
		f := strings.Fields(rest)
		if value == "" || len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			out[value] = v
		}
	}
	return out
}
