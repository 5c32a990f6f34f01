package playbook_test

import (
	"strings"
	"testing"

	"github.com/planex-dev/planex/services/planner/playbook"
)

func TestClosest(t *testing.T) {
	names := []string{"Acme Corp", "Globex", "Initech", "Umbrella Corp", "Tyrell Corp", "Yoyodyne", "Stark Industries"}
	tests := []struct {
		name string
		want string
	}{
		{"acme corp", "Acme Corp"},
		{"Acme Corporation", "Acme Corp"},
		{"Globex Inc", "Globex"},
		{"Initec", "Initech"},
		{"Umbrela Corp", "Umbrella Corp"},
		{"Stark", "Stark Industries"},
		{"Nobody Inc", ""},
		{"Nobody Corp", ""}, // "corp" alone does not make names alike
		{"", ""},
	}
	for _, tt := range tests {
		if got := strings.Join(playbook.Closest(names, tt.name, 3), ", "); got != tt.want {
			t.Errorf("Closest(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestFailBranchChecks(t *testing.T) {
	const head = `name: x
description: x
examples: ["do x"]
match: ['^do x$']
steps:
  - id: a
    tool: sql.query
    args: {sql: SELECT 1}
on_failure:
`
	tests := []struct{ name, branch, want string }{
		{"fail and steps", "  - when: {step: a}\n    fail: \"'no'\"\n    steps: [{id: b, tool: sql.query, args: {sql: SELECT 2}}]\n", `a branch has either "fail" or "steps"`},
		{"bad CEL", "  - when: {step: a}\n    fail: \"'no' +\"\n", "on_failure[0].fail:"},
		{"not a string", "  - when: {step: a}\n    fail: \"1 + 2\"\n", "want a string expression"},
		{"unknown step", "  - when: {step: [a, zz]}\n    fail: \"'no'\"\n", `unknown step "zz"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadYAML(t, map[string]string{"x.yaml": head + tt.branch})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}
