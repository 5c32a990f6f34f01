package main

import (
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// TestTenantsCLI: `planex tenants create/list/get/update/delete` and
// `planex usage` against a running dev stack; a tenant created through
// the CLI gets its NATS account from the stack and is ready within
// seconds, without a restart; a bad flag is refused naming it, and
// nothing is created.
func TestTenantsCLI(t *testing.T) {
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
	getJSON := func(name string) map[string]any {
		t.Helper()
		var m map[string]any
		if err := json.Unmarshal([]byte(run("tenants", "get", name, "-o", "json")), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}

	out := run("tenants", "create", "acme", "--description", "team acme", "--pool", "sql", "--max-concurrent-runs", "2",
		"--pool-steps-in-flight", "sql=3", "--money-per-month", "12.5", "--retention", "48h", "--max-steps", "20")
	for _, want := range []string{"name:", "acme", "nats account:", "planex-tenant-acme", "2 runs at once", "sql 3 steps", "$12.50/month"} {
		if !strings.Contains(out, want) {
			t.Errorf("tenants create output lacks %q:\n%s", want, out)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for getJSON("acme")["ready"] != true {
		if time.Now().After(deadline) {
			t.Fatalf("tenant acme not ready within 30s: %v", getJSON("acme"))
		}
		time.Sleep(100 * time.Millisecond)
	}

	out = run("tenants", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") || !strings.HasPrefix(lines[1], "default") || !strings.HasPrefix(lines[2], "acme") ||
		!strings.Contains(lines[2], "yes") || !strings.Contains(lines[2], "sql") {
		t.Errorf("tenants list:\n%s", out)
	}

	run("tenants", "update", "acme", "--max-concurrent-runs", "5")
	m := getJSON("acme")
	q, _ := m["quotas"].(map[string]any)
	if m["description"] != "team acme" || q["maxConcurrentRuns"] != float64(5) || q["moneyPerMonthMicros"] != "12500000" || m["retention"] != "172800s" {
		t.Errorf("after update --max-concurrent-runs 5, only that changes: %v", m)
	}

	for _, bad := range []struct {
		args []string
		flag string
	}{
		{[]string{"tenants", "create", "bad1", "--pool-steps-in-flight", "sql"}, "--pool-steps-in-flight"},
		{[]string{"tenants", "create", "bad2", "--max-concurrent-runs", "-1"}, "--max-concurrent-runs"},
		{[]string{"tenants", "create", "bad3", "--pool", "a.b"}, "--pool"},
		{[]string{"tenants", "create", "Bad4"}, "NAME"},
		{[]string{"tenants", "create", "bad5", "--money-per-month", "-3"}, "--money-per-month"},
		{[]string{"tenants", "update", "acme", "--start-burst", "-2"}, "--start-burst"},
		{[]string{"usage", "--from", "last week"}, "--from"},
	} {
		out, err := planexIn(t, append(bad.args, addr)...)
		if err == nil || !strings.Contains(err.Error(), bad.flag) {
			t.Errorf("planex %s: %v (%s), want an error naming %s", strings.Join(bad.args, " "), err, out, bad.flag)
		}
	}
	if out := run("tenants", "list"); strings.Contains(out, "bad") || strings.Count(strings.TrimSpace(out), "\n") != 2 {
		t.Errorf("a refused create left a tenant:\n%s", out)
	}
	if m := getJSON("acme"); m["quotas"].(map[string]any)["startBurst"] != nil {
		t.Errorf("a refused update changed acme: %v", m)
	}

	out = run("usage")
	for _, want := range []string{"tenant default", "DAY", "total", "run trees in flight:", "spent this month:"} {
		if !strings.Contains(out, want) {
			t.Errorf("usage lacks %q:\n%s", want, out)
		}
	}
	var u map[string]any
	if err := json.Unmarshal([]byte(run("usage", "--tenant", "acme", "-o", "json")), &u); err != nil || u["tenant"] != "acme" {
		t.Errorf("usage --tenant acme -o json: %v %v", u, err)
	}

	// A restarted dev stack serves acme (its account in the NATS
	// configuration from the start) and the default tenant as before.
	if err := stack.Stop(); err != nil {
		t.Fatal(err)
	}
	stack, client := startTestDevStack(ctx, t, parseDevFlags(t, "--data-dir="+dataDir), io.Discard)
	addr = "--addr=" + stack.Addr
	if _, err := client.ListTools(ctx, &planexv1.ListToolsRequest{}); err != nil {
		t.Fatalf("default tenant after the restart: %v", err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for getJSON("acme")["ready"] != true {
		if time.Now().After(deadline) {
			t.Fatalf("tenant acme not ready within 30s of the restart: %v", getJSON("acme"))
		}
		time.Sleep(100 * time.Millisecond)
	}

	if out := run("tenants", "delete", "acme"); !strings.Contains(out, "tenant acme deleted") {
		t.Errorf("tenants delete: %s", out)
	}
	if _, err := planexIn(t, "tenants", "get", "acme", addr); err == nil || !strings.Contains(err.Error(), "no such tenant") {
		t.Errorf("tenants get after delete: %v", err)
	}
	if out := run("tenants", "list"); strings.Contains(out, "acme") {
		t.Errorf("tenants list after delete:\n%s", out)
	}
}
