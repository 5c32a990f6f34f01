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

// TestTriggersCLI: `planex triggers create/get/list/update/pause/resume/
// fire/rejections/delete` against a running dev stack; a fired event
// starts a run once, a malformed one is listed as a rejection, and bad
// flags are refused naming the flag with nothing created.
func TestTriggersCLI(t *testing.T) {
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
	counters := func() map[string]any {
		t.Helper()
		var m map[string]any
		if err := json.Unmarshal([]byte(run("triggers", "get", "orders", "-o", "json")), &m); err != nil {
			t.Fatal(err)
		}
		c, _ := m["counters"].(map[string]any)
		return c
	}
	waitCount := func(field, want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for counters()[field] != want {
			if time.Now().After(deadline) {
				t.Fatalf("counter %s never reached %s: %v", field, want, counters())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	for _, bad := range []struct {
		args []string
		flag string
	}{
		{[]string{"triggers", "create", "b1", "--subject", "planex.events.x", "--goal", `"g"`, "--idempotency-key", "event.id"}, "--subject"},
		{[]string{"triggers", "create", "b2", "--subject", "planex.inbound.x", "--goal", `"g" +`, "--idempotency-key", "event.id"}, "--goal"},
		{[]string{"triggers", "create", "b3", "--subject", "planex.inbound.x", "--goal", `"g"`}, "--idempotency-key"},
		{[]string{"triggers", "create", "b4", "--subject", "planex.inbound.x", "--goal", `"g"`, "--idempotency-key", "event.id", "--label", "nokey"}, "--label"},
		{[]string{"triggers", "create", "b5", "--subject", "planex.inbound.x", "--goal", `"g"`, "--idempotency-key", "event.id", "--webhook", "--webhook-scheme", "gitlab", "--webhook-secret-ref", "s"}, "--webhook-scheme"},
		{[]string{"triggers", "create", "B6", "--subject", "planex.inbound.x", "--goal", `"g"`, "--idempotency-key", "event.id"}, "NAME"},
		{[]string{"triggers", "fire", "orders"}, "--data"},
		{[]string{"triggers", "rejections", "orders", "--limit", "5000"}, "--limit"},
	} {
		out, err := planexIn(t, append(bad.args, addr)...)
		if err == nil || !strings.Contains(err.Error(), bad.flag) {
			t.Errorf("planex %s: %v (want an error naming %s)\n%s", strings.Join(bad.args, " "), err, bad.flag, out)
		}
	}
	if out := run("triggers", "list"); strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("a refused create left a trigger:\n%s", out)
	}

	out := run("triggers", "create", "orders", "--subject", "planex.inbound.orders", "--goal", `"Summarize order " + event.id`,
		"--idempotency-key", "event.id", "--label", `source="cli"`, "--description", "orders")
	for _, want := range []string{"orders", "planex.inbound.orders", "0 received"} {
		if !strings.Contains(out, want) {
			t.Errorf("create output lacks %q:\n%s", want, out)
		}
	}
	run("triggers", "fire", "orders", "--data", `{"id":"o-1"}`)
	run("triggers", "fire", "orders", "--data", `{"id":"o-1"}`)
	run("triggers", "fire", "orders", "--data", `not json`)
	waitCount("received", "3")
	if c := counters(); c["started"] != "1" || c["duplicates"] != "1" || c["rejected"] != "1" {
		t.Fatalf("counters %v, want 1 started, 1 duplicate, 1 rejected", c)
	}
	if out := run("triggers", "rejections", "orders"); !strings.Contains(out, "not JSON") {
		t.Errorf("rejections:\n%s", out)
	}
	var runs struct {
		Runs []struct{ Goal, StartedBy string }
	}
	if err := json.Unmarshal([]byte(run("runs", "list", "--json")), &runs); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range runs.Runs {
		if r.Goal == "Summarize order o-1" && r.StartedBy == "trigger:orders" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d runs of the event, want 1: %+v", n, runs.Runs)
	}
	run("triggers", "pause", "orders")
	run("triggers", "fire", "orders", "--data", `{"id":"o-2"}`)
	waitCount("filtered", "1")
	run("triggers", "resume", "orders")
	run("triggers", "update", "orders", "--description", "v2")
	if out := run("triggers", "list"); !strings.Contains(out, "orders") || !strings.Contains(out, "false") {
		t.Errorf("list:\n%s", out)
	}
	run("triggers", "delete", "orders")
	if _, err := planexIn(t, "triggers", "get", "orders", addr); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("get after delete: %v", err)
	}
}
