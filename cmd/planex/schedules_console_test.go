package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConsoleSchedulesPage drives the console's Schedules page in
// headless Chromium against a dev stack: a one-per-second schedule is
// listed with its next firing and the run of its last firing, and the
// Pause and Resume buttons pause and resume it (as the API then reports).
func TestConsoleSchedulesPage(t *testing.T) {
	f := parseDevFlags(t, "--data-dir="+filepath.Join(t.TempDir(), "data"))
	f.services.ConsoleAddr = "127.0.0.1:0"
	stack, _ := startTestDevStack(t.Context(), t, f, io.Discard)
	tok, err := os.ReadFile(stack.Credentials.CLITokenFile)
	if err != nil {
		t.Fatal(err)
	}
	addr := "--addr=" + stack.Addr
	if out, err := planexIn(t, "schedules", "create", "tick", "--every", "1s", "--goal", "What is 2+2?", "--overlap", "allow-all", addr); err != nil {
		t.Fatalf("schedules create: %v\n%s", err, out)
	}
	paused := func() bool {
		t.Helper()
		out, err := planexIn(t, "schedules", "get", "tick", "-o", "json", addr)
		if err != nil {
			t.Fatalf("schedules get: %v\n%s", err, out)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatal(err)
		}
		return m["paused"] == true
	}

	b := newBrowser(t, stack.ConsoleURL, strings.TrimSpace(string(tok)))
	b.open("#/schedules")
	b.wait("the schedule listed", `document.querySelector('[data-schedule="tick"]') !== null`)
	b.wait("its next firing", `document.querySelector('[data-schedule="tick"] .next time') !== null`)
	b.wait("its last firing started a run", `(() => { const l = document.querySelector('[data-schedule="tick"] .last'); return l && l.textContent.includes('started') && l.querySelector('a[href^="#/runs/"]') !== null; })()`)
	b.axe("schedules")
	b.shot("schedules.png")

	b.click(`[data-schedule="tick"] button[data-action="pause"]`)
	b.wait("the schedule shown paused", `document.querySelector('[data-schedule="tick"] button[data-action="resume"]') !== null`)
	if !paused() {
		t.Fatal("Pause in the console did not pause the schedule")
	}
	b.click(`[data-schedule="tick"] button[data-action="resume"]`)
	b.wait("the schedule shown active", `document.querySelector('[data-schedule="tick"] button[data-action="pause"]') !== null`)
	if paused() {
		t.Fatal("Resume in the console did not resume the schedule")
	}
}
