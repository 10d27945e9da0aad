package cluster

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzFileDocument feeds arbitrary file contents through the file source's decoding path: splitting,
// strict decoding, conversion and validation, and State assembly. None of it may panic, whatever the
// input; every document must end up either as an object or as a rejection.
//
// Seeds: testdata/fuzz/FuzzFileDocument (Go's corpus format) plus the manifests of the unit tests.
// Run with: go test ./cluster -run '^$' -fuzz FuzzFileDocument -fuzztime 60s
func FuzzFileDocument(f *testing.F) {
	f.Add([]byte(goodManifests))
	f.Add([]byte(goodJSON))
	f.Add([]byte(listManifest))
	for _, b := range badDocs {
		f.Add([]byte(b.doc))
	}
	if extra, err := filepath.Glob(filepath.Join("testdata", "manifests", "*")); err == nil {
		for _, p := range extra {
			if data, err := os.ReadFile(p); err == nil {
				f.Add(data)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		docs, _ := splitDocuments(data)
		var objs []located
		for i, doc := range docs {
			for _, d := range decodeDocument(doc) {
				if d.err == nil && d.service == nil && d.slice == nil && d.node == nil && d.metallb == nil {
					t.Fatalf("document %d decoded to nothing and no error: %+v", i+1, d)
				}
				objs = append(objs, located{decoded: d, source: "fuzz"})
			}
		}
		fs := NewFileSource("", nil)
		fs.build(objs, nil)
	})
}
