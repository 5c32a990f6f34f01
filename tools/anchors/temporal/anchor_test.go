package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestAnchor starts a real dev server through the command's own code and
// runs a tiny measurement.
func TestAnchor(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to build the Temporal CLI (`go tool -n temporal`)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cfg, _, err := parseFlags([]string{
		"--chains", "3", "--reps", "1", "--steps-per-rep", "3", "--warmup-steps", "1",
		"--runs", "4", "--fan-out", "2", "--in-flight", "2", "--throughput-reps", "1",
	}, &stderr)
	if err != nil {
		t.Fatalf("parseFlags: %v", err)
	}
	cfg.Progress = t.Logf
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}

	if !res.Server.Started || res.Server.Version == "" || res.SDKVersion == "" {
		t.Errorf("server %+v, SDK %q: want a started server with a version, and an SDK version", res.Server, res.SDKVersion)
	}
	if len(res.Chains) != 1 {
		t.Fatalf("chains: %d results, want 1", len(res.Chains))
	}
	c := res.Chains[0]
	if c.Steps != 3 || c.WorkflowsPerRep != 1 || c.Activities != 3 {
		t.Errorf("chain: steps %d, workflows per rep %d, activities %d; want 3, 1, 3", c.Steps, c.WorkflowsPerRep, c.Activities)
	}
	for name, s := range map[string]Stat{"per step": c.PerStepMs, "e2e per step": c.E2EPerStepMs} {
		if len(s.Samples) != 1 || s.Min <= 0 || s.Median <= 0 || s.Max <= 0 {
			t.Errorf("chain %s: %+v, want one positive sample", name, s)
		}
	}
	// One activity per workflow task and free slots: every chain activity
	// is handed out eagerly.
	if c.EagerActivities == nil || *c.EagerActivities != c.Activities {
		t.Errorf("chain: eager activities %v, want %d", c.EagerActivities, c.Activities)
	}

	tr := res.Throughput
	if tr == nil {
		t.Fatal("no throughput result")
	}
	if tr.Runs != 4 || tr.ActivitiesPerRun != 3 || tr.Activities != 12 {
		t.Errorf("throughput: runs %d, activities per run %d, activities %d; want 4, 3, 12", tr.Runs, tr.ActivitiesPerRun, tr.Activities)
	}
	if tr.ActivitiesPerSec.Min <= 0 || tr.WorkflowsPerSec.Min <= 0 {
		t.Errorf("throughput: %+v activities/s, %+v workflows/s; want positive", tr.ActivitiesPerSec, tr.WorkflowsPerSec)
	}
	if tr.EagerActivities == nil || *tr.EagerActivities < 1 || *tr.EagerActivities > tr.Activities {
		t.Errorf("throughput: eager activities %v, want 1 to %d", tr.EagerActivities, tr.Activities)
	}

	var out bytes.Buffer
	if err := res.WriteText(&out); err != nil {
		t.Fatalf("WriteText: %v", err)
	}
	for _, want := range []string{"temporal chain 3: per step", "temporal throughput: 4 workflows × 3 activities", "system.enableActivityEagerExecution=true"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, out.String())
		}
	}
	t.Logf("\n%s", out.String())
}

// TestFlags checks that bad flags are errors naming the flag, not panics.
func TestFlags(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--chains", "10,x"}, "-chains"},
		{[]string{"--chains", "0"}, "--chains 0"},
		{[]string{"--reps", "0"}, "--reps 0"},
		{[]string{"--steps-per-rep", "-1"}, "--steps-per-rep -1"},
		{[]string{"--fan-out", "0"}, "--fan-out 0"},
		{[]string{"--in-flight", "0"}, "--in-flight 0"},
		{[]string{"--throughput-reps", "0"}, "--throughput-reps 0"},
		{[]string{"--eager-per-task", "0"}, "--eager-per-task 0"},
		{[]string{"--address", "127.0.0.1:7233", "--server-arg", "--db-filename=x"}, "--server-arg"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		_, _, err := parseFlags(tc.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	cfg, asJSON, err := parseFlags([]string{"--json", "--chains", "10,100", "--server-arg", "--db-filename", "--server-arg", "x.db"}, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("parseFlags: %v", err)
	}
	if !asJSON || len(cfg.Chains) != 2 || cfg.Chains[1] != 100 || len(cfg.ServerArgs) != 2 || cfg.ModuleDir != wd {
		t.Errorf("parseFlags: %+v, json %v", cfg, asJSON)
	}
}

// TestDynamicConfigArgs finds --dynamic-config-value pairs among start-dev
// arguments in both spellings.
func TestDynamicConfigArgs(t *testing.T) {
	got := dynamicConfigArgs([]string{"--db-filename", "x.db", "--dynamic-config-value", "a=1", "--dynamic-config-value=b=2", "--dynamic-config-value"})
	if strings.Join(got, " ") != "a=1 b=2" {
		t.Errorf("dynamicConfigArgs = %q, want [a=1 b=2]", got)
	}
}

// TestSumCounter reads a counter with and without labels and ignores
// metrics sharing its prefix.
func TestSumCounter(t *testing.T) {
	text := `# TYPE activity_eager_execution counter
activity_eager_execution{namespace="default",taskqueue="q"} 7
activity_eager_execution{namespace="other"} 2
activity_eager_execution_denied{namespace="default"} 100
other_metric 5
`
	n, err := sumCounter(strings.NewReader(text), "activity_eager_execution")
	if err != nil || n != 9 {
		t.Errorf("sumCounter = %d, %v; want 9", n, err)
	}
}
