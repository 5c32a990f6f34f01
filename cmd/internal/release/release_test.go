package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	testVersion = "v1.2.3"
	testCommit  = "0123456789abcdef0123456789abcdef01234567"
	testRepo    = "registry.example.com/team/planex"
	testEpoch   = 1700000000
)

// fakePlanex builds, once, a small static program for the host that
// answers `version` as planex does, stamped like a release binary.
var fakePlanex = sync.OnceValues(func() ([]byte, error) {
	dir, err := os.MkdirTemp("", "fake-planex")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	src := `package main

import (
	"fmt"
	"os"
	"runtime"
)

var version, commit string

func main() {
	if len(os.Args) == 2 && os.Args[1] == "version" {
		fmt.Printf("planex %s\ncommit: %s\ngo: %s\nplatform: %s/%s\n", version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
}
`
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module fakeplanex\n\ngo 1.22\n"), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -X main.version="+testVersion+" -X main.commit="+testCommit, "-o", "planex", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOWORK=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the fake planex: %v\n%s", err, out)
	}
	return os.ReadFile(filepath.Join(dir, "planex"))
})

// fake describes a synthetic release; the zero value plus a binary is a
// release verify accepts.
type fake struct {
	binary      []byte
	imageBinary []byte // default: binary
	user        string // default: 65532:65532
	env         string // default: the digest-pinned release.env
}

// makeRelease writes a synthetic release for the host architecture into
// a new directory, the way scripts/release.sh lays it out (pack-image,
// record and sha256sum included), and returns the directory.
func makeRelease(t *testing.T, f fake) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("releases are built on Linux")
	}
	arch := runtime.GOARCH
	dir := t.TempDir()
	write := func(name string, data []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("planex-linux-"+arch, f.binary)

	// The image: one layer holding /planex, a config, a manifest, an index.
	if f.imageBinary == nil {
		f.imageBinary = f.binary
	}
	if f.user == "" {
		f.user = imageUser
	}
	layout := t.TempDir()
	blob := func(data []byte) descriptor {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(layout, "blobs", "sha256"), 0o755); err != nil {
			t.Fatal(err)
		}
		sum := sha256Hex(data)
		if err := os.WriteFile(filepath.Join(layout, "blobs", "sha256", sum), data, 0o644); err != nil {
			t.Fatal(err)
		}
		return descriptor{Digest: "sha256:" + sum, Size: int64(len(data))}
	}
	var layer bytes.Buffer
	zw := gzip.NewWriter(&layer)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: "planex", Mode: 0o755, Size: int64(len(f.imageBinary)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write(f.imageBinary)
	tw.Close()
	zw.Close()
	ld := blob(layer.Bytes())
	ld.MediaType = mediaOCILayerGzip
	cfg := fmt.Sprintf(`{"os":"linux","architecture":%q,"config":{"User":%q,"Entrypoint":["/planex"],"Cmd":["--help"],"Labels":{"org.opencontainers.image.version":%q,"org.opencontainers.image.revision":%q}}}`,
		arch, f.user, testVersion, testCommit)
	cd := blob([]byte(cfg))
	cd.MediaType = "application/vnd.oci.image.config.v1+json"
	m, _ := json.Marshal(manifest{SchemaVersion: 2, MediaType: mediaOCIManifest, Config: cd, Layers: []descriptor{ld}})
	md := blob(m)
	md.MediaType, md.Platform = mediaOCIManifest, &platform{OS: "linux", Architecture: arch}
	idx, _ := json.Marshal(index{SchemaVersion: 2, MediaType: mediaOCIIndex, Manifests: []descriptor{md}})
	id := blob(idx)
	id.MediaType = mediaOCIIndex
	top, _ := json.Marshal(index{SchemaVersion: 2, Manifests: []descriptor{id}})
	os.WriteFile(filepath.Join(layout, "index.json"), top, 0o644)
	os.WriteFile(filepath.Join(layout, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
	digest, err := packImage(layout, filepath.Join(dir, imageArchive), testEpoch)
	if err != nil {
		t.Fatal(err)
	}

	// The SBOM.
	var comps []string
	for i := range 25 {
		comps = append(comps, fmt.Sprintf(`{"type":"library","name":"example.com/m%d","version":"v1.0.%d","purl":"pkg:golang/example.com/m%d@v1.0.%d?type=module"}`, i, i, i, i))
	}
	write("planex-linux-"+arch+".cdx.json", []byte(fmt.Sprintf(`{"bomFormat":"CycloneDX","specVersion":"1.6","metadata":{"component":{"type":"application","name":%q,"version":"v0.0.0","purl":"pkg:golang/%s@v0.0.0?goarch=%s&goos=linux&type=module"}},"components":[%s]}`,
		mainModule, mainModule, arch, strings.Join(comps, ","))))

	// The chart.
	var chart bytes.Buffer
	zw = gzip.NewWriter(&chart)
	tw = tar.NewWriter(zw)
	for _, e := range [][2]string{
		{"planex/Chart.yaml", "apiVersion: v2\nname: planex\nversion: " + strings.TrimPrefix(testVersion, "v") + "\nappVersion: " + testVersion + "\n"},
		{"planex/values.yaml", "image:\n  repository: " + testRepo + "\n  tag: \"\"\n  digest: " + digest + "\n"},
	} {
		name, body := e[0], e[1]
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	zw.Close()
	write("planex-"+strings.TrimPrefix(testVersion, "v")+".tgz", chart.Bytes())

	// The manifests.
	if f.env == "" {
		f.env = "image=" + testRepo + "@" + digest + "\nversion=" + testVersion + "\n"
	}
	write(releaseEnv, []byte(f.env))
	write("manifests/base/kustomization.yaml", []byte("kind: Kustomization\n"))

	if err := record(recordOptions{Dir: dir, Version: testVersion, Commit: testCommit, Repository: testRepo, SourceDateEpoch: testEpoch}); err != nil {
		t.Fatal(err)
	}
	writeSums(t, dir)
	return dir
}

// writeSums writes SHA256SUMS as scripts/release.sh does.
func writeSums(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", `find . -type f ! -name SHA256SUMS -printf '%P\0' | LC_ALL=C sort -z | xargs -0 sha256sum >SHA256SUMS`)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum: %v\n%s", err, out)
	}
}

func TestVerify(t *testing.T) {
	bin, err := fakePlanex()
	if err != nil {
		t.Fatal(err)
	}
	good := makeRelease(t, fake{binary: bin})
	var out bytes.Buffer
	if err := verify(context.Background(), good, &out); err != nil {
		t.Fatalf("a good release failed: %v\n%s", err, out.String())
	}
	for _, want := range []string{"static ELF", "version: planex " + testVersion, "/planex = planex-linux-", "CycloneDX SBOM", "release.env: image=" + testRepo + "@sha256:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("verify's report lacks %q:\n%s", want, out.String())
		}
	}

	tests := []struct {
		name string
		// make builds the bad release: from scratch, or by changing a
		// good one after the fact.
		make func(t *testing.T) string
		want string
	}{
		{"binary changed after the checksums", func(t *testing.T) string {
			dir := makeRelease(t, fake{binary: bin})
			f, _ := os.OpenFile(filepath.Join(dir, "planex-linux-"+runtime.GOARCH), os.O_APPEND|os.O_WRONLY, 0)
			f.Write([]byte{0})
			f.Close()
			return dir
		}, "SHA256SUMS says"},
		{"file not in the checksums", func(t *testing.T) string {
			dir := makeRelease(t, fake{binary: bin})
			os.WriteFile(filepath.Join(dir, "manifests", "extra.yaml"), []byte("x"), 0o644)
			return dir
		}, "manifests/extra.yaml: not listed in SHA256SUMS"},
		{"image holds another binary", func(t *testing.T) string {
			return makeRelease(t, fake{binary: bin, imageBinary: append(bytes.Clone(bin), 0)})
		}, "/planex has sha256"},
		{"image runs as root", func(t *testing.T) string {
			return makeRelease(t, fake{binary: bin, user: "0"})
		}, `runs as user "0"`},
		{"manifests pin a tag", func(t *testing.T) string {
			return makeRelease(t, fake{binary: bin, env: "image=" + testRepo + ":" + testVersion + "\nversion=" + testVersion + "\n"})
		}, "manifests/base/release.env is"},
		{"binary is not planex's version", func(t *testing.T) string {
			dir := makeRelease(t, fake{binary: bin})
			// The same binary recorded as another version.
			data, _ := os.ReadFile(filepath.Join(dir, recordFile))
			os.WriteFile(filepath.Join(dir, recordFile), bytes.ReplaceAll(data, []byte(testVersion), []byte("v9.9.9")), 0o644)
			writeSums(t, dir)
			return dir
		}, `lacks "planex v9.9.9"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.make(t)
			err := verify(context.Background(), dir, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("verify = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestCheckStaticELF(t *testing.T) {
	bin, err := fakePlanex()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "planex")
	os.WriteFile(file, bin, 0o755)
	if err := checkStaticELF(file, runtime.GOARCH); err != nil {
		t.Fatalf("static Go binary: %v", err)
	}
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	if err := checkStaticELF(file, other); err == nil || !strings.Contains(err.Error(), "ELF machine") {
		t.Errorf("binary checked as %s: %v, want an ELF machine error", other, err)
	}
	// A dynamically linked system binary.
	if err := checkStaticELF("/bin/sh", runtime.GOARCH); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("/bin/sh: %v, want dynamically linked", err)
	}
}

func TestPackImageReproducible(t *testing.T) {
	bin, err := fakePlanex()
	if err != nil {
		t.Fatal(err)
	}
	a := makeRelease(t, fake{binary: bin})
	b := makeRelease(t, fake{binary: bin})
	da, _ := os.ReadFile(filepath.Join(a, imageArchive))
	db, _ := os.ReadFile(filepath.Join(b, imageArchive))
	if !bytes.Equal(da, db) {
		t.Error("two packs of the same layout differ")
	}
	sa, _ := os.ReadFile(filepath.Join(a, sumsFile))
	sb, _ := os.ReadFile(filepath.Join(b, sumsFile))
	if !bytes.Equal(sa, sb) {
		t.Errorf("two synthetic releases differ:\n%s\n%s", sa, sb)
	}
}

func TestNormalizeTgz(t *testing.T) {
	write := func(mtime time.Time) string {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.ModTime = mtime
		zw.Comment = "Helm"
		tw := tar.NewWriter(zw)
		for _, name := range []string{"planex/Chart.yaml", "planex/templates/" + strings.Repeat("long-", 25) + ".yaml"} {
			tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: 3, ModTime: mtime, Typeflag: tar.TypeReg})
			tw.Write([]byte("abc"))
		}
		tw.Close()
		zw.Close()
		f := filepath.Join(t.TempDir(), "planex-1.0.0.tgz")
		os.WriteFile(f, buf.Bytes(), 0o644)
		return f
	}
	a, b := write(time.Unix(1, 0)), write(time.Now())
	for _, f := range []string{a, b} {
		if err := normalizeTgz(f, testEpoch); err != nil {
			t.Fatal(err)
		}
	}
	da, _ := os.ReadFile(a)
	db, _ := os.ReadFile(b)
	if !bytes.Equal(da, db) {
		t.Fatal("the same chart packaged at two times differs after normalize-tgz")
	}
	zr, err := gzip.NewReader(bytes.NewReader(da))
	if err != nil {
		t.Fatal(err)
	}
	if zr.Comment != "Helm" {
		t.Errorf("gzip comment %q, want Helm's kept", zr.Comment)
	}
	tr := tar.NewReader(zr)
	n := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		if string(body) != "abc" || !h.ModTime.Equal(time.Unix(testEpoch, 0)) {
			t.Errorf("%s: body %q mtime %v", h.Name, body, h.ModTime)
		}
		n++
	}
	if n != 2 {
		t.Errorf("%d entries, want 2", n)
	}
}

func TestRecordRejectsBadInput(t *testing.T) {
	for _, o := range []recordOptions{
		{Dir: t.TempDir(), Version: "1.2.3", Commit: testCommit, Repository: testRepo},
		{Dir: t.TempDir(), Version: testVersion, Commit: "abc", Repository: testRepo},
		{Dir: t.TempDir(), Version: testVersion, Commit: testCommit, Repository: testRepo + ":v1"},
	} {
		if err := record(o); err == nil {
			t.Errorf("record(%+v) accepted", o)
		}
	}
	if err := run([]string{"pack-image", "--layout", "x", "--out", "y"}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "--mtime") {
		t.Errorf("pack-image without --mtime: %v", err)
	}
}
