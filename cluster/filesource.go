package cluster

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Tunables of the file source. They are variables so that tests can shorten them.
var (
	// fileDebounce is how long the directory must stay quiet before it is reloaded: editors and
	// `kubectl`-style tools write several files, or one file in several steps, in a burst.
	fileDebounce = 50 * time.Millisecond
	// fileMaxDelay bounds how long a continuous stream of events can postpone a reload.
	fileMaxDelay = 500 * time.Millisecond
	// fileResync reloads the directory periodically even without events, as a safety net against
	// lost inotify events and a directory that was removed and recreated (which drops the watch).
	fileResync = time.Minute
	// fileRetry is how often a removed directory is looked for again.
	fileRetry = time.Second
)

// Size limits of the manifest directory. They are variables so that tests can lower them.
var (
	// maxFileSize bounds one manifest file; larger files are refused rather than read into memory.
	maxFileSize int64 = 32 << 20
	// maxDocumentSize bounds one YAML document (one object, or one v1 List): the API server refuses
	// requests over 3 MiB (--max-request-bytes), and decoding is what costs memory (a 32 MiB
	// EndpointSlice took 1.8 GB to decode), so a larger document is refused before decoding. Split
	// a bigger List into documents.
	maxDocumentSize = 3 << 20
	// maxDirBytes is the budget of one load of the whole directory: a file that would take the
	// total over it is refused (by itself; the files that fit are read).
	maxDirBytes int64 = 256 << 20
)

// manifestExtensions are the file name endings the file source reads.
var manifestExtensions = []string{".yaml", ".yml", ".json"}

// FileSource builds State from a directory of Kubernetes manifests (*.yaml, *.yml, *.json; files whose
// name starts with a dot are ignored, which skips editor swap files and ConfigMap-volume internals).
// Subdirectories are not read.
//
// Each document is decoded and validated on its own: a bad document becomes a Rejection and a log line,
// and everything else still loads. Documents whose bytes did not change since the previous Load yield
// the very same *Service / *EndpointSlice / *Node / MetalLB object pointers.
type FileSource struct {
	// Dir is the manifest directory.
	Dir string
	// AllowWorldWritable lets Load read a world-writable directory. Off by default: anyone who can
	// write there can steer traffic on this host.
	AllowWorldWritable bool

	logger hclog.Logger
	// proxyFilter says which Services and EndpointSlices are programmed (SetServiceProxyName).
	proxyFilter ServiceProxyFilter

	// mu serializes loads: the cache and prev belong to whoever loads.
	mu sync.Mutex
	// cache maps a document's SHA-256 to its decoded objects, from the previous load.
	cache map[[sha256.Size]byte][]decoded
	// files holds what each file yielded at the previous load, with the identity (inode, size,
	// times, mode) it had before it was read: a file whose identity did not change is not read,
	// split and hashed again. With 10,000 Services in the directory that was ~100 ms of every
	// reload; now a reload costs what the changed files hold.
	files map[string]fileResult
	// prev is the previous State, whose EndpointSlice lists and MetalLB config are reused when
	// nothing in them changed.
	prev *State
}

// SetServiceProxyName makes the source read only the Services and EndpointSlices labelled
// service.kubernetes.io/service-proxy-name=name (NodeConfig serviceProxyName). The default, "", is
// kube-proxy's choice: only those without that label. Objects labelled service.kubernetes.io/headless
// are left out either way. Call it before the first Load.
func (f *FileSource) SetServiceProxyName(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.proxyFilter = ServiceProxyFilter{Name: name}
}

// NewFileSource returns a file source for dir. A nil logger discards log lines.
func NewFileSource(dir string, logger hclog.Logger) *FileSource {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &FileSource{Dir: dir, logger: logger, cache: map[[sha256.Size]byte][]decoded{}}
}

// checkDir refuses a directory that is missing, not a directory, or (unless allowed) world-writable.
func (f *FileSource) checkDir() error {
	fi, err := os.Stat(f.Dir)
	if err != nil {
		return fmt.Errorf("manifest directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("manifest directory %s is not a directory", f.Dir)
	}
	if f.AllowWorldWritable {
		return nil
	}
	if fi.Mode().Perm()&0o002 != 0 {
		return fmt.Errorf("manifest directory %s is world-writable (mode %#o): any local user could inject "+
			"Services and redirect traffic; fix it with `chmod o-w %s` (or allow it explicitly with "+
			"AllowWorldWritable)", f.Dir, fi.Mode().Perm(), f.Dir)
	}
	return checkTrusted("manifest directory "+f.Dir, fi)
}

// fileIdent identifies one version of a file (os.Stat, following symlinks: a ConfigMap volume
// swaps the target of the link).
type fileIdent struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
	mode         os.FileMode
}

func statIdent(path string) (fileIdent, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileIdent{}, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileIdent{}, false
	}
	return fileIdent{dev: uint64(st.Dev), ino: st.Ino, size: fi.Size(), mtime: fi.ModTime().UnixNano(),
		ctime: st.Ctim.Nano(), mode: fi.Mode()}, true
}

// racyWindow: a file modified this recently is not trusted to show its next change in its times.
const racyWindow = time.Second

// fileResult is what one file yielded.
type fileResult struct {
	ident    fileIdent
	objs     []located
	rejected []Rejection
	sums     [][sha256.Size]byte // its documents, whose cache entries stay while it is unchanged
}

// located is a decoded object and where it came from.
type located struct {
	decoded
	source string
}

// Load reads the directory once and returns the new State. The error is only for a directory that
// cannot be used at all; bad files and documents are reported in State.Rejected (and logged).
func (f *FileSource) Load() (*State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()

	if err := f.checkDir(); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(f.Dir)
	if err != nil {
		return nil, fmt.Errorf("reading manifest directory: %w", err)
	}

	var objs []located
	var rejected []Rejection
	cache := map[[sha256.Size]byte][]decoded{}
	files := map[string]fileResult{}
	var total int64 // bytes of the directory's manifests so far, against maxDirBytes
	fileRejected := func(name, reason string) {
		rejected = append(rejected, Rejection{Kind: "file", Object: name, Source: "file " + name, Reason: reason})
	}
	overBudget := func(name string, size int64) bool {
		if total+size > maxDirBytes {
			fileRejected(name, fmt.Sprintf("not read: with its %d bytes the manifest directory would hold more than %d bytes", size, maxDirBytes))
			return true
		}
		total += size
		return false
	}
	for _, e := range entries { // os.ReadDir sorts by file name
		name := e.Name()
		if !isManifestName(name) {
			continue
		}
		// The identity is taken before the read: a file that changes while it is read is read
		// again at the next load.
		ident, identOK := statIdent(filepath.Join(f.Dir, name))
		if identOK && ident.mode.IsRegular() && overBudget(name, ident.size) {
			continue
		}
		if prev, ok := f.files[name]; ok && identOK && prev.ident == ident {
			objs = append(objs, prev.objs...)
			rejected = append(rejected, prev.rejected...)
			for _, sum := range prev.sums {
				cache[sum] = f.cache[sum]
			}
			files[name] = prev
			continue
		}
		data, err := f.readFile(name)
		if err != nil {
			fileRejected(name, err.Error())
			continue
		}
		if data == nil {
			continue // a directory with a manifest-like name
		}
		if !identOK && overBudget(name, int64(len(data))) {
			continue
		}
		res := fileResult{ident: ident}
		docs, splitErr := splitDocuments(data)
		for i, doc := range docs {
			sum := sha256.Sum256(doc)
			res.sums = append(res.sums, sum)
			ds, ok := cache[sum]
			if !ok {
				if ds, ok = f.cache[sum]; !ok {
					ds = decodeSized(doc)
				}
				cache[sum] = ds
			}
			src := fmt.Sprintf("file %s document %d", name, i+1)
			for _, d := range ds {
				s := src
				if d.item > 0 {
					s = fmt.Sprintf("%s item %d", src, d.item)
				}
				res.objs = append(res.objs, located{decoded: d, source: s})
			}
		}
		if splitErr != nil {
			src := fmt.Sprintf("file %s document %d", name, len(docs)+1)
			res.rejected = append(res.rejected, Rejection{Kind: "document", Source: src, Reason: splitErr.Error()})
		}
		objs = append(objs, res.objs...)
		rejected = append(rejected, res.rejected...)
		// A file modified within the last second is read again next time: file systems keep
		// times in coarse ticks (a few ms, or seconds), and a second write of the same size in
		// the tick of the first would not change its identity ("racy git" has the same rule).
		if identOK && time.Since(time.Unix(0, ident.mtime)) > racyWindow {
			files[name] = res
		}
	}
	f.cache = cache
	f.files = files

	st := f.build(objs, rejected)
	for _, r := range st.Rejected {
		f.logger.Warn("rejected manifest object", "kind", r.Kind, "object", r.Object, "source", r.Source, "reason", r.Reason)
	}
	f.prev = st
	return st, nil
}

// isManifestName reports whether a directory entry's name is one the source reads.
func isManifestName(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	ext := strings.ToLower(filepath.Ext(name))
	return slices.Contains(manifestExtensions, ext)
}

// readFile reads one manifest, following symlinks (ConfigMap volumes are symlinks). It returns nil,
// nil for a directory (a manifest-like name is not enough to make it one). Anything else that is
// not a regular file (a FIFO, a device, a socket, or a link to one) is an error, found without
// opening it and without ever blocking (openRegular): a FIFO named a.yaml must not stall the node.
func (f *FileSource) readFile(name string) ([]byte, error) {
	fh, fi, err := openRegular(filepath.Join(f.Dir, name))
	if err != nil {
		if fi != nil && fi.IsDir() {
			return nil, nil
		}
		return nil, fmt.Errorf("opening: %w", err)
	}
	defer fh.Close()
	if !f.AllowWorldWritable {
		if err := checkTrusted("file", fi); err != nil {
			return nil, err
		}
	}
	data, err := readRegular(fh, maxFileSize)
	if err != nil {
		return nil, fmt.Errorf("reading: %w", err)
	}
	return data, nil
}

// decodeSized decodes a document that is not larger than maxDocumentSize; a larger one is refused
// undecoded.
func decodeSized(doc []byte) []decoded {
	if len(doc) > maxDocumentSize {
		return []decoded{{kind: "document", err: fmt.Errorf("%d bytes, larger than the %d bytes the API server accepts for one object; not decoded", len(doc), maxDocumentSize)}}
	}
	return decodeDocument(doc)
}

// build assembles a State from decoded objects in (file name, document index) order: the first
// definition of a name wins, later ones are rejected.
func (f *FileSource) build(objs []located, rejected []Rejection) *State {
	st := &State{
		Services:       map[ServiceKey]*Service{},
		EndpointSlices: map[ServiceKey][]*EndpointSlice{},
		Nodes:          map[string]*Node{},
		Rejected:       rejected,
	}
	reject := func(o located, reason string, addr netip.Addr) {
		st.Rejected = append(st.Rejected, Rejection{Kind: o.kind, Object: o.name, Source: o.source, Reason: reason, Addr: addr})
	}
	// firstSeen remembers where each object was defined first, to say so when rejecting a duplicate.
	firstSeen := map[string]string{}
	duplicate := func(o located, key string) bool {
		if first, ok := firstSeen[key]; ok {
			reject(o, fmt.Sprintf("duplicate %s %s: already defined in %s", o.kind, o.name, first), netip.Addr{})
			return true
		}
		firstSeen[key] = o.source
		return false
	}
	claims := serviceClaims{}
	var mlb MetalLBConfig
	for _, o := range objs {
		switch {
		case o.proxied && f.proxyFilter.Ignores(o.proxyLabels):
			// Labelled for another proxy, or headless: the Kubernetes source would never see it.
		case o.err != nil:
			reject(o, o.err.Error(), ErrorAddr(o.err))
		case o.service != nil:
			if duplicate(o, "Service/"+o.service.Key.String()) {
				continue
			}
			if reason, addr, taken := claims.conflict(o.service); taken {
				reject(o, reason, addr)
				continue
			}
			claims.add(o.service)
			st.Services[o.service.Key] = o.service
		case o.slice != nil:
			if !duplicate(o, "EndpointSlice/"+o.slice.Namespace+"/"+o.slice.Name) {
				st.EndpointSlices[o.slice.Service] = append(st.EndpointSlices[o.slice.Service], o.slice)
			}
		case o.node != nil:
			if !duplicate(o, "Node/"+o.node.Name) {
				st.Nodes[o.node.Name] = o.node
			}
		case o.metallb != nil:
			if !duplicate(o, metallbKey(o.kind, o.metallb)) {
				mlb.add(o.metallb)
			}
		}
	}

	for key, list := range st.EndpointSlices {
		slices.SortStableFunc(list, func(a, b *EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
		// Reuse the previous list when it holds exactly the same slices, so consumers can compare the
		// list header too.
		if f.prev != nil {
			if old, ok := f.prev.EndpointSlices[key]; ok && slices.Equal(old, list) {
				st.EndpointSlices[key] = old
			}
		}
	}

	mlb.sort()
	st.MetalLB = &mlb
	if f.prev != nil && f.prev.MetalLB.equal(st.MetalLB) {
		st.MetalLB = f.prev.MetalLB
	}
	return st
}

// serviceClaims records the cluster IPs and node ports taken so far. In a cluster the API server's
// allocators keep them unique; files have no allocator, and two Services on one cluster IP or node port
// would make the dataplane's choice arbitrary, so the later Service is refused.
type serviceClaims map[serviceClaim]ServiceKey

// serviceClaim is one thing a Service takes: a cluster IP (addr) or a node port (proto, nodePort).
type serviceClaim struct {
	addr     netip.Addr
	proto    Protocol
	nodePort uint16
}

func (c serviceClaim) String() string {
	if c.addr.IsValid() {
		return "cluster IP " + c.addr.String()
	}
	return fmt.Sprintf("nodePort %s/%d", c.proto, c.nodePort)
}

// claimKeys lists what a Service takes: its cluster IPs and its node ports (the health-check node port
// is TCP).
func claimKeys(svc *Service) []serviceClaim {
	var keys []serviceClaim
	for _, a := range svc.ClusterIPs {
		keys = append(keys, serviceClaim{addr: a})
	}
	for _, p := range svc.Ports {
		if p.NodePort != 0 {
			keys = append(keys, serviceClaim{proto: p.Protocol, nodePort: p.NodePort})
		}
	}
	if svc.HealthCheckNodePort != 0 {
		keys = append(keys, serviceClaim{proto: TCP, nodePort: svc.HealthCheckNodePort})
	}
	return keys
}

// conflict says which earlier Service already holds something svc claims (ok false if none), and
// the cluster IP it is about (zero for a node port).
func (c serviceClaims) conflict(svc *Service) (reason string, addr netip.Addr, ok bool) {
	for _, k := range claimKeys(svc) {
		if owner, taken := c[k]; taken {
			return fmt.Sprintf("%s is already used by Service %s", k, owner), k.addr, true
		}
	}
	return "", netip.Addr{}, false
}

func (c serviceClaims) add(svc *Service) {
	for _, k := range claimKeys(svc) {
		c[k] = svc.Key
	}
}

func metallbKey(kind string, o metav1.Object) string {
	return kind + "/" + o.GetNamespace() + "/" + o.GetName()
}

// sameState reports whether two snapshots are indistinguishable for consumers: the same object
// pointers and the same rejections.
func sameState(a, b *State) bool {
	if a == nil || b == nil {
		return a == b
	}
	sameMap := func(x, y map[ServiceKey]*Service) bool {
		if len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if y[k] != v {
				return false
			}
		}
		return true
	}
	if !sameMap(a.Services, b.Services) || len(a.EndpointSlices) != len(b.EndpointSlices) || len(a.Nodes) != len(b.Nodes) {
		return false
	}
	for k, v := range a.EndpointSlices {
		if !slices.Equal(v, b.EndpointSlices[k]) {
			return false
		}
	}
	for k, v := range a.Nodes {
		if b.Nodes[k] != v {
			return false
		}
	}
	return slices.Equal(a.Rejected, b.Rejected) && a.MetalLB.equal(b.MetalLB)
}

// Run loads the directory, calls onChange with the first State, then watches the directory and calls
// onChange with a new State after every change (debounced; files added, removed, renamed and rewritten,
// including editors that save by renaming a temporary file over the original). onChange is called from
// Run's goroutine only, one call at a time, and not for changes that leave the State as it was.
//
// Run returns nil when ctx is cancelled, or an error if the first Load or setting up the watch fails.
// Later failures (the directory disappears) are logged; the last good State stays in force and the
// directory is retried.
func (f *FileSource) Run(ctx context.Context, onChange func(*State)) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching manifest directory: %w", err)
	}
	defer w.Close()
	// Watch before the first load, so that a change made during it is not missed.
	if err := w.Add(f.Dir); err != nil {
		return fmt.Errorf("watching manifest directory %s: %w", f.Dir, err)
	}
	st, err := f.Load()
	if err != nil {
		return err
	}
	onChange(st)
	last := st

	// A nil channel blocks forever: the debounce timer is armed only while changes are pending.
	var (
		debounce   *time.Timer
		debounceC  <-chan time.Time
		firstEvent time.Time
		watching   = true
	)
	resync := time.NewTicker(fileResync)
	defer resync.Stop()
	arm := func() {
		now := time.Now()
		if debounceC == nil {
			firstEvent = now
		}
		delay := min(fileDebounce, max(0, fileMaxDelay-now.Sub(firstEvent)))
		if debounce == nil {
			debounce = time.NewTimer(delay)
		} else {
			debounce.Reset(delay)
		}
		debounceC = debounce.C
	}
	// retryC ticks while the directory is gone, to notice it coming back (nothing watches it then).
	var retryC <-chan time.Time
	var lastErr string
	reload := func() {
		if !watching {
			// The directory was removed earlier; a new one at the same path needs a new watch.
			if err := w.Add(f.Dir); err == nil {
				watching = true
				f.logger.Info("watching manifest directory again", "dir", f.Dir)
			}
		}
		retryC = nil
		if !watching {
			retryC = time.After(fileRetry)
		}
		st, err := f.Load()
		if err != nil {
			// Log a failure once, not at every retry.
			if err.Error() != lastErr {
				f.logger.Error("reloading manifest directory failed; keeping the last good state", "dir", f.Dir, "err", err)
				lastErr = err.Error()
			}
			return
		}
		lastErr = ""
		if !sameState(last, st) {
			last = st
			onChange(st)
		}
	}

	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("manifest directory watcher closed")
			}
			if filepath.Clean(ev.Name) == filepath.Clean(f.Dir) && (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) {
				watching = false
				f.logger.Warn("manifest directory removed; keeping the last good state", "dir", f.Dir)
			}
			f.logger.Trace("manifest directory event", "event", ev.String())
			arm()
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("manifest directory watcher closed")
			}
			// Typically an inotify queue overflow: events were lost, so reload everything.
			f.logger.Warn("manifest directory watch error; reloading", "dir", f.Dir, "err", err)
			arm()
		case <-debounceC:
			debounceC = nil
			reload()
		case <-resync.C:
			reload()
		case <-retryC:
			reload()
		}
	}
}
