package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations on the manifest descriptor in index.json: containerd (`ctr images import`) takes the
// image name from the first, skopeo/crane/buildah (oci-archive:file:tag) the tag from the second.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// Result is what build wrote.
type Result struct {
	Name   string
	Digest v1.Hash // of the manifest
	Size   int64   // of the archive
}

// Image assembles the single-layer image of spec from its expanded entries.
func Image(spec Spec, es entries, opts Options) (v1.Image, error) {
	var tarBuf bytes.Buffer
	if err := writeLayer(&tarBuf, es, opts.Created); err != nil {
		return nil, err
	}
	gz, err := gzipLayer(tarBuf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("compressing the layer: %w", err)
	}
	// The opener hands over the gzip stream as is, so the layer's digest is that of our bytes.
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	created := v1.Time{Time: opts.Created}
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: opts.Platform.Arch,
		Variant:      opts.Platform.Variant,
		OS:           "linux",
		Created:      created,
		Config: v1.Config{
			Entrypoint: spec.Entrypoint,
			Cmd:        spec.Cmd,
			User:       spec.User,
			Env:        spec.Env,
			WorkingDir: spec.WorkingDir,
			Labels:     spec.Labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	return mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   created,
			CreatedBy: "vipgate deploy/image",
			Comment:   spec.Name,
		},
	})
}

// Build expands spec, assembles the image and writes it as an OCI image layout archive to out.
func Build(spec Spec, opts Options, out string) (Result, error) {
	ref, err := name.NewTag(spec.Name, name.StrictValidation)
	if err != nil {
		return Result{}, fmt.Errorf("image name %q: %w (want registry/repository:tag)", spec.Name, err)
	}
	es, err := expand(spec.Contents)
	if err != nil {
		return Result{}, fmt.Errorf("image %s: %w", spec.Name, err)
	}
	img, err := Image(spec, es, opts)
	if err != nil {
		return Result{}, fmt.Errorf("image %s: %w", spec.Name, err)
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
	digest, err := WriteArchive(tmp, img, ref, opts)
	if err == nil {
		err = tmp.Close()
	} else {
		tmp.Close()
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
	return Result{Name: ref.String(), Digest: digest, Size: fi.Size()}, nil
}

// WriteArchive writes img as an OCI image layout (oci-layout, index.json, blobs/sha256/...) in a
// tar stream, with the same fixed metadata as the layer. index.json holds one manifest descriptor
// annotated with the full name (containerd) and the tag (OCI ref.name). It returns the manifest
// digest.
func WriteArchive(w io.Writer, img v1.Image, ref name.Tag, opts Options) (v1.Hash, error) {
	blobs := map[v1.Hash][]byte{}
	desc, err := imageBlobs(img, blobs)
	if err != nil {
		return v1.Hash{}, err
	}
	desc.Platform = &v1.Platform{OS: "linux", Architecture: opts.Platform.Arch, Variant: opts.Platform.Variant}
	desc.Annotations = map[string]string{
		annotationContainerdName: ref.String(),
		annotationRefName:        ref.TagStr(),
	}
	return desc.Digest, writeLayout(w, desc, blobs, opts.Created)
}

// imageBlobs adds img's manifest, config and layers to blobs and returns the manifest's descriptor.
func imageBlobs(img v1.Image, blobs map[v1.Hash][]byte) (v1.Descriptor, error) {
	manifest, err := img.RawManifest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	mt, err := img.MediaType()
	if err != nil {
		return v1.Descriptor{}, err
	}
	blobs[digest] = manifest
	cfgName, err := img.ConfigName()
	if err != nil {
		return v1.Descriptor{}, err
	}
	if blobs[cfgName], err = img.RawConfigFile(); err != nil {
		return v1.Descriptor{}, err
	}
	layers, err := img.Layers()
	if err != nil {
		return v1.Descriptor{}, err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return v1.Descriptor{}, err
		}
		rc, err := l.Compressed()
		if err != nil {
			return v1.Descriptor{}, err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return v1.Descriptor{}, err
		}
		blobs[d] = b
	}
	return v1.Descriptor{MediaType: mt, Size: int64(len(manifest)), Digest: digest}, nil
}

// writeLayout writes the layout's files in a tar stream: index.json with the one descriptor top
// (an image manifest or an image index, annotated with its name), then every blob in digest order.
func writeLayout(w io.Writer, top v1.Descriptor, blobs map[v1.Hash][]byte, created time.Time) error {
	index := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests:     []v1.Descriptor{top},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	file := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: created}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: created})
	}
	if err := file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := file("index.json", indexJSON); err != nil {
		return err
	}
	if err := dir("blobs/"); err != nil {
		return err
	}
	if err := dir("blobs/sha256/"); err != nil {
		return err
	}
	hashes := make([]v1.Hash, 0, len(blobs))
	for h := range blobs {
		hashes = append(hashes, h)
	}
	slices.SortFunc(hashes, func(a, b v1.Hash) int { return strings.Compare(a.String(), b.String()) })
	for _, h := range hashes {
		if err := file("blobs/"+h.Algorithm+"/"+h.Hex, blobs[h]); err != nil {
			return err
		}
	}
	return tw.Close()
}

// createdTime is SOURCE_DATE_EPOCH when set, else the Unix epoch.
func createdTime(sourceDateEpoch string) (time.Time, error) {
	if sourceDateEpoch == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	var sec int64
	if _, err := fmt.Sscan(sourceDateEpoch, &sec); err != nil || sec < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since 1970", sourceDateEpoch)
	}
	return time.Unix(sec, 0).UTC(), nil
}
