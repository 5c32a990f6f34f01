package runner_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/services/executor/runner"
)

// Fake credentials, assembled so that no scanner mistakes this file for a
// leak.
var (
	leakAWS    = "AKIA" + "IOSFODNN7EXAMPLE"
	leakOpenAI = "sk-" + "proj-ABCDEFGHIJKLMNOPQRST"
	leakStripe = "sk_" + "live_" + "4eC39HqLyjWDarjtT1zdp7dc"
	leakCard   = "4111 1111 1111 1111"
)

// secretRows is a Truncatable output whose rows hold secrets.
type secretRows struct {
	Rows []map[string]any `json:"rows"`
}

func (r secretRows) Len() int      { return len(r.Rows) }
func (r secretRows) Cut(n int) any { return secretRows{Rows: r.Rows[:n]} }

// leakingOutput is what the leaking tools return.
func leakingOutput() map[string]any {
	return map[string]any{
		"rows": []any{
			map[string]any{"k": leakAWS, "n": 1},
			map[string]any{"password": "hunter22", "note": "kept", "mail": "ops@example.com"},
			map[string]any{"card": leakCard},
		},
		"summary": "found key " + leakOpenAI + " in the table",
	}
}

// TestOutputsAndErrorsAreMaskedForSecrets: a tool returning credentials in
// its output or its error has them masked in the published result, the
// object store (with a matching SHA-256) and the effect record, unless the
// tool declares output_secrets_allowed.
func TestOutputsAndErrorsAreMaskedForSecrets(t *testing.T) {
	srv := natstest.Start(t)
	leak := func(context.Context, runner.Call) (any, error) { return leakingOutput(), nil }
	fail := func(context.Context, runner.Call) (any, error) {
		return nil, runner.Failed(errors.New("cast"), "invalid input syntax for type integer: %q", leakOpenAI)
	}
	many := make([]map[string]any, 60)
	for i := range many {
		many[i] = map[string]any{"id": i, "token": "tok_" + strings.Repeat("a1B2", 5), "key": leakStripe, "text": strings.Repeat("x", 40)}
	}
	allowed := newTool(t, "p.vault", planexv1.SideEffect_SIDE_EFFECT_READ, leak)
	allowed.spec.OutputSecretsAllowed = true
	allowedFail := newTool(t, "p.vaultfail", planexv1.SideEffect_SIDE_EFFECT_READ, fail)
	allowedFail.spec.OutputSecretsAllowed = true
	tools := []runner.Tool{
		newTool(t, "p.leak", planexv1.SideEffect_SIDE_EFFECT_READ, leak),
		newTool(t, "p.fail", planexv1.SideEffect_SIDE_EFFECT_READ, fail),
		newTool(t, "p.write", planexv1.SideEffect_SIDE_EFFECT_WRITE, leak),
		newTool(t, "p.rows", planexv1.SideEffect_SIDE_EFFECT_READ, func(context.Context, runner.Call) (any, error) {
			return secretRows{Rows: many}, nil
		}),
		allowed, allowedFail,
	}
	_, _ = startRunner(t, srv, runner.Options{Tools: tools, MaxOutputBytes: 4000, InlineOutputBytes: 1000})
	_, res := srv.Setup(t)
	eng := newEngine(t, res)
	ctx := ctxT(t, 20*time.Second)

	leaks := []string{leakAWS, leakOpenAI, leakStripe, "hunter22", "1111 1111"}
	noLeak := func(t *testing.T, where, text string) {
		t.Helper()
		for _, l := range leaks {
			if strings.Contains(text, l) {
				t.Fatalf("%s holds %q: %s", where, l, text)
			}
		}
	}
	publish := func(t *testing.T, id, tool string) *planexv1.StepResult {
		t.Helper()
		dispatch(t, res, step(t, "r1", id, tool, map[string]any{"n": 1}))
		got := eng.next(ctx)
		if got.GetStepId() != id {
			t.Fatalf("result of step %s, want %s", got.GetStepId(), id)
		}
		return got
	}

	t.Run("output", func(t *testing.T) {
		got := publish(t, "leak", "p.leak")
		if got.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
			t.Fatalf("result %v, want succeeded", got)
		}
		text := protojson.Format(got)
		noLeak(t, "published result", text)
		rows := got.GetOutput().GetStructValue().GetFields()["rows"].GetListValue().GetValues()
		second := rows[1].GetStructValue().GetFields()
		if rows[0].GetStructValue().GetFields()["k"].GetStringValue() != "[REDACTED]" || second["password"].GetStringValue() != "[REDACTED]" ||
			second["note"].GetStringValue() != "kept" || second["mail"].GetStringValue() != "ops@example.com" ||
			rows[2].GetStructValue().GetFields()["card"].GetStringValue() != "[CARD]" {
			t.Fatalf("output %v: want the key, password and card masked, the note and the address kept", got.GetOutput())
		}
		if !strings.Contains(got.GetOutput().GetStructValue().GetFields()["summary"].GetStringValue(), "found key [REDACTED] in the table") {
			t.Fatalf("summary %v, want only the key masked", got.GetOutput())
		}
	})
	t.Run("error", func(t *testing.T) {
		got := publish(t, "fail", "p.fail")
		if got.GetError().GetCode() != planexv1.ErrorCode_ERROR_CODE_TOOL_FAILED || !strings.Contains(got.GetError().GetMessage(), "invalid input syntax") {
			t.Fatalf("result %v, want TOOL_FAILED with the message", got)
		}
		noLeak(t, "published error", protojson.Format(got))
	})
	t.Run("effect record", func(t *testing.T) {
		got := publish(t, "write", "p.write")
		noLeak(t, "published result", protojson.Format(got))
		// The record is under the pool's key (or the attempt's key in the
		// previous layout).
		key := bus.EffectKey("r1", "write", 1)
		e, err := res.Effects.Get(ctx, bus.PoolEffectKey("p", key))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			e, err = res.Effects.Get(ctx, key)
		}
		if err != nil {
			t.Fatal(err)
		}
		var rec planexv1.StepResult
		if err := proto.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.GetStatus() != planexv1.StepResultStatus_STEP_RESULT_STATUS_SUCCEEDED {
			t.Fatalf("effect record %v, want the final result", &rec)
		}
		noLeak(t, "effect record", protojson.Format(&rec))
	})
	t.Run("stored output", func(t *testing.T) {
		got := publish(t, "rows", "p.rows")
		ref := got.GetOutputRef()
		if ref == nil || !got.GetTruncated() {
			t.Fatalf("result %v, want a truncated output in the object store", got)
		}
		data, err := res.Outputs.GetBytes(ctx, ref.GetName())
		if err != nil {
			t.Fatal(err)
		}
		noLeak(t, "stored output", string(data))
		if !strings.Contains(string(data), "[REDACTED]") {
			t.Fatalf("stored output has no mask: %.200s", data)
		}
		sum := sha256.Sum256(data)
		if hex.EncodeToString(sum[:]) != ref.GetSha256() || int64(len(data)) != ref.GetSize() || len(data) > 4000 {
			t.Fatalf("stored object (%d bytes) does not match its ref %v or exceeds the cap", len(data), ref)
		}
	})
	t.Run("opt-out keeps the output", func(t *testing.T) {
		got := publish(t, "vault", "p.vault")
		text := protojson.Format(got)
		for _, want := range []string{leakAWS, leakOpenAI, "hunter22", leakCard} {
			if !strings.Contains(text, want) {
				t.Fatalf("output of a tool with output_secrets_allowed lacks %q: %s", want, text)
			}
		}
	})
	t.Run("opt-out keeps the error", func(t *testing.T) {
		got := publish(t, "vaultfail", "p.vaultfail")
		if !strings.Contains(got.GetError().GetMessage(), leakOpenAI) {
			t.Fatalf("error of a tool with output_secrets_allowed %q, want it whole", got.GetError().GetMessage())
		}
	})
}

// TestMaskKeepsCleanOutputsExact: an output without secrets is published
// as the tool returned it, large integers included.
func TestMaskKeepsCleanOutputsExact(t *testing.T) {
	srv := natstest.Start(t)
	clean := map[string]any{"n": 9007199254740993, "text": "order 4111111111111111 shipped", "mail": "a@example.com", "list": []any{1.5, true, nil}}
	r, _ := startRunner(t, srv, runner.Options{Tools: []runner.Tool{
		newTool(t, "p.clean", planexv1.SideEffect_SIDE_EFFECT_READ, func(context.Context, runner.Call) (any, error) { return clean, nil }),
	}})
	got, err := r.Execute(ctxT(t, 10*time.Second), step(t, "r1", "a", "p.clean", map[string]any{"n": 1}))
	if err != nil {
		t.Fatal(err)
	}
	f := got.GetOutput().GetStructValue().GetFields()
	if f["text"].GetStringValue() != clean["text"] || f["mail"].GetStringValue() != "a@example.com" || f["n"].GetNumberValue() != 9007199254740993 ||
		len(f["list"].GetListValue().GetValues()) != 3 {
		t.Fatalf("clean output changed: %v", got.GetOutput())
	}
}
