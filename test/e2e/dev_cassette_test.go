package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/freeport"
)

// TestDevRecordsThenReplays records a run on `planex dev --record DIR`,
// changes one recorded tool result, and runs the goal again on a fresh
// `planex dev --replay DIR`: the answer carries the changed value (the
// tool answered from the cassette, not the demo database), and a goal the
// cassette lacks fails naming the request.
func TestDevRecordsThenReplays(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	const goal = "How many open support tickets does Acme Corp have?"
	cas := t.TempDir()
	run := func(addr, goal string) (*planexv1.Run, string, int) {
		t.Helper()
		out, errOut, code := cli(t, "run", "--addr", addr, "--json", goal)
		var r planexv1.Run
		if code == 0 {
			if err := protojson.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("run output: %v\n%s", err, out)
			}
		}
		return &r, out + errOut, code
	}

	dataDir, addr := t.TempDir(), freeport.Addr(t)
	rec := startBG(t, nil, "dev", "--data-dir", dataDir, "--grpc-addr", addr, "--record", cas)
	waitServing(t, dataDir, addr)
	recorded, out, code := run(addr, goal)
	if code != 0 || !strings.Contains(recorded.GetResult().GetStringValue(), "Acme Corp has") {
		t.Fatalf("recording: exit %d\n%s", code, out)
	}
	if err := rec.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rec.done:
	case <-time.After(30 * time.Second):
		t.Fatal("planex dev --record did not stop within 30s of SIGTERM")
	}
	if _, err := os.Stat(filepath.Join(cas, "tools.json")); err != nil {
		t.Fatalf("the recording has no tool catalog: %v\n%s", err, rec.Output())
	}

	// The count query's recorded answer says 99 open tickets.
	files, _ := filepath.Glob(filepath.Join(cas, "tool-sql.query-*.json"))
	changed := false
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var e map[string]any
		if err := json.Unmarshal(data, &e); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), "open_tickets") {
			continue
		}
		rows := e["response"].(map[string]any)["rows"].([]any)
		rows[0].([]any)[1] = 99
		data, _ = json.Marshal(e)
		if err := os.WriteFile(f, data, 0o644); err != nil {
			t.Fatal(err)
		}
		changed = true
	}
	if !changed {
		t.Fatalf("no recorded count query among %v", files)
	}

	dataDir, addr = t.TempDir(), freeport.Addr(t)
	startBG(t, nil, "dev", "--data-dir", dataDir, "--grpc-addr", addr, "--replay", cas)
	waitServing(t, dataDir, addr)
	replayed, out, code := run(addr, goal)
	if code != 0 || !strings.Contains(replayed.GetResult().GetStringValue(), "Acme Corp has 99 open support tickets") {
		t.Fatalf("replay: exit %d, want the recorded (changed) answer\n%s", code, out)
	}
	if _, out, code := run(addr, "How many open support tickets does Initech have?"); code == 0 || !strings.Contains(out, `no recorded answer for plan \"How many open support tickets does Initech have?\"`) && !strings.Contains(out, `no recorded answer for plan "How many open support tickets does Initech have?"`) {
		t.Fatalf("a goal the cassette lacks: exit %d\n%s", code, out)
	}
}
