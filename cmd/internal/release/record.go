package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Names of the artefacts in a release directory (dist/<version>/).
const (
	imageArchive = "planex-image.oci.tar"
	recordFile   = "release.json"
	sumsFile     = "SHA256SUMS"
	manifestsDir = "manifests"
	releaseEnv   = "manifests/base/release.env"
)

var (
	// versionRE is a release version: v and a SemVer 2 version.
	versionRE = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
	// commitRE is a full git commit hash.
	commitRE = regexp.MustCompile(`^[0-9a-f]{40}$`)
	// repositoryRE is an image repository without tag or digest.
	repositoryRE = regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+$`)
	// binaryRE, sbomRE and chartRE name the per-artefact files.
	binaryRE = regexp.MustCompile(`^planex-linux-([a-z0-9]+)$`)
	sbomRE   = regexp.MustCompile(`^planex-linux-([a-z0-9]+)\.cdx\.json$`)
	chartRE  = regexp.MustCompile(`^planex-(.+)\.tgz$`)
)

// Release is release.json: what a release directory holds, written by
// `release record` and read by `release verify` and tools/helm's
// release_test.go.
type Release struct {
	// Version is the release (vX.Y.Z), stamped into the binaries.
	Version string `json:"version"`
	// Commit is the git commit the release is built from.
	Commit string `json:"commit"`
	// SourceDateEpoch is the commit's time: every timestamp in the
	// artefacts (image, layers, archives) is this one.
	SourceDateEpoch int64        `json:"sourceDateEpoch"`
	Image           ReleaseImage `json:"image"`
	// Chart is the packaged Helm chart's file name.
	Chart string `json:"chart"`
	// Manifests is the kustomize tree pinned to Image.Reference.
	Manifests string     `json:"manifests"`
	Artifacts []Artifact `json:"artifacts"`
}

// ReleaseImage is the multi-arch image of a release.
type ReleaseImage struct {
	// Repository is where the image is to be pushed.
	Repository string `json:"repository"`
	// Digest is the image index's digest; Reference is
	// Repository@Digest, what the manifests and the chart pin.
	Digest    string `json:"digest"`
	Reference string `json:"reference"`
	// Archive is the OCI image layout archive holding it.
	Archive   string          `json:"archive"`
	Platforms []ImagePlatform `json:"platforms"`
}

// ImagePlatform is one architecture's manifest of the image.
type ImagePlatform struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Digest       string `json:"digest"`
}

// Artifact is one file of the release.
type Artifact struct {
	Name string `json:"name"`
	// Kind is binary, sbom, image or chart.
	Kind   string `json:"kind"`
	Arch   string `json:"arch,omitempty"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// recordOptions are the flags of `release record`.
type recordOptions struct {
	Dir, Version, Commit, Repository string
	SourceDateEpoch                  int64
}

// record writes release.json for the artefacts in o.Dir.
func record(o recordOptions) error {
	switch {
	case o.Dir == "":
		return errors.New("record: --dir is required")
	case !versionRE.MatchString(o.Version):
		return fmt.Errorf("record: --version %q: want vMAJOR.MINOR.PATCH", o.Version)
	case !commitRE.MatchString(o.Commit):
		return fmt.Errorf("record: --commit %q: want a full git commit hash", o.Commit)
	case !repositoryRE.MatchString(o.Repository):
		return fmt.Errorf("record: --repository %q: want an image repository without tag or digest", o.Repository)
	}
	a, err := readOCIArchive(filepath.Join(o.Dir, imageArchive))
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	img, err := a.image()
	if err != nil {
		return fmt.Errorf("record: %s: %w", imageArchive, err)
	}
	r := Release{
		Version:         o.Version,
		Commit:          o.Commit,
		SourceDateEpoch: o.SourceDateEpoch,
		Image: ReleaseImage{
			Repository: o.Repository,
			Digest:     img.IndexDigest,
			Reference:  o.Repository + "@" + img.IndexDigest,
			Archive:    imageArchive,
		},
		Manifests: manifestsDir + "/",
	}
	for _, p := range img.Platforms {
		r.Image.Platforms = append(r.Image.Platforms, ImagePlatform{OS: p.Platform.OS, Architecture: p.Platform.Architecture, Digest: p.Digest})
	}
	entries, err := os.ReadDir(o.Dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		a := Artifact{Name: e.Name()}
		switch {
		case binaryRE.MatchString(a.Name):
			a.Kind, a.Arch = "binary", binaryRE.FindStringSubmatch(a.Name)[1]
		case sbomRE.MatchString(a.Name):
			a.Kind, a.Arch = "sbom", sbomRE.FindStringSubmatch(a.Name)[1]
		case a.Name == imageArchive:
			a.Kind = "image"
		case chartRE.MatchString(a.Name):
			if r.Chart != "" {
				return fmt.Errorf("record: two charts: %s and %s", r.Chart, a.Name)
			}
			a.Kind, r.Chart = "chart", a.Name
		case a.Name == recordFile || a.Name == sumsFile:
			continue
		default:
			return fmt.Errorf("record: %s: not a release artefact (binary, SBOM, image archive or chart)", filepath.Join(o.Dir, a.Name))
		}
		data, err := os.ReadFile(filepath.Join(o.Dir, a.Name))
		if err != nil {
			return err
		}
		a.SHA256, a.Size = sha256Hex(data), int64(len(data))
		r.Artifacts = append(r.Artifacts, a)
	}
	slices.SortFunc(r.Artifacts, func(x, y Artifact) int { return strings.Compare(x.Name, y.Name) })
	if r.Chart == "" {
		return fmt.Errorf("record: no chart (planex-*.tgz) in %s", o.Dir)
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(o.Dir, recordFile), append(data, '\n'))
}
