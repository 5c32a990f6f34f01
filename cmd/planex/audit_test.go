package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// planexIn runs the planex command in this process and returns its stdout
// and error.
func planexIn(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(t.Context())
	return out.String(), err
}

// auditRun stores a short run whose mail.send step carries a sensitive
// body, with the tool registered in the catalog.
func auditRun(t *testing.T, res *bus.Resources, id string) {
	t.Helper()
	spec, err := proto.Marshal(&planexv1.ToolSpec{Name: "mail.send", Pool: "mail", SensitiveFields: []string{"body"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := res.Tools.Put(t.Context(), "mail.send.r1", spec); err != nil {
		t.Fatal(err)
	}
	l, err := runlog.New(t.Context(), res, natstest.Logger(t), runlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	args, _ := structpb.NewStruct(map[string]any{"to": "ops@example.com", "body": "the secret figures"})
	// One message per event (the test below rewrites stream message 2).
	st := &runlog.State{}
	for _, ev := range []*planexv1.RunEvent{
		{RunId: id, Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{Goal: "mail the figures", Budget: &planexv1.Budget{MaxSteps: 5}}}},
		{Payload: &planexv1.RunEvent_StepDispatched{StepDispatched: &planexv1.StepDispatched{StepId: "send", Attempt: 1, PlanRevision: 1, Tool: "mail.send", ResolvedArgs: args}}},
		{Payload: &planexv1.RunEvent_StepSucceeded{StepSucceeded: &planexv1.StepSucceeded{StepId: "send", Attempt: 1, Output: structpb.NewStringValue("sent")}}},
	} {
		tx := l.Begin(st)
		if err := tx.Emit(ev); err != nil {
			t.Fatal(err)
		}
		if st, err = l.Commit(t.Context(), tx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestAuditExportAndVerify(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	auditRun(t, res, "RUNAUDIT")
	file := filepath.Join(t.TempDir(), "run.jsonl")
	if _, err := planexIn(t, "runs", "export", "RUNAUDIT", "--nats-url", srv.URL(), "-o", file); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "secret figures") || !strings.Contains(string(data), "ops@example.com") || strings.Count(string(data), "\n") != 3 {
		t.Fatalf("export does not mask exactly the sensitive field:\n%s", data)
	}
	out, err := planexIn(t, "audit", "verify", file)
	if err != nil || !strings.Contains(out, "3 events verified") || !strings.Contains(out, "1 redacted events") {
		t.Fatalf("verify export: %v\n%s", err, out)
	}
	out, err = planexIn(t, "audit", "verify", "RUNAUDIT", "--nats-url", srv.URL())
	if err != nil || !strings.Contains(out, "3 events verified") || strings.Contains(out, "redacted") {
		t.Fatalf("verify stored: %v\n%s", err, out)
	}

	// Rewrite event 2 through the NATS API: delete it, publish a changed copy.
	ctx := t.Context()
	events, err := runlog.ReadStored(ctx, res.JS, "RUNAUDIT")
	if err != nil {
		t.Fatal(err)
	}
	stream, err := res.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteMsg(ctx, 2); err != nil { // RUNAUDIT is the only run: stream sequence = event sequence
		t.Fatal(err)
	}
	forged := proto.CloneOf(events[1])
	forged.GetStepDispatched().GetResolvedArgs().Fields["to"] = structpb.NewStringValue("attacker@example.net")
	b, _ := proto.Marshal(forged)
	if _, err := res.JS.Publish(ctx, bus.RunLogSubject("RUNAUDIT"), b); err != nil {
		t.Fatal(err)
	}
	_, err = planexIn(t, "audit", "verify", "RUNAUDIT", "--nats-url", srv.URL())
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitFailed || !strings.Contains(err.Error(), "run RUNAUDIT: hash chain broken at stream sequence 3, event 2: stored out of place") {
		t.Fatalf("verify after rewrite: %v", err)
	}
}

// TestAuditVerifyNamesACorruptEntry appends garbage to one of two stored
// runs: verify names that run's entry (run, event, stream sequence,
// reason) and exits 3, and the other run still verifies.
func TestAuditVerifyNamesACorruptEntry(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	auditRun(t, res, "RUNCORRUPT")
	auditRun(t, res, "RUNINTACT")
	ack, err := res.JS.Publish(t.Context(), bus.RunLogSubject("RUNCORRUPT"), []byte("\xff\xfe not a planex event"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = planexIn(t, "audit", "verify", "RUNCORRUPT", "--nats-url", srv.URL())
	var ee *exitError
	want := fmt.Sprintf("audit: run RUNCORRUPT: the entry at stream sequence %d, where event 4 belongs, is not a planex event: it does not decode", ack.Sequence)
	if !errors.As(err, &ee) || ee.code != exitFailed || !strings.Contains(err.Error(), want) {
		t.Fatalf("verify a corrupt run: %v, want exit %d with %q", err, exitFailed, want)
	}
	out, err := planexIn(t, "audit", "verify", "RUNINTACT", "--nats-url", srv.URL())
	if err != nil || !strings.Contains(out, "run RUNINTACT: 3 events verified") {
		t.Fatalf("verify the other run: %v\n%s", err, out)
	}
}
