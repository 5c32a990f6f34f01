package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/mcpserver"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/redact"
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

// The values auditPlanRun's export must mask. Each holds a character no
// hash, salt or timestamp can (a bare "4711" once matched a timestamp's
// nanoseconds and failed the check by chance).
const (
	auditPIN   = "PIN 4711"
	auditTo    = "cfo@example.com"
	auditToken = "ghp_0123456789abcdefghijABCDEFGHIJ012345"
	auditSQL   = "SELECT region, SUM(amount) FROM orders GROUP BY region"
)

// auditPlanRun stores a finished run whose plan holds a query and a mail
// (to and body sensitive), whose goal holds a credential, as the supervisor
// appends them (version 2 events, one message each), with both tools in
// the catalog.
func auditPlanRun(t *testing.T, res *bus.Resources, id string) {
	t.Helper()
	for _, spec := range []*planexv1.ToolSpec{
		{Name: "sql.query", Pool: "sql"},
		{Name: "mail.send", Pool: "mail", SensitiveFields: []string{"to", "body"}},
	} {
		b, err := proto.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := res.Tools.Put(t.Context(), bus.ToolKey(spec.GetName(), "r1"), b); err != nil {
			t.Fatal(err)
		}
	}
	l, err := runlog.New(t.Context(), res, natstest.Logger(t), runlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := func(m map[string]any) *structpb.Struct { x, _ := structpb.NewStruct(m); return x }
	v := func(a any) *structpb.Value { x, _ := structpb.NewValue(a); return x }
	mail := map[string]any{"to": auditTo, "subject": "figures", "body": auditPIN}
	st := &runlog.State{}
	for _, ev := range []*planexv1.RunEvent{
		{RunId: id, Payload: &planexv1.RunEvent_Created{Created: &planexv1.RunCreated{
			Goal: "mail the figures (token=" + auditToken + ")", Budget: &planexv1.Budget{MaxSteps: 5},
			Inputs: s(map[string]any{"to": auditTo, "quarter": 3}),
		}}},
		{Payload: &planexv1.RunEvent_PlanRevised{PlanRevised: &planexv1.PlanRevised{Plan: &planexv1.Plan{Revision: 1, Steps: []*planexv1.Step{
			{Id: "q", Tool: "sql.query", Args: s(map[string]any{"sql": auditSQL, "limit": 10})},
			{Id: "send", Tool: "mail.send", Args: s(mail), DependsOn: []string{"q"}},
		}}}}},
		{Payload: &planexv1.RunEvent_StepDispatched{StepDispatched: &planexv1.StepDispatched{StepId: "q", Attempt: 1, PlanRevision: 1, Tool: "sql.query", ResolvedArgs: s(map[string]any{"sql": auditSQL, "limit": 10})}}},
		{Payload: &planexv1.RunEvent_StepSucceeded{StepSucceeded: &planexv1.StepSucceeded{StepId: "q", Attempt: 1, Output: v(map[string]any{"rows": []any{map[string]any{"region": "EU", "sum": 12.5}}, "row_count": 1})}}},
		{Payload: &planexv1.RunEvent_StepDispatched{StepDispatched: &planexv1.StepDispatched{StepId: "send", Attempt: 1, PlanRevision: 1, Tool: "mail.send", ResolvedArgs: s(mail)}}},
		{Payload: &planexv1.RunEvent_StepSucceeded{StepSucceeded: &planexv1.StepSucceeded{StepId: "send", Attempt: 1, Output: v(map[string]any{"id": "m-1", "to": auditTo})}}},
		{Payload: &planexv1.RunEvent_Finished{Finished: &planexv1.RunFinished{Status: planexv1.RunStatus_RUN_STATUS_SUCCEEDED, Result: v(map[string]any{"send": map[string]any{"to": auditTo}})}}},
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

// exportLines exports run id with `planex runs export` (redacted, the
// default) and returns the file's lines.
func exportLines(t *testing.T, srv *natstest.Server, id string) []string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "run.jsonl")
	if _, err := planexIn(t, "runs", "export", id, "--nats-url", srv.URL(), "-o", file); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{auditPIN, auditTo, auditToken} {
		if strings.Contains(string(data), secret) {
			t.Fatalf("the export shows %q:\n%s", secret, data)
		}
	}
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

// verifyLines writes lines to a file and runs `planex audit verify` on it.
func verifyLines(t *testing.T, lines []string) (string, error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "run.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return planexIn(t, "audit", "verify", file)
}

// TestAuditVerifyRefusesEveryTamperedField changes, in a default
// (redacted) export, every value each event shows — one at a time, in the
// file's JSON, as someone editing the archive would — and requires
// `audit verify` to exit 3 naming that event. Masked values (shown as a
// redaction mark) are committed to, not shown, and are left out.
func TestAuditVerifyRefusesEveryTamperedField(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	auditPlanRun(t, res, "RUNTAMPER")
	lines := exportLines(t, srv, "RUNTAMPER")
	out, err := verifyLines(t, lines)
	if err != nil || !strings.Contains(out, "run RUNTAMPER: 7 events verified (finished)") || !strings.Contains(out, "every field shown verified") {
		t.Fatalf("verify the untouched export: %v\n%s", err, out)
	}

	// The case of the report: the planned SQL changed in a plan that also
	// holds a masked field.
	t.Run("planned SQL", func(t *testing.T) {
		tampered := slices.Clone(lines)
		if !strings.Contains(tampered[1], auditSQL) || !strings.Contains(tampered[1], redact.Mask) {
			t.Fatalf("event 2 is not a plan with the query and a masked field: %s", tampered[1])
		}
		tampered[1] = strings.Replace(tampered[1], auditSQL, "DELETE FROM orders", 1)
		_, err := verifyLines(t, tampered)
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != exitFailed || !strings.Contains(err.Error(), "run RUNTAMPER: event 2: hash does not match its content") {
			t.Fatalf("verify with the SQL changed: %v", err)
		}
	})

	if changed := requireEveryChangeRefused(t, lines); changed < 60 {
		t.Fatalf("only %d values changed", changed)
	}
}

// requireEveryChangeRefused changes every value each event of an export
// shows (not the masked ones), one at a time, and requires `audit verify`
// to exit 3 naming that event. It returns how many values it changed.
func requireEveryChangeRefused(t *testing.T, lines []string) int {
	t.Helper()
	changed := 0
	for i, line := range lines {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &obj); err != nil {
			t.Fatal(err)
		}
		for _, path := range jsonLeaves(t, obj["event"]) {
			tampered := slices.Clone(lines)
			tampered[i] = tamperLine(t, obj, path)
			_, err := verifyLines(t, tampered)
			var ee *exitError
			want := fmt.Sprintf("event %d", i+1)
			if !errors.As(err, &ee) || ee.code != exitFailed || !strings.Contains(err.Error(), want) {
				t.Errorf("event %d, %v changed: %v, want exit %d naming %s", i+1, path, err, exitFailed, want)
			}
			changed++
		}
	}
	t.Logf("%d shown values changed, each refused", changed)
	return changed
}

// TestAuditVerifiesARealRunsRedactedExport runs a goal that mails (the
// e-mail tools declare their recipients and bodies sensitive) on the dev
// stack, exports its log redacted, verifies every event in full, and
// refuses every change of a value the export shows.
func TestAuditVerifiesARealRunsRedactedExport(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the dev stack; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	stack, client := startTestDevStack(ctx, t, parseDevFlags(t, "--data-dir="+filepath.Join(t.TempDir(), "data")), io.Discard)
	started, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: "Email the account team a summary of the top 5 customers by revenue in 2025"})
	if err != nil {
		t.Fatal(err)
	}
	id := started.GetRun().GetId()
	for {
		got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
		if err != nil {
			t.Fatal(err)
		}
		if run := got.GetRun(); mcpserver.RunEnded(run.GetStatus()) {
			if run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
				t.Fatalf("run %s: %v %q", id, run.GetStatus(), run.GetStopMessage())
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("run %s did not end: %v", id, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	file := filepath.Join(t.TempDir(), "run.jsonl")
	if out, err := planexIn(t, "runs", "export", id, "--nats-url", stack.NATSURL, "--nats-nkey-file", stack.Credentials.NATSSeedFiles["supervisor"], "-o", file); err != nil {
		t.Fatalf("runs export: %v\n%s", err, out)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	out, err := verifyLines(t, lines)
	if err != nil || !strings.Contains(out, fmt.Sprintf("run %s: %d events verified (finished)", id, len(lines))) || !strings.Contains(out, "every field shown verified") {
		t.Fatalf("verify the export: %v\n%s", err, out)
	}
	requireEveryChangeRefused(t, lines)
}

// TestAuditVerifyExportWithoutCommitmentsIsPartial reads an export as an
// older planex wrote it (redacted events without commitments): verify
// exits 3, "partially verified", naming those events.
func TestAuditVerifyExportWithoutCommitmentsIsPartial(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	auditPlanRun(t, res, "RUNOLD")
	lines := exportLines(t, srv, "RUNOLD")
	var unchecked []string
	for i, line := range lines {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &obj); err != nil {
			t.Fatal(err)
		}
		if string(obj["redacted"]) == "true" {
			delete(obj, "commitment")
			b, _ := json.Marshal(obj)
			lines[i] = string(b)
			unchecked = append(unchecked, fmt.Sprint(i+1))
		}
	}
	out, err := verifyLines(t, lines)
	var ee *exitError
	want := "run RUNOLD: partially verified: the content of events " + strings.Join(unchecked, ", ") + " was redacted without a commitment"
	if !errors.As(err, &ee) || ee.code != exitFailed || !strings.Contains(err.Error(), want) || !strings.Contains(out, "7 events partially verified") {
		t.Fatalf("verify an export without commitments: %v\n%s\nwant %q", err, out, want)
	}
}

// jsonLeaves lists the paths of the scalars of an event's JSON, except
// those showing a redaction mark (masked).
func jsonLeaves(t *testing.T, raw json.RawMessage) [][]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var ev any
	if err := dec.Decode(&ev); err != nil {
		t.Fatal(err)
	}
	var out [][]any
	var walk func(v any, path []any)
	walk = func(v any, path []any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(e, append(slices.Clone(path), k))
			}
		case []any:
			for i, e := range x {
				walk(e, append(slices.Clone(path), i))
			}
		case string:
			if !strings.Contains(x, redact.Mask) {
				out = append(out, path)
			}
		default:
			out = append(out, path)
		}
	}
	walk(ev, nil)
	return out
}

// tamperLine returns the export line obj with the event's scalar at path
// changed, in a way that still reads as the event (protojson): a string
// gains a letter, or changes a digit or letter (timestamps, 64-bit
// integers, base64 hashes), or becomes another enum number; a number grows
// by one; a bool flips.
func tamperLine(t *testing.T, obj map[string]json.RawMessage, path []any) string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(obj["event"]))
	dec.UseNumber()
	var ev any
	if err := dec.Decode(&ev); err != nil {
		t.Fatal(err)
	}
	get := func(root any) any {
		cur := root
		for _, p := range path {
			switch k := p.(type) {
			case string:
				cur = cur.(map[string]any)[k]
			case int:
				cur = cur.([]any)[k]
			}
		}
		return cur
	}
	set := func(root any, v any) {
		cur := root
		for i, p := range path {
			last := i == len(path)-1
			switch k := p.(type) {
			case string:
				if last {
					cur.(map[string]any)[k] = v
				} else {
					cur = cur.(map[string]any)[k]
				}
			case int:
				if last {
					cur.([]any)[k] = v
				} else {
					cur = cur.([]any)[k]
				}
			}
		}
	}
	var candidates []any
	switch x := get(ev).(type) {
	case string:
		candidates = append(candidates, x+"x")
		if i := strings.IndexAny(x, "0123456789"); i >= 0 {
			candidates = append(candidates, x[:i]+string('0'+(x[i]-'0'+1)%10)+x[i+1:])
		}
		if i := strings.IndexFunc(x, func(r rune) bool { return r >= 'a' && r <= 'y' || r >= 'A' && r <= 'Y' }); i >= 0 {
			candidates = append(candidates, x[:i]+string(x[i]+1)+x[i+1:])
		}
		candidates = append(candidates, json.Number("1"), json.Number("2"))
	case json.Number:
		f, _ := x.Float64()
		candidates = append(candidates, json.Number(fmt.Sprint(f+1)))
	case bool:
		candidates = append(candidates, !x)
	default:
		t.Fatalf("unexpected value at %v: %T", path, x)
	}
	orig := &planexv1.RunEvent{}
	if err := protojson.Unmarshal(obj["event"], orig); err != nil {
		t.Fatal(err)
	}
	for _, c := range candidates {
		var cp any
		d := json.NewDecoder(bytes.NewReader(obj["event"]))
		d.UseNumber()
		if err := d.Decode(&cp); err != nil {
			t.Fatal(err)
		}
		set(cp, c)
		evJSON, err := json.Marshal(cp)
		if err != nil {
			t.Fatal(err)
		}
		changed := &planexv1.RunEvent{}
		if protojson.Unmarshal(evJSON, changed) != nil || proto.Equal(changed, orig) {
			continue // not an event any more, or the same one
		}
		line := maps.Clone(obj)
		line["event"] = evJSON
		b, err := json.Marshal(line)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	t.Fatalf("no change of %v reads as an event", path)
	return ""
}
