package monitoring

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "rewrite the generated copies of the rules and dashboards")

// root is the repository root.
const root = "../.."

func loadRules(t *testing.T) []Query {
	t.Helper()
	groups, err := LoadRules(filepath.Join(root, RulesSource))
	if err != nil {
		t.Fatal(err)
	}
	return Queries(groups)
}

// TestQueriesParse parses every rule's and panel's expression and checks
// that each names its metrics plainly.
func TestQueriesParse(t *testing.T) {
	qs := loadRules(t)
	if len(qs) < 40 {
		t.Fatalf("%d queries: rules or dashboards missing", len(qs))
	}
	for _, q := range qs {
		sels, err := Selectors(q.Expr)
		if err != nil {
			t.Errorf("%s: %v", q.Where, err)
			continue
		}
		if len(sels) == 0 {
			t.Errorf("%s: %q selects no metric", q.Where, q.Expr)
		}
	}
}

// TestSelectorsFailOnBadPromQL: the parser is the real one.
func TestSelectorsFailOnBadPromQL(t *testing.T) {
	for _, bad := range []string{`sum(rate(x[5m])`, `rate(x)`, `{__name__=~"planex_.*"}`, `x > > 1`} {
		if _, err := Selectors(bad); err == nil {
			t.Errorf("Selectors(%q): no error", bad)
		}
	}
	sels, err := Selectors(`sum by (tool) (rate(planex_steps_finished_total{outcome="x"}[5m])) / on() group_left {__name__="up", job="a"}`)
	if err != nil || len(sels) != 2 || sels[0].Metric != "planex_steps_finished_total" || sels[0].Labels[0] != "outcome" || sels[1].Metric != "up" {
		t.Fatalf("Selectors: %+v, %v", sels, err)
	}
}

// rawRule is what rulefmt cannot tell apart: "for: 0m" from no for.
type rawRule struct {
	Alert       string            `yaml:"alert"`
	For         *string           `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// TestAlertsHaveRunbooks checks every alert's severity, for:, summary and
// runbook_url, and that the runbook URL's anchor is a section of
// docs/operations.md.
func TestAlertsHaveRunbooks(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, RulesSource))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []rawRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile(filepath.Join(root, "docs/operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#{2,4} +(.+)$`).FindAllStringSubmatch(string(ops), -1) {
		anchors[githubAnchor(m[1])] = true
	}
	n := 0
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("alert %s: severity %q, want critical or warning", r.Alert, s)
			}
			if r.For == nil {
				t.Errorf("alert %s: no for:", r.Alert)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: summary or description missing", r.Alert)
			}
			want := runbookURL + "#" + strings.ToLower(r.Alert)
			if got := r.Annotations["runbook_url"]; got != want {
				t.Errorf("alert %s: runbook_url %q, want %q", r.Alert, got, want)
			}
			if !anchors[strings.ToLower(r.Alert)] {
				t.Errorf("alert %s: docs/operations.md has no section %q", r.Alert, r.Alert)
			}
		}
	}
	if n < 20 {
		t.Errorf("%d alerts", n)
	}
}

// githubAnchor is the anchor GitHub gives a heading.
func githubAnchor(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestGenerated checks that the copies of the rules and the dashboards in
// the kustomize components and the chart match their source; -update
// writes them.
func TestGenerated(t *testing.T) {
	files, err := Generated(root)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range files {
		full := filepath.Join(root, path)
		if *update {
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(full, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(full)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is not what tools/monitoring generates (%v): run (cd tools/monitoring && go test -run TestGenerated -update)", path, err)
		}
	}
	// No stale dashboard in the generated directories.
	for _, dir := range []string{dashboardsDir, dashboardsComp, chartDashboardDir} {
		matches, _ := filepath.Glob(filepath.Join(root, dir, "*.json"))
		for _, m := range matches {
			rel, _ := filepath.Rel(root, m)
			if _, ok := files[filepath.ToSlash(rel)]; !ok {
				t.Errorf("%s: no such dashboard in tools/monitoring/dashboards.go; delete it", rel)
			}
		}
	}
}
