package main

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

func buildIndex(t *testing.T, amd64, arm64 string) (Result, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "index.tar")
	r, err := BuildIndex("ghcr.io/vipgate/vipgate:0.2.0", []PlatformImage{
		{Spec: VipgateSpec(amd64, "0.2.0"), Platform: Platform{Arch: "amd64"}},
		{Spec: VipgateSpec(arm64, "0.2.0"), Platform: Platform{Arch: "arm64", Variant: "v8"}},
	}, time.Unix(0, 0).UTC(), out)
	if err != nil {
		t.Fatal(err)
	}
	return r, out
}

// TestIndex: index.json names an OCI image index (annotated like a single image), which lists one
// image per platform, each with its own binary; go-containerregistry's reader validates the whole
// tree; the same inputs give the same digest.
func TestIndex(t *testing.T) {
	amd64, arm64 := fakeBinary(t, "amd64 binary"), fakeBinary(t, "arm64 binary")
	r, file := buildIndex(t, amd64, arm64)
	if again, _ := buildIndex(t, amd64, arm64); again.Digest != r.Digest {
		t.Errorf("same inputs, different index digests: %s, %s", r.Digest, again.Digest)
	}

	var top v1.IndexManifest
	if err := json.Unmarshal(readArchive(t, file)["index.json"], &top); err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != types.OCIImageIndex || top.Manifests[0].Digest != r.Digest {
		t.Fatalf("index.json: want one image index descriptor with digest %s, got %+v", r.Digest, top.Manifests)
	}
	wantAnn := map[string]string{
		"io.containerd.image.name":          "ghcr.io/vipgate/vipgate:0.2.0",
		"org.opencontainers.image.ref.name": "0.2.0",
	}
	if diff := cmp.Diff(wantAnn, top.Manifests[0].Annotations); diff != "" {
		t.Errorf("index.json annotations (-want +got):\n%s", diff)
	}

	lay, err := layout.ImageIndexFromPath(extractArchive(t, file))
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(lay); err != nil {
		t.Errorf("validating the layout: %v", err)
	}
	idx, err := lay.ImageIndex(r.Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	want := []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64", Variant: "v8"}}
	if len(im.Manifests) != len(want) {
		t.Fatalf("the index lists %d images, want %d", len(im.Manifests), len(want))
	}
	layers := map[v1.Hash]bool{}
	for i, d := range im.Manifests {
		if d.Platform == nil || !d.Platform.Equals(want[i]) {
			t.Errorf("image %d: platform %+v, want %+v", i, d.Platform, want[i])
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Architecture != want[i].Architecture || cfg.Variant != want[i].Variant || cfg.OS != "linux" {
			t.Errorf("image %d: config says %s/%s/%s, want %+v", i, cfg.OS, cfg.Architecture, cfg.Variant, want[i])
		}
		ls, err := img.Layers()
		if err != nil || len(ls) != 1 {
			t.Fatalf("image %d: %d layers (%v), want 1", i, len(ls), err)
		}
		h, err := ls[0].Digest()
		if err != nil {
			t.Fatal(err)
		}
		layers[h] = true
	}
	if len(layers) != 2 {
		t.Error("the two platforms share a layer: each must carry its own binary")
	}

	if _, err := BuildIndex("ghcr.io/vipgate/vipgate:0.2.0", []PlatformImage{
		{Spec: VipgateSpec(amd64, "0.2.0"), Platform: Platform{Arch: "amd64"}},
		{Spec: VipgateSpec(arm64, "0.2.0"), Platform: Platform{Arch: "amd64"}},
	}, time.Unix(0, 0), filepath.Join(t.TempDir(), "x.tar")); err == nil {
		t.Error("an index with the same platform twice was accepted")
	}
}
