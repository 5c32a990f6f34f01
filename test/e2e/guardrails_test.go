package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/freeport"
)

// TestGatesCLI drives gates from the CLI on planex dev (with a policy
// giving sql.exec gates an SLA): a run waiting at the sql.exec gate is
// listed by runs list --waiting and planex gates,
// approved with runs approve --all; planex run --yes approves its own run's
// gate, recorded as such.
func TestGatesCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	dataDir := t.TempDir()
	addr := freeport.Addr(t)
	pol := filepath.Join(t.TempDir(), "sla.yaml")
	if err := os.WriteFile(pol, []byte("rules:\n  - name: exec-sla\n    when: step.tool == 'sql.exec'\n    action: require_approval\n    reason: changes the database\n    gate_timeout: 1h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startBG(t, nil, "dev", "--data-dir", dataDir, "--grpc-addr", addr, "--policy", pol)
	waitServing(t, dataDir, addr)

	out, errOut, code := cli(t, "run", "--addr", addr, "--json", "Close support ticket 38")
	var waiting planexv1.Run
	if code != 4 || protojson.Unmarshal([]byte(out), &waiting) != nil || waiting.GetStatus() != planexv1.RunStatus_RUN_STATUS_WAITING {
		t.Fatalf("close ticket: exit %d (want 4, waiting)\n%s\n%s", code, out, errOut)
	}
	id := waiting.GetId()
	if list, _, _ := cli(t, "runs", "list", "--waiting", "--addr", addr); !strings.Contains(list, id) {
		t.Fatalf("runs list --waiting does not show %s:\n%s", id, list)
	}
	gates, errOut, code := cli(t, "gates", "--addr", addr)
	if code != 0 || !strings.Contains(gates, id) || !strings.Contains(gates, "sql.exec") || !strings.Contains(gates, " step ") || !strings.Contains(gates, "→ escalate") {
		t.Fatalf("planex gates: exit %d\n%s\n%s", code, gates, errOut)
	}
	if _, errOut, code := cli(t, "runs", "approve", id, "--all", "--comment", "checked", "--addr", addr); code != 0 {
		t.Fatalf("runs approve --all: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := cli(t, "runs", "watch", id, "--addr", addr); code != 0 {
		t.Fatalf("runs watch after approval: exit %d\n%s", code, errOut)
	}
	if gates, _, _ := cli(t, "gates", "--run", id, "--addr", addr); strings.Contains(gates, id) {
		t.Fatalf("a decided gate is still listed:\n%s", gates)
	}

	out, errOut, code = cli(t, "run", "--addr", addr, "--json", "--yes", "Close support ticket 49")
	var done planexv1.Run
	if code != 0 || protojson.Unmarshal([]byte(out), &done) != nil || done.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("run --yes: exit %d\n%s\n%s", code, out, errOut)
	}
	if len(done.GetGates()) != 1 || done.GetGates()[0].GetDecidedVia() != "run --yes" || done.GetGates()[0].GetDecision() != planexv1.DecisionKind_DECISION_KIND_APPROVE {
		t.Fatalf("gates of the run --yes run: %v", done.GetGates())
	}
}
