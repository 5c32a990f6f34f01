package manifests

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// KustomizeFS is an in-memory copy of a deploy/k8s tree under /k8s, to
// which combinations (extra kustomizations) are added without touching the
// work tree.
type KustomizeFS struct{ fs filesys.FileSystem }

// NewKustomizeFS copies the directory dir (deploy/k8s) into memory.
func NewKustomizeFS(dir string) (*KustomizeFS, error) {
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return mem.WriteFile(path.Join("/k8s", filepath.ToSlash(rel)), data)
	})
	if err != nil {
		return nil, fmt.Errorf("copy %s: %w", dir, err)
	}
	return &KustomizeFS{fs: mem}, nil
}

// Write adds or replaces a file (path relative to /k8s).
func (k *KustomizeFS) Write(name, content string) error {
	return k.fs.WriteFile(path.Join("/k8s", name), []byte(content))
}

// Build renders the kustomization in dir (relative to /k8s) like
// `kustomize build`.
func (k *KustomizeFS) Build(dir string) ([]byte, error) {
	opts := krusty.MakeDefaultOptions()
	opts.LoadRestrictions = types.LoadRestrictionsRootOnly
	m, err := krusty.MakeKustomizer(opts).Run(k.fs, path.Join("/k8s", dir))
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return m.AsYaml()
}

// Combination is a kustomization on top of an overlay: extra components in
// the given order, and optionally another namespace.
type Combination struct {
	Overlay    string
	Components []string
	Namespace  string
}

// Name identifies the combination in test names.
func (c Combination) Name() string {
	n := c.Overlay
	for _, comp := range c.Components {
		n += "+" + comp
	}
	if c.Namespace != "" {
		n += "@" + c.Namespace
	}
	return n
}

// BuildCombination writes the combination's kustomization and renders it.
func (k *KustomizeFS) BuildCombination(c Combination) ([]byte, error) {
	dir := "combinations/" + strings.NewReplacer("+", "_", "@", "_", "/", "_").Replace(c.Name())
	var b strings.Builder
	b.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n")
	if c.Namespace != "" {
		fmt.Fprintf(&b, "namespace: %s\n", c.Namespace)
	}
	fmt.Fprintf(&b, "resources:\n  - ../../overlays/%s\n", c.Overlay)
	if len(c.Components) > 0 {
		b.WriteString("components:\n")
		for _, comp := range c.Components {
			fmt.Fprintf(&b, "  - ../../components/%s\n", comp)
		}
	}
	if c.Namespace != "" {
		b.WriteString(namespaceReplacement)
	}
	if err := k.Write(dir+"/kustomization.yaml", b.String()); err != nil {
		return nil, err
	}
	return k.Build(dir)
}

// HelmTemplate renders a chart like `helm template planex CHART -n NS -f
// VALUES...`, offline (client only, no cluster).
func HelmTemplate(chartDir, namespace string, valueFiles ...string) ([]byte, error) {
	return HelmRender(chartDir, HelmOptions{Namespace: namespace, ValueFiles: valueFiles})
}

// HelmOptions are the arguments of one `helm template` run.
type HelmOptions struct {
	// Release is the release name; empty: "planex".
	Release string
	// Namespace is the release namespace (-n).
	Namespace string
	// ValueFiles are -f files, applied in order.
	ValueFiles []string
	// Set are --set key=value pairs, applied after the files.
	Set []string
}

// HelmRender renders a chart like `helm template RELEASE CHART -n NS -f
// VALUES... --set K=V...`, offline (client only, no cluster, Kubernetes
// 1.33).
func HelmRender(chartDir string, o HelmOptions) ([]byte, error) {
	if o.Release == "" {
		o.Release = "planex"
	}
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", chartDir, err)
	}
	vals, err := (&values.Options{ValueFiles: o.ValueFiles, Values: o.Set}).MergeValues(getter.Providers{})
	if err != nil {
		return nil, fmt.Errorf("values %v %v: %w", o.ValueFiles, o.Set, err)
	}
	install := action.NewInstall(&action.Configuration{})
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.IncludeCRDs = true
	install.ReleaseName = o.Release
	install.Namespace = o.Namespace
	install.KubeVersion = &chartutil.KubeVersion{Version: "v1.33.0", Major: "1", Minor: "33"}
	rel, err := install.Run(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("helm template %s %s %v %v: %w", o.Release, chartDir, o.ValueFiles, o.Set, err)
	}
	return []byte(rel.Manifest), nil
}

// namespaceReplacement is the replacements block overlays/dev and
// overlays/production carry: KEDA's NATS endpoint follows the namespace.
const namespaceReplacement = `replacements:
  - source:
      kind: Service
      name: nats-headless
      fieldPath: metadata.namespace
    targets:
      - select:
          group: keda.sh
          kind: ScaledObject
        fieldPaths:
          - spec.triggers.0.metadata.natsServerMonitoringEndpoint
          - spec.triggers.1.metadata.natsServerMonitoringEndpoint
        options:
          delimiter: "."
          index: 1
`
