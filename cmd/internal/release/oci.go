package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Media types of an image index and of the manifests, configs and layers
// it names: OCI's and Docker's (a registry or engine may hand either).
const (
	mediaOCIIndex      = "application/vnd.oci.image.index.v1+json"
	mediaDockerList    = "application/vnd.docker.distribution.manifest.list.v2+json"
	mediaOCIManifest   = "application/vnd.oci.image.manifest.v1+json"
	mediaDockerImage   = "application/vnd.docker.distribution.manifest.v2+json"
	mediaOCILayerGzip  = "application/vnd.oci.image.layer.v1.tar+gzip"
	mediaOCILayer      = "application/vnd.oci.image.layer.v1.tar"
	mediaDockerLayerGz = "application/vnd.docker.image.rootfs.diff.tar.gzip"
)

// digestRE is a sha256 content digest.
var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// descriptor points at a blob of an OCI layout.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// platform is the os/architecture of one manifest of an index.
type platform struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Variant      string `json:"variant,omitempty"`
}

// index is an OCI image index (index.json, or a multi-arch image's index
// blob) or a Docker manifest list.
type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

// manifest is one platform's image manifest.
type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

// imageConfig is the part of an image configuration the release checks.
type imageConfig struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Config       struct {
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

// ociArchive is an OCI image layout read from a tar archive into memory
// (a planex image is tens of megabytes).
type ociArchive struct {
	files map[string][]byte
}

// readOCIArchive reads a tar of an OCI image layout and checks that every
// blob's content matches its name.
func readOCIArchive(file string) (*ociArchive, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	a := &ociArchive{files: map[string][]byte{}}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", file, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, fmt.Errorf("read %s: %s: %w", file, h.Name, err)
		}
		a.files[path.Clean(strings.TrimPrefix(h.Name, "./"))] = data
	}
	if err := checkLayout(a.files); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return a, nil
}

// checkLayout checks the oci-layout marker and that every blob's sha256
// is its name.
func checkLayout(files map[string][]byte) error {
	var marker struct {
		Version string `json:"imageLayoutVersion"`
	}
	if err := json.Unmarshal(files["oci-layout"], &marker); err != nil || marker.Version == "" {
		return errors.New("not an OCI image layout: no valid oci-layout file")
	}
	if _, ok := files["index.json"]; !ok {
		return errors.New("not an OCI image layout: no index.json")
	}
	for name, data := range files {
		hexSum, ok := strings.CutPrefix(name, "blobs/sha256/")
		if !ok {
			continue
		}
		if got := sha256Hex(data); got != hexSum {
			return fmt.Errorf("blob %s holds content with sha256 %s", name, got)
		}
	}
	return nil
}

// blob returns the content of a descriptor, checking size and digest.
func (a *ociArchive) blob(d descriptor) ([]byte, error) {
	if !digestRE.MatchString(d.Digest) {
		return nil, fmt.Errorf("descriptor digest %q is not a sha256 digest", d.Digest)
	}
	data, ok := a.files["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
	if !ok {
		return nil, fmt.Errorf("blob %s is missing", d.Digest)
	}
	if d.Size != 0 && int64(len(data)) != d.Size {
		return nil, fmt.Errorf("blob %s: size %d, descriptor says %d", d.Digest, len(data), d.Size)
	}
	return data, nil
}

// platformImage is one platform of a multi-arch image.
type platformImage struct {
	Platform platform
	// Digest of the platform's manifest.
	Digest   string
	Manifest manifest
	Config   imageConfig
}

// image is the multi-arch image of an archive.
type image struct {
	// IndexDigest is the digest of the image index: what a registry serves
	// for the pushed tag, and what the manifests pin.
	IndexDigest string
	Platforms   []platformImage
}

// image reads the archive's one multi-arch image: index.json must name
// exactly one image index.
func (a *ociArchive) image() (image, error) {
	var top index
	if err := json.Unmarshal(a.files["index.json"], &top); err != nil {
		return image{}, fmt.Errorf("index.json: %w", err)
	}
	if len(top.Manifests) != 1 {
		return image{}, fmt.Errorf("index.json names %d manifests, want exactly one multi-arch image index", len(top.Manifests))
	}
	d := top.Manifests[0]
	if d.MediaType != mediaOCIIndex && d.MediaType != mediaDockerList {
		return image{}, fmt.Errorf("index.json names a %s, want an image index (%s)", d.MediaType, mediaOCIIndex)
	}
	data, err := a.blob(d)
	if err != nil {
		return image{}, err
	}
	var idx index
	if err := json.Unmarshal(data, &idx); err != nil {
		return image{}, fmt.Errorf("image index %s: %w", d.Digest, err)
	}
	img := image{IndexDigest: d.Digest}
	for _, md := range idx.Manifests {
		if md.Platform == nil {
			return image{}, fmt.Errorf("image index %s: manifest %s has no platform", d.Digest, md.Digest)
		}
		data, err := a.blob(md)
		if err != nil {
			return image{}, err
		}
		p := platformImage{Platform: *md.Platform, Digest: md.Digest}
		if err := json.Unmarshal(data, &p.Manifest); err != nil {
			return image{}, fmt.Errorf("manifest %s: %w", md.Digest, err)
		}
		cfg, err := a.blob(p.Manifest.Config)
		if err != nil {
			return image{}, fmt.Errorf("manifest %s config: %w", md.Digest, err)
		}
		if err := json.Unmarshal(cfg, &p.Config); err != nil {
			return image{}, fmt.Errorf("manifest %s config: %w", md.Digest, err)
		}
		img.Platforms = append(img.Platforms, p)
	}
	if len(img.Platforms) == 0 {
		return image{}, fmt.Errorf("image index %s names no platform", d.Digest)
	}
	return img, nil
}

// file returns the content of the file at name (no leading slash) in the
// image's filesystem: the last layer holding it wins.
func (a *ociArchive) file(m manifest, name string) ([]byte, *tar.Header, error) {
	var found []byte
	var header *tar.Header
	for _, l := range m.Layers {
		data, err := a.blob(l)
		if err != nil {
			return nil, nil, err
		}
		var r io.Reader = bytes.NewReader(data)
		switch l.MediaType {
		case mediaOCILayerGzip, mediaDockerLayerGz:
			zr, err := gzip.NewReader(r)
			if err != nil {
				return nil, nil, fmt.Errorf("layer %s: %w", l.Digest, err)
			}
			r = zr
		case mediaOCILayer:
		default:
			return nil, nil, fmt.Errorf("layer %s: media type %q not supported", l.Digest, l.MediaType)
		}
		tr := tar.NewReader(r)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, nil, fmt.Errorf("layer %s: %w", l.Digest, err)
			}
			if path.Clean(strings.TrimPrefix(strings.TrimPrefix(h.Name, "./"), "/")) != name {
				continue
			}
			if h.Typeflag != tar.TypeReg {
				return nil, nil, fmt.Errorf("layer %s: /%s is not a regular file", l.Digest, name)
			}
			if found, err = io.ReadAll(tr); err != nil {
				return nil, nil, fmt.Errorf("layer %s: /%s: %w", l.Digest, name, err)
			}
			header = h
		}
	}
	if header == nil {
		return nil, nil, fmt.Errorf("no /%s in the image's layers", name)
	}
	return found, header, nil
}

// packImage writes the OCI layout in dir as a tar archive whose bytes
// depend only on the layout's content: entries sorted by name, directories
// 0755 and files 0644 owned by 0:0, every time set to epoch. It returns
// the digest of the layout's one image index.
func packImage(dir, out string, epoch int64) (string, error) {
	files := map[string][]byte{}
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch {
		case d.IsDir():
			dirs = append(dirs, rel)
		case d.Type().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			files[rel] = data
		default:
			return fmt.Errorf("%s: not a regular file or directory", p)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("read layout %s: %w", dir, err)
	}
	if err := checkLayout(files); err != nil {
		return "", fmt.Errorf("layout %s: %w", dir, err)
	}
	img, err := (&ociArchive{files: files}).image()
	if err != nil {
		return "", fmt.Errorf("layout %s: %w", dir, err)
	}

	type entry struct {
		name string
		dir  bool
	}
	var entries []entry
	for _, d := range dirs {
		entries = append(entries, entry{d + "/", true})
	}
	for f := range files {
		entries = append(entries, entry{f, false})
	}
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(epoch, 0).UTC()
	for _, e := range entries {
		h := &tar.Header{Name: e.name, ModTime: mtime, Format: tar.FormatUSTAR}
		if e.dir {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		} else {
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, int64(len(files[e.name]))
		}
		if err := tw.WriteHeader(h); err != nil {
			return "", fmt.Errorf("archive %s: %w", e.name, err)
		}
		if !e.dir {
			if _, err := tw.Write(files[e.name]); err != nil {
				return "", fmt.Errorf("archive %s: %w", e.name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	if err := writeFileAtomic(out, buf.Bytes()); err != nil {
		return "", err
	}
	return img.IndexDigest, nil
}

// writeFileAtomic writes data to a temporary file next to name and renames
// it into place.
func writeFileAtomic(name string, data []byte) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, name); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// sha256Hex is the hex sha256 of data.
func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
