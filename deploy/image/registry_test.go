package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestRegistryPush pushes the archive's blobs and manifest to an in-memory registry
// (go-containerregistry's pkg/registry, which verifies every upload against its digest) with the
// distribution API calls skopeo and crane make, then pulls the manifest back by tag.
func TestRegistryPush(t *testing.T) {
	r, file := build(t, VipgateSpec(fakeBinary(t, "binary"), "0.2.0"), testOpts)
	dir := extractArchive(t, file)
	blob := func(h v1.Hash) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, "blobs", h.Algorithm, h.Hex))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var index v1.IndexManifest
	if err := json.Unmarshal(readFile(t, filepath.Join(dir, "index.json")), &index); err != nil {
		t.Fatal(err)
	}
	desc := index.Manifests[0]
	tag := desc.Annotations[annotationRefName]
	manifestBytes := blob(desc.Digest)
	manifest, err := v1.ParseManifest(bytes.NewReader(manifestBytes))
	if err != nil {
		t.Fatal(err)
	}

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	repo := srv.URL + "/v2/someone/vipgate"
	do := func(method, u, contentType string, body []byte, want int) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, u, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
			req.Header.Set("Accept", contentType)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != want {
			msg, _ := io.ReadAll(resp.Body)
			t.Fatalf("%s %s: %s, want %d: %s", method, u, resp.Status, want, msg)
		}
		return resp
	}
	for _, d := range append([]v1.Descriptor{manifest.Config}, manifest.Layers...) {
		resp := do(http.MethodPost, repo+"/blobs/uploads/", "", nil, http.StatusAccepted)
		resp.Body.Close()
		loc, err := url.Parse(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		if loc, err = loc.Parse(resp.Header.Get("Location")); err != nil {
			t.Fatal(err)
		}
		q := loc.Query()
		q.Set("digest", d.Digest.String())
		loc.RawQuery = q.Encode()
		do(http.MethodPut, loc.String(), "application/octet-stream", blob(d.Digest), http.StatusCreated).Body.Close()
	}
	do(http.MethodPut, repo+"/manifests/"+tag, string(desc.MediaType), manifestBytes, http.StatusCreated).Body.Close()

	resp := do(http.MethodGet, repo+"/manifests/"+tag, string(desc.MediaType), nil, http.StatusOK)
	defer resp.Body.Close()
	pulled, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(pulled)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != r.Digest.String() {
		t.Errorf("pulled manifest %s, built %s", got, r.Digest)
	}
	if got := resp.Header.Get("Docker-Content-Digest"); got != r.Digest.String() {
		t.Errorf("registry reports digest %s, built %s", got, r.Digest)
	}
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
