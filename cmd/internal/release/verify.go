package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Image contract (Dockerfile): what every platform's config must say.
const (
	imageUser       = "65532:65532"
	imageEntrypoint = "/planex"
	// mainModule is the module the SBOMs describe.
	mainModule = "github.com/planex-dev/planex"
)

// elfMachines is the ELF machine of each GOARCH a release may hold.
var elfMachines = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"ppc64le": elf.EM_PPC64,
	"s390x":   elf.EM_S390,
	"riscv64": elf.EM_RISCV,
}

// verify checks the release directory dir and reports each check on out:
//   - SHA256SUMS names every file of dir (and nothing else) with its sha256;
//   - release.json agrees with the files, the image archive and its digests;
//   - each binary is a static ELF executable for its architecture; the
//     host's runs `version` and prints the release's version and commit;
//   - each platform of the image holds /planex byte-identical to that
//     architecture's binary, runs as 65532:65532 with entrypoint /planex and
//     carries the version and commit labels;
//   - each SBOM is CycloneDX JSON describing the planex module and its
//     modules for its architecture;
//   - the chart's Chart.yaml names the release and its values.yaml the
//     image digest;
//   - manifests/base/release.env pins the image by digest.
//
// It returns every problem found, joined.
func verify(ctx context.Context, dir string, out io.Writer) error {
	var errs []error
	fail := func(err error) { errs = append(errs, err) }
	ok := func(format string, args ...any) { fmt.Fprintf(out, "ok   "+format+"\n", args...) }

	sums, err := checkSums(dir)
	if err != nil {
		return err // nothing else is worth checking against wrong checksums
	}
	ok("%s: %d files, every file of the release listed and matching", sumsFile, len(sums))

	var r Release
	data, err := os.ReadFile(filepath.Join(dir, recordFile))
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return fmt.Errorf("%s: %w", recordFile, err)
	}
	switch {
	case !versionRE.MatchString(r.Version):
		return fmt.Errorf("%s: version %q is not vMAJOR.MINOR.PATCH", recordFile, r.Version)
	case !commitRE.MatchString(r.Commit):
		return fmt.Errorf("%s: commit %q is not a full commit hash", recordFile, r.Commit)
	case !digestRE.MatchString(r.Image.Digest) || r.Image.Reference != r.Image.Repository+"@"+r.Image.Digest:
		return fmt.Errorf("%s: image reference %q is not repository@sha256:<digest>", recordFile, r.Image.Reference)
	}
	arches := map[string]bool{}
	for _, a := range r.Artifacts {
		if sums[a.Name] != a.SHA256 {
			fail(fmt.Errorf("%s: %s has sha256 %s, %s says %s", recordFile, a.Name, a.SHA256, sumsFile, sums[a.Name]))
		}
		if a.Kind == "binary" {
			arches[a.Arch] = true
		}
	}
	if len(arches) == 0 {
		return fmt.Errorf("%s lists no binary", recordFile)
	}
	ok("%s: %s at %s, image %s", recordFile, r.Version, r.Commit, r.Image.Reference)

	// Binaries.
	for _, a := range r.Artifacts {
		if a.Kind != "binary" {
			continue
		}
		if err := checkStaticELF(filepath.Join(dir, a.Name), a.Arch); err != nil {
			fail(err)
			continue
		}
		ok("%s: static ELF executable for %s", a.Name, a.Arch)
		if a.Arch == runtime.GOARCH && runtime.GOOS == "linux" {
			got, err := runVersion(ctx, filepath.Join(dir, a.Name))
			if err != nil {
				fail(err)
				continue
			}
			for _, want := range []string{"planex " + r.Version + "\n", "commit: " + r.Commit + "\n", "platform: linux/" + a.Arch + "\n"} {
				if !strings.Contains(got, want) {
					fail(fmt.Errorf("%s version: output lacks %q:\n%s", a.Name, strings.TrimSpace(want), got))
				}
			}
			ok("%s version: %s", a.Name, strings.ReplaceAll(strings.TrimSpace(got), "\n", "; "))
		}
	}

	// Image.
	if err := verifyImage(dir, r, arches, sums, ok); err != nil {
		fail(err)
	}

	// SBOMs: one per binary.
	for arch := range arches {
		name := "planex-linux-" + arch + ".cdx.json"
		if err := checkSBOM(filepath.Join(dir, name), arch); err != nil {
			fail(err)
			continue
		}
		ok("%s: CycloneDX SBOM of %s for linux/%s", name, mainModule, arch)
	}

	// Chart.
	if err := checkChart(filepath.Join(dir, r.Chart), r); err != nil {
		fail(err)
	} else {
		ok("%s: chart %s, appVersion %s, image %s", r.Chart, strings.TrimPrefix(r.Version, "v"), r.Version, r.Image.Reference)
	}

	// Manifests.
	env, err := os.ReadFile(filepath.Join(dir, releaseEnv))
	if err != nil {
		fail(err)
	} else if want := "image=" + r.Image.Reference + "\nversion=" + r.Version + "\n"; string(env) != want {
		fail(fmt.Errorf("%s is\n%s\nwant\n%s", releaseEnv, env, want))
	} else {
		ok("%s: image=%s", releaseEnv, r.Image.Reference)
	}
	return errors.Join(errs...)
}

// checkSums reads dir/SHA256SUMS (sha256sum's format), checks every file
// it names, and that it names every file of dir but itself.
func checkSums(dir string) (map[string]string, error) {
	f, err := os.Open(filepath.Join(dir, sumsFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		sum, name, found := strings.Cut(sc.Text(), "  ")
		if !found || len(sum) != 64 || name == "" || path.Clean(name) != name || strings.HasPrefix(name, "../") || path.IsAbs(name) {
			return nil, fmt.Errorf("%s line %d: want \"<sha256>  <relative path>\", got %q", sumsFile, n, sc.Text())
		}
		if _, dup := sums[name]; dup {
			return nil, fmt.Errorf("%s line %d: %s listed twice", sumsFile, n, name)
		}
		sums[name] = sum
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var errs []error
	seen := map[string]bool{}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == sumsFile {
			return nil
		}
		if !d.Type().IsRegular() {
			errs = append(errs, fmt.Errorf("%s: not a regular file", rel))
			return nil
		}
		seen[rel] = true
		want, listed := sums[rel]
		if !listed {
			errs = append(errs, fmt.Errorf("%s: not listed in %s", rel, sumsFile))
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if got := sha256Hex(data); got != want {
			errs = append(errs, fmt.Errorf("%s: sha256 %s, %s says %s", rel, got, sumsFile, want))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for name := range sums {
		if !seen[name] {
			errs = append(errs, fmt.Errorf("%s lists %s, which is missing", sumsFile, name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return sums, nil
}

// checkStaticELF checks that file is an ELF executable for the GOARCH
// arch with no program interpreter and no shared library: it runs on any
// Linux kernel of that architecture, and on an empty (scratch) image.
func checkStaticELF(file, arch string) error {
	want, known := elfMachines[arch]
	if !known {
		return fmt.Errorf("%s: architecture %q not known to the release", file, arch)
	}
	f, err := elf.Open(file)
	if err != nil {
		return fmt.Errorf("%s: not an ELF file: %w", file, err)
	}
	defer f.Close()
	if f.Machine != want {
		return fmt.Errorf("%s: ELF machine %s, want %s (%s)", file, f.Machine, want, arch)
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("%s: ELF type %s is not an executable", file, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s: dynamically linked (has a program interpreter)", file)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if len(libs) > 0 {
		return fmt.Errorf("%s: dynamically linked against %v", file, libs)
	}
	return nil
}

// runVersion runs `file version` with a deadline.
func runVersion(ctx context.Context, file string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, file, "version")
	cmd.Env = []string{"HOME=/nonexistent"}
	outb, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s version: %w\n%s", file, err, outb)
	}
	return string(outb), nil
}

// verifyImage checks the image archive against release.json and the
// checksummed binaries.
func verifyImage(dir string, r Release, arches map[string]bool, sums map[string]string, ok func(string, ...any)) error {
	a, err := readOCIArchive(filepath.Join(dir, r.Image.Archive))
	if err != nil {
		return err
	}
	img, err := a.image()
	if err != nil {
		return fmt.Errorf("%s: %w", r.Image.Archive, err)
	}
	if img.IndexDigest != r.Image.Digest {
		return fmt.Errorf("%s: image index %s, %s says %s", r.Image.Archive, img.IndexDigest, recordFile, r.Image.Digest)
	}
	var errs []error
	seen := map[string]bool{}
	for _, p := range img.Platforms {
		arch := p.Platform.Architecture
		where := fmt.Sprintf("%s linux/%s (%s)", r.Image.Archive, arch, p.Digest)
		if p.Platform.OS != "linux" || !arches[arch] || seen[arch] {
			errs = append(errs, fmt.Errorf("%s: platform %s/%s is not one of the release's binaries, or twice", where, p.Platform.OS, arch))
			continue
		}
		seen[arch] = true
		if !slices.ContainsFunc(r.Image.Platforms, func(ip ImagePlatform) bool { return ip.Architecture == arch && ip.Digest == p.Digest }) {
			errs = append(errs, fmt.Errorf("%s: not listed in %s", where, recordFile))
		}
		c := p.Config
		switch {
		case c.OS != "linux" || c.Architecture != arch:
			errs = append(errs, fmt.Errorf("%s: config says %s/%s", where, c.OS, c.Architecture))
		case c.Config.User != imageUser:
			errs = append(errs, fmt.Errorf("%s: runs as user %q, want %s (non-root)", where, c.Config.User, imageUser))
		case !slices.Equal(c.Config.Entrypoint, []string{imageEntrypoint}):
			errs = append(errs, fmt.Errorf("%s: entrypoint %q, want [%s]", where, c.Config.Entrypoint, imageEntrypoint))
		case c.Config.Labels["org.opencontainers.image.version"] != r.Version || c.Config.Labels["org.opencontainers.image.revision"] != r.Commit:
			errs = append(errs, fmt.Errorf("%s: labels version %q revision %q, want %s %s", where,
				c.Config.Labels["org.opencontainers.image.version"], c.Config.Labels["org.opencontainers.image.revision"], r.Version, r.Commit))
		}
		bin, h, err := a.file(p.Manifest, "planex")
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		name := "planex-linux-" + arch
		if got := sha256Hex(bin); got != sums[name] {
			errs = append(errs, fmt.Errorf("%s: /planex has sha256 %s, %s has %s", where, got, name, sums[name]))
			continue
		}
		if h.Mode&0o111 == 0 {
			errs = append(errs, fmt.Errorf("%s: /planex is not executable (mode %o)", where, h.Mode))
			continue
		}
		ok("%s: /planex = %s, user %s, entrypoint %v", where, name, c.Config.User, c.Config.Entrypoint)
	}
	for arch := range arches {
		if !seen[arch] {
			errs = append(errs, fmt.Errorf("%s: no linux/%s image for binary planex-linux-%s", r.Image.Archive, arch, arch))
		}
	}
	return errors.Join(errs...)
}

// cycloneDX is the part of a CycloneDX JSON BOM the release checks.
type cycloneDX struct {
	BOMFormat   string `json:"bomFormat"`
	SpecVersion string `json:"specVersion"`
	Metadata    struct {
		Component cdxComponent `json:"component"`
	} `json:"metadata"`
	Components []cdxComponent `json:"components"`
}

type cdxComponent struct {
	Type       string `json:"type"`
	Name       string `json:"name"`
	Version    string `json:"version"`
	PURL       string `json:"purl"`
	Properties []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"properties"`
}

// checkSBOM checks that file is a CycloneDX JSON SBOM of the planex
// application built for linux/arch, listing the Go modules compiled in.
func checkSBOM(file, arch string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var b cycloneDX
	if err := json.Unmarshal(data, &b); err != nil {
		return fmt.Errorf("%s: not JSON: %w", file, err)
	}
	mc := b.Metadata.Component
	switch {
	case b.BOMFormat != "CycloneDX" || b.SpecVersion == "":
		return fmt.Errorf("%s: bomFormat %q specVersion %q, want a CycloneDX BOM", file, b.BOMFormat, b.SpecVersion)
	case mc.Name != mainModule || mc.Type != "application":
		return fmt.Errorf("%s: describes %s %q, want application %s", file, mc.Type, mc.Name, mainModule)
	case !strings.Contains(mc.PURL, "goarch="+arch) || !strings.Contains(mc.PURL, "goos=linux"):
		return fmt.Errorf("%s: describes %s, want the build for linux/%s", file, mc.PURL, arch)
	}
	modules := 0
	for _, c := range b.Components {
		if strings.HasPrefix(c.PURL, "pkg:golang/") && c.Version != "" {
			modules++
		}
	}
	// planex compiles in gRPC, NATS, OpenTelemetry and more: an SBOM
	// with a handful of modules is missing the build's modules.
	if modules < 20 {
		return fmt.Errorf("%s: lists %d Go modules with versions, want the modules compiled into planex", file, modules)
	}
	return nil
}

// checkChart reads the packaged chart and checks its version, appVersion
// and that its values pin the release's image by digest.
func checkChart(file string, r Release) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	files := map[string]string{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if h.Name == "planex/Chart.yaml" || h.Name == "planex/values.yaml" {
			data, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			files[h.Name] = string(data)
		}
	}
	chartYAML, values := "\n"+files["planex/Chart.yaml"], "\n"+files["planex/values.yaml"]
	var errs []error
	for _, want := range []string{"\nversion: " + strings.TrimPrefix(r.Version, "v") + "\n", "\nappVersion: " + r.Version + "\n"} {
		if !strings.Contains(chartYAML, want) {
			errs = append(errs, fmt.Errorf("%s: Chart.yaml lacks %q", file, strings.TrimSpace(want)))
		}
	}
	for _, want := range []string{"\n  repository: " + r.Image.Repository + "\n", "\n  digest: " + r.Image.Digest + "\n"} {
		if !strings.Contains(values, want) {
			errs = append(errs, fmt.Errorf("%s: values.yaml lacks %q under image", file, strings.TrimSpace(want)))
		}
	}
	return errors.Join(errs...)
}
