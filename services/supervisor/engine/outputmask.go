package engine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/redact"
)

// Step results are masked for secrets before the engine records them
// (docs/security.md, "Secrets in tool outputs"). Executors of this version
// mask their outputs and errors already; the engine masks again so that an
// executor of an older version, or a compromised one, cannot put a
// credential into the run log, and from there into the API's answers, the
// console, MCP, exports, the planner's prompts or a mail built from the
// output. Only a tool the catalog records with output_secrets_allowed is
// exempt.

// secrets masks what looks like a credential or a card number (not
// e-mail addresses).
var secrets = redact.New(redact.SecretPatterns()...)

// secretsAllowed reports whether the catalog records tool with
// output_secrets_allowed. An unreadable catalog or an unknown tool masks
// (fail closed).
func (e *Engine) secretsAllowed(ctx context.Context, tool string) bool {
	if e.tools == nil {
		return false
	}
	cat, err := e.tools.Get(ctx)
	if err != nil {
		return false
	}
	spec, ok := cat.Tool(tool)
	return ok && spec.GetOutputSecretsAllowed()
}

// maskResult returns res with the secrets in its output (inline, or in
// the object store: rewritten there, with a new reference) and in its
// error message masked; res itself when nothing was masked (it is never
// modified). tool is the step's tool as the engine dispatched it.
func (e *Engine) maskResult(ctx context.Context, runID, tool string, res *planexv1.StepResult) (*planexv1.StepResult, error) {
	if e.secretsAllowed(ctx, tool) {
		return res, nil
	}
	out := res
	own := func() {
		if out == res {
			out = proto.CloneOf(res)
		}
	}
	if v, changed := secrets.LeavesValue(res.GetOutput()); changed {
		own()
		out.Output = v
	}
	if msg := res.GetError().GetMessage(); msg != "" {
		if m := secrets.String(msg); m != msg {
			own()
			out.Error.Message = m
		}
	}
	if ref := res.GetOutputRef(); ref != nil && e.online() {
		masked, err := e.maskStoredOutput(ctx, runID, res, ref)
		if err != nil {
			return nil, err
		}
		if masked != nil {
			own()
			out.OutputRef = masked
		}
	}
	if out != res {
		e.logger.WarnContext(ctx, "masked secret-like values the executor left in a step result (an executor older than this supervisor, or not masking)",
			"tool", tool, "executor_id", res.GetExecutorId())
	}
	return out, nil
}

// online reports whether the engine runs against NATS: a replay (an
// engine without a connection) judges recorded results again and must not
// read or rewrite the object store for it; the recorded reference is the
// masked one already.
func (e *Engine) online() bool {
	return e.res != nil && e.res.JS != nil && e.res.JS.Conn() != nil
}

// maskStoredOutput masks an output kept in the object store: when it
// holds secrets, the masked output is stored in the supervisor's output
// bucket under the attempt's name, the unmasked object is deleted (best
// effort: a failure is logged), and the new reference is returned; nil
// when nothing was masked.
func (e *Engine) maskStoredOutput(ctx context.Context, runID string, res *planexv1.StepResult, ref *planexv1.OutputRef) (*planexv1.OutputRef, error) {
	data, err := e.res.ReadOutput(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("%w: mask secrets: %w", errOutputs, err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: decode %s/%s to mask secrets: %w", errOutputs, ref.GetBucket(), ref.GetName(), err)
	}
	masked, changed := secrets.Leaves(v)
	if !changed {
		return nil, nil
	}
	if data, err = json.Marshal(masked); err != nil {
		return nil, fmt.Errorf("encode masked output of step %s: %w", res.GetStepId(), err)
	}
	bucket := e.res.OutputsBucket
	if bucket == "" {
		bucket = bus.ObjectOutputs
	}
	name := bus.OutputName(runID, res.GetStepId(), res.GetAttempt())
	if _, err := e.res.Outputs.PutBytes(ctx, name, data); err != nil {
		return nil, fmt.Errorf("%w: store masked output of step %s: %w", errOutputs, res.GetStepId(), err)
	}
	if ref.GetBucket() != bucket || ref.GetName() != name {
		if err := e.deleteOutput(ctx, ref); err != nil {
			e.logger.WarnContext(ctx, "delete the unmasked output an executor stored; it stays until its bucket's max age", "bucket", ref.GetBucket(), "object", ref.GetName(), "err", err)
		}
	}
	sum := sha256.Sum256(data)
	return &planexv1.OutputRef{Bucket: bucket, Name: name, Size: int64(len(data)), Sha256: hex.EncodeToString(sum[:])}, nil
}

// deleteOutput deletes the object ref names.
func (e *Engine) deleteOutput(ctx context.Context, ref *planexv1.OutputRef) error {
	store, err := e.res.OutputStore(ctx, ref.GetBucket())
	if err != nil {
		return err
	}
	return store.Delete(ctx, ref.GetName())
}
