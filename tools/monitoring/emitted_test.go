package monitoring

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/freeport"
)

// devStack is a `planex dev` process of the test.
type devStack struct {
	bin, env         []string
	addr, metricsURL string
	natsURL, dataDir string
}

// planexBinary builds planex from the repository root, or uses
// $PLANEX_BINARY (what CI built already).
func planexBinary(t *testing.T) string {
	if p := os.Getenv("PLANEX_BINARY"); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	out := filepath.Join(t.TempDir(), "planex")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/planex")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/planex: %v\n%s", err, b)
	}
	return out
}

// startDev starts `planex dev` with /metrics on a free port and waits
// until it says it is running.
func startDev(t *testing.T, ctx context.Context) *devStack {
	bin := planexBinary(t)
	tmp := t.TempDir()
	s := &devStack{bin: []string{bin}, env: append(os.Environ(), "XDG_CACHE_HOME="+filepath.Join(tmp, "cache")),
		addr: freeport.Addr(t), dataDir: filepath.Join(tmp, "data")}
	metrics := freeport.Addr(t)
	s.metricsURL = "http://" + metrics + "/metrics"
	cmd := exec.Command(bin, "dev", "--data-dir", s.dataDir, "--grpc-addr", s.addr, "--mcp-addr", "", "--metrics-addr", metrics)
	cmd.Env = s.env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(tmp, "dev.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("planex dev stderr (tail):\n%s", tail(string(b), 4000))
		}
	})
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		running := false
		for sc.Scan() {
			line := sc.Text()
			if strings.Contains(line, "planex dev is running") {
				running = true
			}
			if f := strings.Fields(line); running && len(f) == 2 && f[0] == "nats" {
				s.natsURL = f[1]
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case <-ready:
	case err := <-exited:
		t.Fatalf("planex dev exited: %v", err)
	case <-ctx.Done():
		t.Fatal("planex dev did not start in time")
	}
	return s
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// planex runs a client command against the stack; it returns stdout and
// the exit code.
func (s *devStack) planex(t *testing.T, ctx context.Context, args ...string) (string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, s.bin[0], append(args, "--addr", s.addr)...)
	cmd.Env = s.env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	case err != nil:
		t.Fatalf("planex %v: %v\n%s", args, err, stderr.String())
	}
	return string(out), 0
}

// run starts goal and returns its run id after checking the exit code.
func (s *devStack) run(t *testing.T, ctx context.Context, goal string, wantExit int) string {
	t.Helper()
	out, code := s.planex(t, ctx, "run", "--json", goal)
	if code != wantExit {
		t.Fatalf("planex run %q: exit %d, want %d\n%s", goal, code, wantExit, out)
	}
	var run struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(out), &run); err != nil || run.ID == "" {
		t.Fatalf("planex run --json %q: %v\n%s", goal, err, out)
	}
	return run.ID
}

func (s *devStack) scrape(ctx context.Context) (Emitted, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.metricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", s.metricsURL, resp.Status)
	}
	return ParseScrape(resp.Body)
}

// forgeStep publishes an unsigned step request with the supervisor's dev
// NATS credentials, as an attacker on the bus would: the sql pool must
// refuse it (planex_executor_steps_refused_total{reason="unsigned"}).
func (s *devStack) forgeStep(t *testing.T, ctx context.Context) {
	nc, err := nats.Connect(s.natsURL, nats.Name("tools/monitoring forged step"),
		mustNkey(t, filepath.Join(s.dataDir, "credentials", "nats", "supervisor.nk")))
	if err != nil {
		t.Fatalf("connect to the dev NATS: %v", err)
	}
	defer nc.Close()
	args, _ := structpb.NewStruct(map[string]any{"sql": "SELECT 1"})
	data, err := proto.Marshal(&planexv1.StepRequest{RunId: "forged", StepId: "s1", Attempt: 1, PlanRevision: 1,
		Tool: "sql.query", Args: args, Deadline: timestamppb.New(time.Now().Add(time.Minute))})
	if err != nil {
		t.Fatal(err)
	}
	subj, err := bus.StepSubject("sql.query")
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(subj)
	msg.Data = data
	msg.Header.Set(nats.MsgIdHdr, "forged-"+strconv.FormatInt(time.Now().UnixNano(), 10))
	// A core publish: the stream takes it, and the supervisor's NATS
	// user may not receive the JetStream acknowledgement (its inboxes
	// have their own prefix).
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatalf("publish the forged step: %v", err)
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatalf("publish the forged step: %v", err)
	}
}

func mustNkey(t *testing.T, seedFile string) nats.Option {
	o, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatalf("dev NATS credentials: %v", err)
	}
	return o
}

var runIDRE = regexp.MustCompile(`^[0-9A-Z]{26}$`)

// dropMessage publishes an undecodable step result to the engine inbox
// with the supervisor's dev NATS credentials: the engine drops it
// (planex_engine_messages_dropped_total{kind="result",reason="undecodable"}).
func (s *devStack) dropMessage(t *testing.T, ctx context.Context) {
	nc, err := nats.Connect(s.natsURL, nats.Name("tools/monitoring undecodable result"),
		mustNkey(t, filepath.Join(s.dataDir, "credentials", "nats", "supervisor.nk")))
	if err != nil {
		t.Fatalf("connect to the dev NATS: %v", err)
	}
	defer nc.Close()
	msg := nats.NewMsg(bus.EngineSubject("01MONITORINGGARBAGE0000000", bus.KindResult))
	msg.Data = []byte("\xff\xff not a StepResult")
	msg.Header.Set(nats.MsgIdHdr, "garbage-"+strconv.FormatInt(time.Now().UnixNano(), 10))
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatalf("publish the undecodable result: %v", err)
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatalf("publish the undecodable result: %v", err)
	}
}

// workload makes the metrics the rules and dashboards read appear: runs
// that succeed, fail on data, fail to plan, wait at a gate that is
// approved, rejected back to the planner or rejected with --stop, a
// forged step request the executors refuse and an undecodable engine
// message the engine drops.
func workload(t *testing.T, ctx context.Context, s *devStack) {
	s.run(t, ctx, "How many open support tickets does Acme Corp have?", 0)
	s.run(t, ctx, "How many open support tickets does Acme Inc have?", 3) // NO_DATA: expectation failed, replanned
	s.run(t, ctx, "Tell me a joke about llamas", 3)                       // PLANNER_ERROR: no playbook matches
	for _, decide := range [][]string{{"approve"}, {"reject", "--comment", "not now"}, {"reject", "--stop", "--comment", "no"}} {
		id := s.run(t, ctx, "Close support ticket 400", 4) // waits at the sql.exec gate
		if !runIDRE.MatchString(id) {
			t.Fatalf("run id %q", id)
		}
		if out, code := s.planex(t, ctx, append([]string{"runs", decide[0], id}, decide[1:]...)...); code != 0 {
			t.Fatalf("planex runs %s %s: exit %d\n%s", decide[0], id, code, out)
		}
	}
	s.forgeStep(t, ctx)
	s.dropMessage(t, ctx)
}

// TestEmittedMetrics runs planex dev with a workload, scrapes its
// /metrics and checks that every metric every rule and panel names is
// emitted (with the labels the selectors match on), recorded by a rule,
// or a documented external, event-only or pending metric.
func TestEmittedMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs planex dev; skipped with -short")
	}
	groups, err := LoadRules(filepath.Join(root, RulesSource))
	if err != nil {
		t.Fatal(err)
	}
	qs := Queries(groups)
	recorded := Recorded(groups)

	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	s := startDev(t, ctx)
	workload(t, ctx, s)

	// The metrics the queries need that planex must show.
	need := map[string]bool{}
	for _, q := range qs {
		sels, err := Selectors(q.Expr)
		if err != nil {
			t.Fatalf("%s: %v", q.Where, err)
		}
		for _, sel := range sels {
			_, ext := External[sel.Metric]
			_, ev := EventOnly[sel.Metric]
			_, pend := Pending[sel.Metric]
			if !recorded[sel.Metric] && !ext && !ev && !pend {
				need[sel.Metric] = true
			}
		}
	}
	// Observable metrics (consumer lag every 10 s) and the refusal come
	// asynchronously: scrape until every needed metric shows, or until
	// the deadline, then report what is missing.
	emitted := Emitted{}
	deadline := time.Now().Add(60 * time.Second)
	for {
		e, err := s.scrape(ctx)
		if err != nil {
			t.Fatal(err)
		}
		emitted.Merge(e)
		missing := 0
		for n := range need {
			if emitted[n] == nil {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	if emitted["planex_executor_steps_refused_total"] == nil {
		t.Error("the forged step request was not refused (planex_executor_steps_refused_total absent)")
	}
	for _, n := range []string{"planex_run_first_step_duration_seconds_bucket", "planex_gate_wait_duration_seconds_bucket", "planex_gates_decided_total", "planex_engine_messages_dropped_total"} {
		if emitted[n] == nil {
			t.Errorf("%s: not emitted by the workload", n)
		}
	}
	for _, err := range Check(qs, emitted, recorded) {
		t.Error(err)
	}
	for n, src := range Pending {
		if emitted[n] != nil {
			t.Errorf("pending metric %s (%s) is emitted now: remove it from Pending in external.go", n, src.From)
		}
	}
}

// TestEventOnlyMetricsDeclared checks that the code still declares the
// metrics the dev workload cannot show, by their OpenTelemetry names.
func TestEventOnlyMetricsDeclared(t *testing.T) {
	src := map[string]bool{}
	for _, dir := range []string{"services", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range regexp.MustCompile(`"(planex\.[a-z_.]+)"`).FindAllStringSubmatch(string(b), -1) {
				src[m[1]] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for n, s := range EventOnly {
		otelName := strings.ReplaceAll(strings.TrimSuffix(n, "_total"), "_", ".")
		// planex_runs_corrupt_total → planex.runs.corrupt
		if !src[otelName] {
			t.Errorf("event-only metric %s: no instrument %q in services/ or internal/ (%s)", n, otelName, s.From)
		}
	}
	for n := range Pending {
		otelName := strings.ReplaceAll(strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_total"), "_seconds"), "_", ".")
		if src[otelName] {
			t.Logf("pending metric %s: an instrument %q exists now; TestEmittedMetrics checks whether it is emitted", n, otelName)
		}
	}
}
