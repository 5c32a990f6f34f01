package searchpool

import (
	"path/filepath"
	"testing"
)

// TestMatchLogForgetsTheOldestRun: the log holds maxRuns runs; recording
// one more forgets the oldest, and a run recorded again keeps its slot.
func TestMatchLogForgetsTheOldestRun(t *testing.T) {
	p, err := Open(Config{IndexDir: filepath.Join(t.TempDir(), "index")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	p.matches.maxRuns = 2
	weakIn := func(run string) *QueryOutput {
		return &QueryOutput{Below: []Hit{{ID: "doc-" + run, Missing: []string{"x"}}}}
	}
	for _, run := range []string{"a", "b", "b", "c"} {
		if err := p.matches.record(run, "q", weakIn(run)); err != nil {
			t.Fatal(err)
		}
	}
	for run, want := range map[string]bool{"a": false, "b": true, "c": true} {
		_, weak, err := p.matches.weakOnly(run, "doc-"+run)
		if err != nil {
			t.Fatal(err)
		}
		if weak != want {
			t.Errorf("run %s remembered: %v, want %v", run, weak, want)
		}
	}
	// A query without a run (a direct call) records nothing.
	if err := p.matches.record("", "q", weakIn("x")); err != nil {
		t.Fatal(err)
	}
	if _, weak, _ := p.matches.weakOnly("", "doc-x"); weak {
		t.Error("a call without a run was recorded")
	}
}
