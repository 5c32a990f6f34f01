package planner

import (
	"log/slog"
	"testing"
)

// --playbooks builtin:demo serves the demo playbooks built into the binary,
// alone or with a directory.
func TestPlaybooksBuiltinDemo(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	bs, err := buildBackends(BackendConfig{Backend: BackendPlaybook, Playbooks: []string{BuiltinDemoPlaybooks}}, logger)
	if err != nil {
		t.Fatalf("--playbooks %s: %v", BuiltinDemoPlaybooks, err)
	}
	if bs.playbooks < 5 {
		t.Fatalf("--playbooks %s loaded %d playbooks, want the demo's (at least 5)", BuiltinDemoPlaybooks, bs.playbooks)
	}
	if _, err := buildBackends(BackendConfig{Backend: BackendPlaybook, Playbooks: []string{"builtin:nope"}}, logger); err == nil {
		t.Fatal("--playbooks builtin:nope: want an error (no such directory)")
	}
}
