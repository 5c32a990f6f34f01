package manifests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The release is pinned in one place, deploy/k8s/base/release.env: the
// image (tag or digest) and the version label every overlay and component
// follows. These tests make the edit a release makes and render every
// overlay and combination.

const (
	// planexRepo is the image repository of the planex containers.
	planexRepo = "ghcr.io/planex-dev/planex"
	// releasePlaceholder is the version label the manifests carry until
	// the replacements set it from release.env.
	releasePlaceholder = "from-release-env"
	// testDigest and testVersion are what the release tests pin.
	testDigest  = planexRepo + "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	testVersion = "v9.8.7-rc.1"
)

// releaseEnvLine is one line of release.env.
var releaseEnvLine = regexp.MustCompile(`^(image|version)=(\S+)$`)

// readReleaseEnv parses release.env: exactly the two lines image=… and
// version=…, in this order, so a release can rewrite it with sed.
func readReleaseEnv(data string) (image, version string, err error) {
	lines := strings.Split(strings.TrimSuffix(data, "\n"), "\n")
	if len(lines) != 2 || !strings.HasSuffix(data, "\n") {
		return "", "", fmt.Errorf("release.env: want exactly 2 lines ending in a newline (image=…, version=…), got %q", data)
	}
	for i, want := range []string{"image", "version"} {
		m := releaseEnvLine.FindStringSubmatch(lines[i])
		if m == nil || m[1] != want {
			return "", "", fmt.Errorf("release.env line %d %q: want %s=<value>", i+1, lines[i], want)
		}
		if want == "image" {
			image = m[2]
		} else {
			version = m[2]
		}
	}
	return image, version, nil
}

// repository is an image reference without its tag and digest.
func repository(image string) string {
	image, _, _ = strings.Cut(image, "@")
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	return image
}

// labelValue matches a valid Kubernetes label value.
var labelValue = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)

func TestReleaseEnvFormat(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "k8s", "base", "release.env"))
	if err != nil {
		t.Fatal(err)
	}
	image, version, err := readReleaseEnv(string(data))
	if err != nil {
		t.Fatal(err)
	}
	if repository(image) != planexRepo {
		t.Errorf("release.env image %q: want the repository %s (the manifests' containers name it)", image, planexRepo)
	}
	if !pinned.MatchString(image) || strings.HasSuffix(image, ":latest") {
		t.Errorf("release.env image %q: want a release tag or a digest", image)
	}
	if tag, ok := strings.CutPrefix(image, planexRepo+":"); ok && tag != version {
		t.Errorf("release.env: image tag %q and version %q differ", tag, version)
	}
	if len(version) > 63 || !labelValue.MatchString(version) {
		t.Errorf("release.env version %q is not a valid label value", version)
	}
	// The parser refuses what a sed could not rewrite line by line.
	for _, bad := range []string{"image=a\n", "version=v1\nimage=a\n", "image=a\nversion=v1\n# note\n", "image=a\nversion=v1", "image=a b\nversion=v1\n"} {
		if _, _, err := readReleaseEnv(bad); err == nil {
			t.Errorf("readReleaseEnv(%q) accepted", bad)
		}
	}
}

// releasedTree copies deploy/k8s to a temporary directory, makes there the
// edit a release makes (the sed lines of deploy/k8s/README.md, "Pin what
// runs") and loads the copy.
func releasedTree(t *testing.T, image, version string) *KustomizeFS {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(filepath.Join(repoRoot(t), "deploy", "k8s"))); err != nil {
		t.Fatal(err)
	}
	env := filepath.Join(dir, "base", "release.env")
	out, err := exec.Command("sed", "-e", "s|^image=.*|image="+image+"|", "-e", "s|^version=.*|version="+version+"|", env).Output()
	if err != nil {
		t.Fatalf("sed release.env: %v", err)
	}
	if err := os.WriteFile(env, out, 0o644); err != nil {
		t.Fatal(err)
	}
	if gotImage, gotVersion, err := readReleaseEnv(string(out)); err != nil || gotImage != image || gotVersion != version {
		t.Fatalf("release.env after the release edit: %q %q %v", gotImage, gotVersion, err)
	}
	k, err := NewKustomizeFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// releasePinErrors checks that the render runs exactly the release: every
// container (init containers and sidecars included) whose image is the
// planex repository runs image; the containers in want (workload name /
// container name) exist; planex's own objects (named planex-*) carry
// app.kubernetes.io/version = version, workloads on their pod templates
// too; and neither the placeholder nor staleImage (the release before)
// is left anywhere in the rendered text.
func releasePinErrors(r Render, out []byte, image, version, staleImage string, want []string) []error {
	var errs []error
	seen := map[string]bool{}
	for _, w := range r.Workloads() {
		spec := w.Template.Spec
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			if repository(c.Image) != planexRepo && !strings.Contains(c.Image, "planex") {
				continue
			}
			seen[w.Name+"/"+c.Name] = true
			if c.Image != image {
				errs = append(errs, fmt.Errorf("%s container %s: image %q, want the release %q", w.ID(), c.Name, c.Image, image))
			}
		}
		if strings.HasPrefix(w.Name, "planex-") && w.Template.Labels["app.kubernetes.io/version"] != version {
			errs = append(errs, fmt.Errorf("%s: pod template label app.kubernetes.io/version %q, want %q", w.ID(), w.Template.Labels["app.kubernetes.io/version"], version))
		}
	}
	for _, c := range want {
		if !seen[c] {
			errs = append(errs, fmt.Errorf("no planex container %s in the render", c))
		}
	}
	for _, o := range r.Objects {
		v, ok := o.Labels["app.kubernetes.io/version"]
		planex := strings.HasPrefix(o.Name, "planex-") || strings.HasPrefix(o.Labels["app.kubernetes.io/name"], "planex-")
		switch {
		case v == releasePlaceholder:
			errs = append(errs, fmt.Errorf("%s: label app.kubernetes.io/version is still the placeholder %q", o.ID(), v))
		case planex && ok && v != version:
			errs = append(errs, fmt.Errorf("%s: label app.kubernetes.io/version %q, want %q", o.ID(), v, version))
		case planex && !ok && (o.Kind == "Deployment" || o.Kind == "StatefulSet" || o.Kind == "Job"):
			errs = append(errs, fmt.Errorf("%s: no label app.kubernetes.io/version", o.ID()))
		}
	}
	for _, stale := range []string{releasePlaceholder, staleImage} {
		if stale != "" && strings.Contains(string(out), stale) {
			errs = append(errs, fmt.Errorf("the render still holds %q", stale))
		}
	}
	return errs
}

// wantPlanexContainers are the planex containers a render of the overlay
// with these components must have (so the check cannot pass vacuously).
func wantPlanexContainers(overlay string, components []string) []string {
	want := []string{
		"planex-supervisor/supervisor", "planex-planner/planner", "planex-executor-sql/executor",
		"planex-executor-email/executor", "planex-executor-search/executor", "nats/reloader",
	}
	if overlay == "dev" {
		want = append(want, "planex-executor-sql/seed-demo", "planex-executor-search/seed-demo")
	}
	if slices.Contains(components, "mcp-pool") {
		want = append(want, "planex-executor-mcp/executor")
	}
	if slices.Contains(components, "console") {
		want = append(want, "planex-console/console")
	}
	return want
}

// releaseCombinations are the renders the release must reach: each
// overlay alone, with each component that adds planex containers, with
// everything (in another namespace too). A Combination is a kustomization
// of a user's on top of an overlay, so production+mcp-pool is the case of
// `resources: [../overlays/production]` + `components: [mcp-pool]`.
func releaseCombinations() []Combination {
	var cs []Combination
	all := map[string][]string{
		"dev":        {"keda", "search-pvc", "prometheus-operator", "cert-manager", "policy", "mcp-pool", "mcp-pool/cert-manager", "console", "console/cert-manager"},
		"production": {"keda", "prometheus-operator", "cert-manager", "policy", "mcp-pool", "mcp-pool/cert-manager", "console", "console/cert-manager"},
	}
	for _, o := range []string{"dev", "production"} {
		rev := slices.Clone(all[o])
		slices.Reverse(rev)
		cs = append(cs,
			Combination{Overlay: o},
			Combination{Overlay: o, Components: []string{"mcp-pool"}},
			Combination{Overlay: o, Components: []string{"console"}},
			Combination{Overlay: o, Components: []string{"mcp-pool", "console"}, Namespace: "acme-agents"},
			Combination{Overlay: o, Components: all[o]},
			Combination{Overlay: o, Components: rev, Namespace: "acme-agents"},
		)
	}
	return cs
}

func TestReleasePin(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "k8s", "base", "release.env"))
	if err != nil {
		t.Fatal(err)
	}
	current, _, err := readReleaseEnv(string(data))
	if err != nil {
		t.Fatal(err)
	}
	k := releasedTree(t, testDigest, testVersion)
	check := func(t *testing.T, name string, out []byte, ns, overlay string, components []string) {
		t.Helper()
		r := decode(t, name, out, ns, overlay == "dev")
		if errs := releasePinErrors(r, out, testDigest, testVersion, current, wantPlanexContainers(overlay, components)); len(errs) > 0 {
			t.Errorf("%s: %d problems:%s", name, len(errs), describe(errs))
		}
		if errs := r.CheckImages(); len(errs) > 0 {
			t.Errorf("%s:%s", name, describe(errs))
		}
	}
	t.Run("base", func(t *testing.T) {
		out, err := k.Build("base")
		if err != nil {
			t.Fatal(err)
		}
		check(t, "base", out, "planex", "production", nil)
	})
	for _, o := range []string{"dev", "production"} {
		t.Run("overlays/"+o, func(t *testing.T) {
			out, err := k.Build("overlays/" + o)
			if err != nil {
				t.Fatal(err)
			}
			check(t, o, out, "planex", o, nil)
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
			check(t, c.Name(), out, ns, c.Overlay, c.Components)
		})
	}
	// A user's overlay two levels up: mcp-pool on production, and the
	// console on top of that, in another namespace.
	t.Run("user-overlays", func(t *testing.T) {
		for name, kust := range map[string]string{
			"user/agents/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../overlays/production\ncomponents:\n  - ../../components/mcp-pool\n",
			"user/team/kustomization.yaml":   "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: team-a\nresources:\n  - ../agents\ncomponents:\n  - ../../components/console\n",
		} {
			if err := k.Write(name, kust); err != nil {
				t.Fatal(err)
			}
		}
		out, err := k.Build("user/team")
		if err != nil {
			t.Fatal(err)
		}
		check(t, "user/team", out, "team-a", "production", []string{"mcp-pool", "console"})
	})
	// A release by tag: the same one line.
	t.Run("tag", func(t *testing.T) {
		k := releasedTree(t, planexRepo+":v9.8.7", "v9.8.7")
		out, err := k.BuildCombination(Combination{Overlay: "dev", Components: []string{"mcp-pool", "console"}})
		if err != nil {
			t.Fatal(err)
		}
		r := decode(t, "tag", out, "planex", true)
		if errs := releasePinErrors(r, out, planexRepo+":v9.8.7", "v9.8.7", "", wantPlanexContainers("dev", []string{"mcp-pool", "console"})); len(errs) > 0 {
			t.Errorf("%d problems:%s", len(errs), describe(errs))
		}
	})
}

// TestReleasePinCatchesStale proves the check fails when a kustomization
// that adds planex containers does not follow release.env: each case
// drops one replacement (or pins an image of its own) and must be named.
func TestReleasePinCatchesStale(t *testing.T) {
	cases := []struct {
		name, file string
		edit       func(string) string
		c          Combination
		want       []string
	}{
		{"mcp-pool without its replacements", "components/mcp-pool/kustomization.yaml",
			func(s string) string { return s[:strings.Index(s, "\nreplacements:")] + "\n" },
			Combination{Overlay: "production", Components: []string{"mcp-pool"}},
			[]string{`planex-executor-mcp container executor: image "ghcr.io/planex-dev/planex", want the release`,
				`Deployment planex/planex-executor-mcp: label app.kubernetes.io/version is still the placeholder`}},
		{"console without its replacements", "components/console/kustomization.yaml",
			func(s string) string { return s[:strings.Index(s, "\nreplacements:")] + "\n" },
			Combination{Overlay: "dev", Components: []string{"console"}},
			[]string{`planex-console container console: image "ghcr.io/planex-dev/planex", want the release`}},
		{"dev seed without its replacement", "overlays/dev/kustomization.yaml",
			func(s string) string {
				return strings.Replace(s, "          - spec.template.spec.initContainers.[name=seed-demo].image\n", "          - spec.template.spec.containers.[name=executor].image\n", 1)
			},
			Combination{Overlay: "dev"},
			[]string{`planex-executor-sql container seed-demo: image "ghcr.io/planex-dev/planex", want the release`}},
		{"an overlay pinning its own tag", "overlays/production/kustomization.yaml",
			func(s string) string {
				return s + "images:\n  - name: ghcr.io/planex-dev/planex\n    newTag: v0.0.1\n"
			},
			Combination{Overlay: "production"},
			[]string{`planex-supervisor container supervisor: image "ghcr.io/planex-dev/planex:v0.0.1", want the release`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := releasedTree(t, testDigest, testVersion)
			orig, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "k8s", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			edited := tc.edit(string(orig))
			if edited == string(orig) {
				t.Fatalf("the edit changed nothing in %s", tc.file)
			}
			if err := k.Write(tc.file, edited); err != nil {
				t.Fatal(err)
			}
			out, err := k.BuildCombination(tc.c)
			if err != nil {
				t.Fatal(err)
			}
			r := decode(t, tc.name, out, "planex", tc.c.Overlay == "dev")
			msgs := describe(releasePinErrors(r, out, testDigest, testVersion, "", wantPlanexContainers(tc.c.Overlay, tc.c.Components)))
			for _, want := range tc.want {
				if !strings.Contains(msgs, want) {
					t.Errorf("stale release passed: want an error containing %q; got:%s", want, msgs)
				}
			}
		})
	}
}
