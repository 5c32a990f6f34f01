package main

import (
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSchedulesCLI: `planex schedules` against a running dev stack (the
// supervisor's ScheduleService routed to the caller's tenant): a
// one-per-second schedule starts runs by itself, shows its firings, stops
// when paused; bad flags are refused naming the flag.
func TestSchedulesCLI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dataDir := filepath.Join(t.TempDir(), "data")
	stack, _ := startTestDevStack(ctx, t, parseDevFlags(t, "--data-dir="+dataDir), io.Discard)
	addr := "--addr=" + stack.Addr
	run := func(args ...string) string {
		t.Helper()
		out, err := planexIn(t, append(args, addr)...)
		if err != nil {
			t.Fatalf("planex %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	getJSON := func(id string) map[string]any {
		t.Helper()
		var m map[string]any
		if err := json.Unmarshal([]byte(run("schedules", "get", id, "-o", "json")), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}

	for _, bad := range []struct {
		args []string
		flag string
	}{
		{[]string{"schedules", "create", "a", "--goal", "g"}, "--cron or --every"},
		{[]string{"schedules", "create", "a", "--every", "1s"}, "--goal"},
		{[]string{"schedules", "create", "a", "--cron", "61 * * * *", "--goal", "g"}, "--cron"},
		{[]string{"schedules", "create", "a", "--cron", "@daily", "--tz", "Mars/Base", "--goal", "g"}, "--tz"},
		{[]string{"schedules", "create", "a", "--every", "1s", "--goal", "g", "--overlap", "sometimes"}, "--overlap"},
		{[]string{"schedules", "create", "a", "--every", "1s", "--goal", "g", "--input", "novalue"}, "--input"},
		{[]string{"schedules", "backfill", "a", "--from", "yesterday", "--to", "2026-01-01T00:00:00Z"}, "--from"},
	} {
		out, err := planexIn(t, append(bad.args, addr)...)
		if err == nil || !strings.Contains(out+err.Error(), bad.flag) {
			t.Errorf("planex %s: %v %q, want an error naming %s", strings.Join(bad.args, " "), err, out, bad.flag)
		}
	}

	out := run("schedules", "create", "tick", "--every", "1s", "--goal", "What is 2+2?", "--overlap", "allow-all", "--label", "team=qa", "--input", "n=3")
	for _, want := range []string{"id:", "tick", "every 1s", "allow-all", "next:"} {
		if !strings.Contains(out, want) {
			t.Errorf("schedules create output lacks %q:\n%s", want, out)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	var started []any
	for len(started) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no two firings within 30s: %v", getJSON("tick"))
		}
		started = nil
		for _, f := range anySlice(getJSON("tick")["recentFirings"]) {
			if f.(map[string]any)["outcome"] == "SCHEDULE_FIRING_OUTCOME_STARTED" {
				started = append(started, f)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	runID := started[0].(map[string]any)["runId"].(string)
	if got := run("runs", "list", "--label", "planex.schedule=tick"); !strings.Contains(got, runID) {
		t.Errorf("runs list --label planex.schedule=tick lacks %s:\n%s", runID, got)
	}
	if got := run("schedules", "list"); !strings.Contains(got, "tick") || !strings.Contains(got, "started") {
		t.Errorf("schedules list:\n%s", got)
	}
	run("schedules", "pause", "tick", "--note", "enough")
	before := len(anySlice(getJSON("tick")["recentFirings"]))
	time.Sleep(2500 * time.Millisecond)
	m := getJSON("tick")
	// At most one firing decided before the pause is carried out.
	if after := len(anySlice(m["recentFirings"])); after > before+1 || m["paused"] != true {
		t.Errorf("paused schedule went on firing: %d firings, then %d", before, after)
	}
	run("schedules", "delete", "tick")
	if out, err := planexIn(t, "schedules", "get", "tick", addr); err == nil || !strings.Contains(out+err.Error(), "not found") {
		t.Errorf("get after delete: %v %q, want not found", err, out)
	}
}

func anySlice(v any) []any {
	s, _ := v.([]any)
	return s
}
