package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/redact"
)

// Outputs and errors are masked for secrets by default (docs/security.md,
// "Secrets in tool outputs"): every value matching redact.SecretPatterns
// (credentials, keys, tokens, card numbers; not e-mail addresses) is
// replaced before the result is encoded, stored in planex-outputs or
// planex-effects, hashed or published, so that the stored output, its
// SHA-256 and what the engine records agree. A tool whose purpose is to
// return such values sets ToolSpec.output_secrets_allowed.

// secrets masks what looks like a credential or a card number.
var secrets = redact.New(redact.SecretPatterns()...)

// secretsAllowed reports whether the tool named may return secrets
// unmasked: only a tool of this pool that declares it; an unknown tool
// is masked (fail closed).
func (r *Runner) secretsAllowed(tool string) bool {
	t, ok := r.tools.Load().byName[tool]
	return ok && t.Spec().GetOutputSecretsAllowed()
}

// maskOutput returns a tool's output with its secrets masked, as the
// JSON it encodes to; out itself when the tool may return secrets or
// does not encode (the encoder reports that). A Truncatable output stays
// Truncatable, each cut masked.
func (r *Runner) maskOutput(ctx context.Context, tool string, out any) any {
	if r.secretsAllowed(tool) {
		return out
	}
	if t, ok := out.(Truncatable); ok {
		var once sync.Once
		note := func() { once.Do(func() { r.logMasked(ctx, tool, "output") }) }
		return maskedTruncatable{maskedJSON: maskedJSON{v: t, note: note}, t: t}
	}
	data, changed, err := maskJSON(out)
	if err != nil {
		return out
	}
	if changed {
		r.logMasked(ctx, tool, "output")
	}
	return json.RawMessage(data)
}

// maskStepError masks the secrets in a step error's message in place,
// unless the tool may return secrets.
func (r *Runner) maskStepError(tool string, e *planexv1.StepError) {
	if e == nil || r.secretsAllowed(tool) {
		return
	}
	e.Message = secrets.String(e.GetMessage())
}

// logMasked notes that a step's output held values masked as secrets
// (which values is never said).
func (r *Runner) logMasked(ctx context.Context, tool, what string) {
	r.logger.InfoContext(ctx, "masked secret-like values in step "+what+" (set output_secrets_allowed on the tool to keep them)", "tool", tool)
}

// maskJSON encodes v and masks the secrets in it, reading each value next
// to its key (redact.Leaves); numbers keep their exact text. changed
// reports whether anything was masked.
func maskJSON(v any) (data []byte, changed bool, err error) {
	data, err = json.Marshal(v)
	if err != nil {
		return nil, false, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return nil, false, err
	}
	masked, changed := secrets.Leaves(generic)
	if !changed {
		return data, false, nil
	}
	data, err = json.Marshal(masked)
	return data, true, err
}

// maskedJSON encodes v with its secrets masked; note is called (once per
// output) when something was.
type maskedJSON struct {
	v    any
	note func()
}

// MarshalJSON implements json.Marshaler.
func (m maskedJSON) MarshalJSON() ([]byte, error) {
	data, changed, err := maskJSON(m.v)
	if changed {
		m.note()
	}
	return data, err
}

// maskedTruncatable is a Truncatable output whose encoding, whole or cut,
// is masked.
type maskedTruncatable struct {
	maskedJSON
	t Truncatable
}

// Len implements Truncatable.
func (m maskedTruncatable) Len() int { return m.t.Len() }

// Cut implements Truncatable.
func (m maskedTruncatable) Cut(n int) any { return maskedJSON{v: m.t.Cut(n), note: m.note} }
