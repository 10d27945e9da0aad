package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// benchDir writes services Services, each with one EndpointSlice of 10 endpoints, over 10 files.
func benchDir(b *testing.B, services int) string {
	dir := b.TempDir()
	var files [10]strings.Builder
	for i := range services {
		w := &files[i%10]
		fmt.Fprintf(w, "apiVersion: v1\nkind: Service\nmetadata: {name: svc-%d, namespace: bench}\n"+
			"spec: {type: NodePort, clusterIP: 10.96.%d.%d, ports: [{name: http, port: 80, nodePort: %d}]}\n---\n",
			i, i/250, i%250+1, 30000+i)
		fmt.Fprintf(w, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: svc-%d-a, namespace: bench, "+
			"labels: {kubernetes.io/service-name: svc-%d}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n", i, i)
		for e := range 10 {
			fmt.Fprintf(w, "- addresses: [10.244.%d.%d]\n  nodeName: node-%d\n", i%250, e+1, e)
		}
		w.WriteString("---\n")
	}
	for i := range files {
		path := filepath.Join(dir, fmt.Sprintf("f%d.yaml", i))
		if err := os.WriteFile(path, []byte(files[i].String()), 0o644); err != nil {
			b.Fatal(err)
		}
		// Older than the racy window: a warm load skips unchanged files.
		old := time.Now().Add(-time.Hour)
		if err := os.Chtimes(path, old, old); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// BenchmarkFileSourceLoad measures a load of 1000 Services with 10-endpoint slices: cold (every document
// decoded) and warm (unchanged documents come from the content cache).
func BenchmarkFileSourceLoad(b *testing.B) {
	dir := benchDir(b, 1000)
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			st, err := NewFileSource(dir, nil).Load()
			if err != nil || len(st.Services) != 1000 || len(st.Rejected) != 0 {
				b.Fatalf("load: %v, %d services, rejected %v", err, len(st.Services), st.Rejected)
			}
		}
	})
	b.Run("warm", func(b *testing.B) {
		fs := NewFileSource(dir, nil)
		if _, err := fs.Load(); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := fs.Load(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
