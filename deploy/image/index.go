package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// PlatformImage is one image of a multi-platform image: its spec (the name is the index's) and
// its platform.
type PlatformImage struct {
	Spec     Spec
	Platform Platform
}

// BuildIndex builds one image per platform and writes them as one multi-platform image, an OCI
// image layout archive whose index.json names an OCI image index — what a registry serves under
// the tag, and from which docker, containerd and kubelet pick their platform's image. The index
// lists the images in the given order; the same inputs give the same bytes. It returns the index's
// digest.
func BuildIndex(ref string, images []PlatformImage, created time.Time, out string) (Result, error) {
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return Result{}, fmt.Errorf("image name %q: %w (want registry/repository:tag)", ref, err)
	}
	if len(images) == 0 {
		return Result{}, fmt.Errorf("image %s: no platform", ref)
	}
	blobs := map[v1.Hash][]byte{}
	index := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}
	seen := map[Platform]bool{}
	for _, pi := range images {
		if seen[pi.Platform] {
			return Result{}, fmt.Errorf("image %s: platform %s/%s twice", ref, pi.Platform.Arch, pi.Platform.Variant)
		}
		seen[pi.Platform] = true
		es, err := expand(pi.Spec.Contents)
		if err != nil {
			return Result{}, fmt.Errorf("image %s (%s): %w", ref, pi.Platform.Arch, err)
		}
		img, err := Image(pi.Spec, es, Options{Platform: pi.Platform, Created: created})
		if err != nil {
			return Result{}, fmt.Errorf("image %s (%s): %w", ref, pi.Platform.Arch, err)
		}
		desc, err := imageBlobs(img, blobs)
		if err != nil {
			return Result{}, err
		}
		desc.Platform = &v1.Platform{OS: "linux", Architecture: pi.Platform.Arch, Variant: pi.Platform.Variant}
		index.Manifests = append(index.Manifests, desc)
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return Result{}, err
	}
	sum := sha256.Sum256(indexJSON)
	digest := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
	blobs[digest] = indexJSON
	top := v1.Descriptor{
		MediaType: types.OCIImageIndex,
		Size:      int64(len(indexJSON)),
		Digest:    digest,
		Annotations: map[string]string{
			annotationContainerdName: tag.String(),
			annotationRefName:        tag.TagStr(),
		},
	}

	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return Result{}, err
	}
	// Write next to the target and rename, so a failed build leaves no half-written archive.
	tmp, err := os.CreateTemp(filepath.Dir(out), ".image-*.tar")
	if err != nil {
		return Result{}, err
	}
	defer os.Remove(tmp.Name())
	err = writeLayout(tmp, top, blobs, created)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Result{}, fmt.Errorf("writing %s: %w", out, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return Result{}, err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return Result{}, err
	}
	fi, err := os.Stat(out)
	if err != nil {
		return Result{}, err
	}
	return Result{Name: tag.String(), Digest: digest, Size: fi.Size()}, nil
}
