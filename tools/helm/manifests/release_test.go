package manifests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"
)

// releaseRecord is the part of a release's release.json (written by
// cmd/internal/release) this test reads.
type releaseRecord struct {
	Version string `json:"version"`
	Image   struct {
		Repository string `json:"repository"`
		Digest     string `json:"digest"`
		Reference  string `json:"reference"`
	} `json:"image"`
	Chart     string `json:"chart"`
	Manifests string `json:"manifests"`
}

// TestRelease renders a `make release` output (PLANEX_RELEASE_DIR, set by
// scripts/verify-release.sh) and checks with releasePinErrors
// (release_pin_test.go) that every planex container of every render runs
// the release's image by digest, that every planex object carries the
// release's version label, and that the work tree's own pin (the previous
// release's tag) is left nowhere: the release's manifests on each overlay
// alone, with every combination of releaseCombinations (components/mcp-pool
// and components/console included) and a user's kustomization two levels
// up; and the packaged chart with its default values and each CI values
// file that leaves the image alone.
func TestRelease(t *testing.T) {
	dir := os.Getenv("PLANEX_RELEASE_DIR")
	if dir == "" {
		t.Skip("PLANEX_RELEASE_DIR is not set: scripts/verify-release.sh sets it to a `make release` output directory")
	}
	data, err := os.ReadFile(filepath.Join(dir, "release.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rel releaseRecord
	if err := json.Unmarshal(data, &rel); err != nil {
		t.Fatalf("release.json: %v", err)
	}
	want := rel.Image.Repository + "@" + rel.Image.Digest
	if rel.Image.Reference != want || !pinned.MatchString(want) || rel.Version == "" || rel.Chart == "" || rel.Manifests == "" {
		t.Fatalf("release.json: image %+v, version %q, chart %q, manifests %q: want repository@sha256:<digest>, a version, a chart and the manifests", rel.Image, rel.Version, rel.Chart, rel.Manifests)
	}
	// The work tree's pin: a release must replace it everywhere.
	data, err = os.ReadFile(filepath.Join(repoRoot(t), "deploy", "k8s", "base", "release.env"))
	if err != nil {
		t.Fatal(err)
	}
	stale, _, err := readReleaseEnv(string(data))
	if err != nil {
		t.Fatal(err)
	}
	if stale == want {
		stale = ""
	}
	check := func(t *testing.T, name string, out []byte, ns string, wantContainers []string) {
		t.Helper()
		objs, err := Decode(out, ns)
		if err != nil {
			t.Fatalf("%s: decode: %v", name, err)
		}
		r := Render{Name: name, Namespace: ns, Objects: objs}
		if errs := releasePinErrors(r, out, want, rel.Version, stale, wantContainers); len(errs) > 0 {
			t.Errorf("%s: %d problems:%s", name, len(errs), describe(errs))
		}
	}

	t.Run("kustomize", func(t *testing.T) {
		k, err := NewKustomizeFS(filepath.Join(dir, rel.Manifests))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range []string{"dev", "production"} {
			t.Run("overlays/"+o, func(t *testing.T) {
				out, err := k.Build("overlays/" + o)
				if err != nil {
					t.Fatal(err)
				}
				check(t, o, out, "planex", wantPlanexContainers(o, nil))
			})
		}
		for _, c := range releaseCombinations() {
			t.Run(c.Name(), func(t *testing.T) {
				out, err := k.BuildCombination(c)
				if err != nil {
					t.Fatal(err)
				}
				ns := "planex"
				if c.Namespace != "" {
					ns = c.Namespace
				}
				check(t, c.Name(), out, ns, wantPlanexContainers(c.Overlay, c.Components))
			})
		}
		// A user's kustomization: the mcp pool on production, in its own
		// namespace.
		t.Run("user-overlay", func(t *testing.T) {
			kust := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: agents\n" +
				"resources:\n  - ../../overlays/production\ncomponents:\n  - ../../components/mcp-pool\n"
			if err := k.Write("user/agents/kustomization.yaml", kust); err != nil {
				t.Fatal(err)
			}
			out, err := k.Build("user/agents")
			if err != nil {
				t.Fatal(err)
			}
			check(t, "user/agents", out, "agents", wantPlanexContainers("production", []string{"mcp-pool"}))
		})
	})

	t.Run("chart", func(t *testing.T) {
		chart := filepath.Join(dir, rel.Chart)
		for _, vf := range releaseValues(t) {
			name := "default"
			var files []string
			if vf.file != "" {
				name, files = filepath.Base(vf.file), []string{vf.file}
			}
			t.Run(name, func(t *testing.T) {
				out, err := HelmTemplate(chart, "planex", files...)
				if err != nil {
					t.Fatal(err)
				}
				wantContainers := []string{"planex-supervisor/supervisor", "planex-planner/planner", "planex-executor-sql/executor"}
				if vf.mcp {
					wantContainers = append(wantContainers, "planex-executor-mcp/executor")
				}
				check(t, rel.Chart+" "+name, out, "planex", wantContainers)
			})
		}
	})
}

// releaseValue is a CI values file of the chart.
type releaseValue struct {
	file string
	// mcp: the file turns the mcp pool on.
	mcp bool
}

// releaseValues are the chart's CI values files (of this work tree, which
// the release is built from) that do not set the image themselves, and
// the default values (file "").
func releaseValues(t *testing.T) []releaseValue {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir(t), "ci", "values-*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	vs := []releaseValue{{}}
	mcp := false
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Image *struct{} `json:"image"`
			MCP   struct {
				Enabled bool `json:"enabled"`
			} `json:"mcp"`
		}
		if err := yaml.Unmarshal(data, &v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if v.Image == nil {
			vs = append(vs, releaseValue{file: f, mcp: v.MCP.Enabled})
			mcp = mcp || v.MCP.Enabled
		}
	}
	if !mcp {
		t.Fatalf("no CI values file of %s turns the mcp pool on: the chart's mcp pool would go unchecked", chartDir(t))
	}
	return vs
}
