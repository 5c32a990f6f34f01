package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/natstest"
)

const greeterPlaybook = `
name: greet
description: Greet someone with the out-of-tree greeter pool
examples:
  - Greet Ada
match:
  - '(?i)^greet (?P<name>[a-z]+)$'
params:
  name: {required: true}
steps:
  - id: hello
    tool: greeter.hello
    args: {name: "${{ params.name }}"}
answer: "steps.hello.output.greeting"
`

// TestOutOfTreeExecutorExample builds examples/greeter, a separate module
// depending on planex, and runs its tool in a plan.
func TestOutOfTreeExecutorExample(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test; skipped with -short")
	}
	work := t.TempDir()
	greeter := filepath.Join(work, "greeter")
	build := exec.Command("go", "build", "-o", greeter, ".")
	build.Dir = filepath.Join(repoRoot(t), "examples", "greeter")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build examples/greeter: %v\n%s", err, out)
	}
	books := filepath.Join(work, "playbooks")
	if err := os.Mkdir(books, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(books, "greet.yaml"), []byte(greeterPlaybook), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := natstest.Start(t)
	bin := planex(t)
	base := []string{"--grpc-addr=127.0.0.1:0", "--nats-url=" + ns.URL(), "--plaintext", "--auth-disabled", "--log-format=json"}
	g := startProc(t, "greeter", greeter, nil, "--nats-url="+ns.URL())
	g.waitLog(t, "executor consuming", 60*time.Second)
	pl := startProc(t, "planner", bin, nil, append([]string{"planner", "--playbooks=" + books}, base...)...)
	plannerAddr := pl.waitLog(t, "serving", 60*time.Second)["grpc_addr"].(string)
	sup := startProc(t, "supervisor", bin, nil, append([]string{"supervisor", "--planner-addr=" + plannerAddr}, base...)...)
	addr := sup.waitLog(t, "serving", 60*time.Second)["grpc_addr"].(string)

	run := runToEnd(t, addr, "Greet Ada")
	if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED || run.GetResult().GetStringValue() != "Hello, Ada!" {
		t.Fatalf("run %v %v %s: result %v", run.GetStatus(), run.GetStopReason(), run.GetStopMessage(), run.GetResult())
	}
}
