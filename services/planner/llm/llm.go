// Package llm is the planner backend shared by the model providers: it
// renders the prompt, sends it through a [Provider] (OpenAI-compatible,
// Anthropic), parses the structured answer, validates the plan and, when the
// answer is invalid, sends the problems back in the same conversation once
// before giving up with [ErrInvalidAnswer]. It checks the run's remaining
// token budget before every call and caps the answer's length to it, detects
// refusals (answered as an escalation, not an error), and classifies
// provider failures into the sentinels the server turns into gRPC codes.
package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/plan"
	"github.com/planex-dev/planex/services/planner/prompt"
)

var (
	// ErrUnavailable: the provider could not be reached, or kept answering
	// 429 or 5xx after the retries. Trying again later may work.
	ErrUnavailable = errors.New("model provider unavailable")
	// ErrTimeout: one call took longer than the per-call timeout.
	ErrTimeout = errors.New("model call timed out")
	// ErrRejected: the provider refused the request itself (bad key, unknown
	// model, bad request); trying again will not help.
	ErrRejected = errors.New("model provider rejected the request")
	// ErrInvalidAnswer: the model's answer was still invalid after the
	// repair round.
	ErrInvalidAnswer = errors.New("model answer invalid after repair")
	// ErrBudget: the remaining token budget cannot cover the call.
	ErrBudget = errors.New("token budget exhausted")
	// ErrTruncated: the model's answer was cut off at the output token cap
	// again after a repair round that asked for a shorter one. Asking again
	// with the same cap will not help: the operator must raise it.
	ErrTruncated = errors.New("model answer cut off at the output token cap")
)

// ProviderError is a failed call to a model API.
type ProviderError struct {
	// Provider is "openai" or "anthropic".
	Provider string
	// StatusCode is the HTTP status, 0 when no response arrived.
	StatusCode int
	// Kind is ErrUnavailable, ErrTimeout or ErrRejected.
	Kind error
	// Detail is the provider's message or the transport error, cleaned
	// with CleanDetail (API key and credentials masked, one line, capped):
	// shown to clients in Public, so that a run's stop message says why
	// the provider refused.
	Detail string
	// RetryAfter is how long the provider asked to wait before retrying
	// (Retry-After, retry-after-ms), 0 when it did not say.
	RetryAfter time.Duration
}

// Error renders "openai: HTTP 503: model provider unavailable: detail".
func (e *ProviderError) Error() string {
	var b strings.Builder
	b.WriteString(e.Provider)
	if e.StatusCode != 0 {
		fmt.Fprintf(&b, ": HTTP %d", e.StatusCode)
	}
	b.WriteString(": ")
	b.WriteString(e.Kind.Error())
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

// Public is the message shown to a client (a run's stop message):
// provider, status, class and the provider's cleaned message.
func (e *ProviderError) Public() string {
	var b strings.Builder
	b.WriteString(e.Provider)
	if e.StatusCode != 0 {
		fmt.Fprintf(&b, ": HTTP %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	}
	fmt.Fprintf(&b, ": %v", e.Kind)
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

// Unwrap returns Kind.
func (e *ProviderError) Unwrap() error { return e.Kind }

// StatusError classifies an HTTP error answer: 408, 409, 429 and 5xx are
// ErrUnavailable (Retry retries them), anything else ErrRejected.
func StatusError(provider string, status int, detail string) *ProviderError {
	kind := ErrRejected
	if status == http.StatusRequestTimeout || status == http.StatusConflict || status == http.StatusTooManyRequests || status >= 500 {
		kind = ErrUnavailable
	}
	return &ProviderError{Provider: provider, StatusCode: status, Kind: kind, Detail: detail}
}

// CallError classifies a failed provider call for provider: the
// attempt's cancellation or deadline (returned as is, wrapped; Retry tells
// the caller's own from an attempt timeout), an HTTP error answer (status >
// 0, see [StatusError], with the provider's Retry-After from header), a
// per-call timeout, or a transport failure. apiKey is masked in the detail.
func CallError(ctx context.Context, provider string, err error, status int, detail string, header http.Header, apiKey string, timeout time.Duration) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", provider, ctx.Err())
	case status > 0:
		if detail == "" {
			detail = http.StatusText(status)
		}
		pe := StatusError(provider, status, CleanDetail(detail, apiKey))
		pe.RetryAfter = RetryAfter(header, time.Now())
		return pe
	case errors.Is(err, context.DeadlineExceeded):
		return &ProviderError{Provider: provider, Kind: ErrTimeout, Detail: fmt.Sprintf("no answer within %s", timeout)}
	default:
		return &ProviderError{Provider: provider, Kind: ErrUnavailable, Detail: CleanDetail(err.Error(), apiKey)}
	}
}

// ProviderConfig is what every provider is configured with. It holds the
// API key: never log it.
type ProviderConfig struct {
	// BaseURL of the provider's API.
	BaseURL string
	// APIKey authenticates the calls; may be empty for local servers.
	APIKey string
	// Model to ask.
	Model string
	// Temperature, or nil for the provider's default (reasoning models
	// accept no other).
	Temperature *float64
	// MaxRetries after the first attempt of a call (see Retry).
	MaxRetries int
	// CallTimeout bounds each attempt; 0 means no bound beyond the
	// caller's context and RetryBudget.
	CallTimeout time.Duration
	// RetryBudget bounds all attempts of a call and the waits between
	// them; 0 means no bound beyond the caller's deadline.
	RetryBudget time.Duration
	// MaxRetryAfter is the longest Retry-After honoured
	// (DefaultMaxRetryAfter when 0); a longer one ends the call at once.
	MaxRetryAfter time.Duration
	// HTTPClient, when set, replaces the SDK's default client.
	HTTPClient *http.Client
}

// SDKOptions maps c to an SDK's request options, built with the SDK's own
// option constructors, so that every provider applies the config alike.
// The SDK's own retries are off: Retry bounds attempts, waits and the
// total time the same way for every provider.
func SDKOptions[O any](c ProviderConfig, baseURL, apiKey func(string) O, retries func(int) O, client func(*http.Client) O) []O {
	opts := []O{baseURL(c.BaseURL), apiKey(c.APIKey), retries(0)}
	if c.HTTPClient != nil {
		opts = append(opts, client(c.HTTPClient))
	}
	return opts
}

// InvalidAnswerError lists what was still wrong with the repaired answer.
type InvalidAnswerError struct {
	// Backend that answered.
	Backend string
	// Problems of the last answer.
	Problems []string
}

// Error renders the problems.
func (e *InvalidAnswerError) Error() string {
	return fmt.Sprintf("%s: %v: %s", e.Backend, ErrInvalidAnswer, strings.Join(e.Problems, "; "))
}

// Unwrap returns ErrInvalidAnswer.
func (e *InvalidAnswerError) Unwrap() error { return ErrInvalidAnswer }

// TruncatedError ends a call whose answer was cut off at the output token
// cap (OpenAI finish_reason "length", Anthropic stop_reason "max_tokens")
// in both rounds, so that it could not be read. It is ErrTruncated, and
// also ErrBudget when the cap was lowered to what the remaining token
// budget allows (then the budget, not the flag, is what ran out).
type TruncatedError struct {
	// Backend that answered.
	Backend string
	// Cap is the output cap of the last call, in tokens.
	Cap int64
	// Configured is the backend's own cap (--planner-max-output-tokens).
	Configured int64
	// Problems of the last, cut answer (for logs; the parse errors of an
	// incomplete answer say little).
	Problems []string
}

// Error names the cap, the flag that sets it and its value.
func (e *TruncatedError) Error() string {
	if e.Cap < e.Configured {
		return fmt.Sprintf("%s: %v (%d tokens, all that the remaining token budget allows; --planner-max-output-tokens is %d) twice, the second time after asking for a shorter answer; give the run a larger token budget (max_tokens) or a simpler goal",
			e.Backend, ErrTruncated, e.Cap, e.Configured)
	}
	return fmt.Sprintf("%s: %v (%d tokens, --planner-max-output-tokens) twice, the second time after asking for a shorter answer; raise --planner-max-output-tokens (now %d) or simplify the goal",
		e.Backend, ErrTruncated, e.Cap, e.Configured)
}

// Unwrap returns ErrTruncated, and ErrBudget when the remaining budget,
// not the configured cap, bounded the answer.
func (e *TruncatedError) Unwrap() []error {
	if e.Cap < e.Configured {
		return []error{ErrTruncated, ErrBudget}
	}
	return []error{ErrTruncated}
}

// usageError carries the tokens spent before a call failed, so that they
// still count against the run's budget.
type usageError struct {
	err   error
	usage *planexv1.TokenUsage
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// UsageOf returns the tokens spent by a failed Plan call, or nil.
func UsageOf(err error) *planexv1.TokenUsage {
	var ue *usageError
	if errors.As(err, &ue) {
		return ue.usage
	}
	return nil
}

// Role says who wrote a turn.
type Role int

const (
	// RoleUser is planex speaking: the request, or a repair message.
	RoleUser Role = iota
	// RoleAssistant is the model's earlier answer.
	RoleAssistant
)

// Turn is one message after the system prompt.
type Turn struct {
	// Role of the writer.
	Role Role
	// Text of the message: the prompt, the repair message or the model's
	// raw JSON answer.
	Text string
	// CallID ties an answer given through a tool call to the repair message
	// that replies to it (Anthropic tool_use id); empty otherwise.
	CallID string
}

// Call is one request to a model.
type Call struct {
	// System prompt.
	System string
	// Turns of the conversation, starting with the user's request.
	Turns []Turn
	// Tools of the request; providers build the answer schema from them
	// with prompt.Schema.
	Tools []*planexv1.ToolSpec
	// MaxOutputTokens caps the answer.
	MaxOutputTokens int64
	// Answer, when set, replaces the plan answer schema built from Tools
	// (the critic's verdict uses it).
	Answer *AnswerSchema
}

// AnswerSchema is a structured answer other than a plan: its name (OpenAI
// json_schema name, Anthropic tool name), a description and a strict JSON
// Schema object (every property required, no additional properties).
type AnswerSchema struct {
	// Name of the schema or tool.
	Name string
	// Description shown to the model.
	Description string
	// Schema of the answer object.
	Schema map[string]any
}

// SchemaName is the answer's schema name: Answer.Name, or the plan's.
func (c Call) SchemaName() string {
	if c.Answer != nil {
		return c.Answer.Name
	}
	return prompt.SchemaName
}

// AnswerJSONSchema is the answer's schema: Answer.Schema, or the plan
// schema over Tools with arguments encoded as enc.
func (c Call) AnswerJSONSchema(enc prompt.ArgsEncoding) map[string]any {
	if c.Answer != nil {
		return c.Answer.Schema
	}
	return prompt.Schema(c.Tools, enc)
}

// Usage counts tokens.
type Usage struct {
	// Input (prompt) tokens, cached ones included.
	Input int64
	// Output (completion) tokens.
	Output int64
}

// Reply is a model's answer to a Call.
type Reply struct {
	// Text is the raw JSON answer.
	Text string
	// CallID is the provider's id of the answer's tool call, if any.
	CallID string
	// Refusal is set when the model refused to answer.
	Refusal string
	// Truncated is set when the answer hit the output token cap.
	Truncated bool
	// Model that answered, as the provider reports it.
	Model string
	// Usage of the call.
	Usage Usage
}

// Provider sends one call to a model API, with its own retries.
type Provider interface {
	Complete(ctx context.Context, call Call) (Reply, error)
}

// Validator checks a parsed plan against the request (catalog, limits);
// it returns a *plan.ValidationError or another error naming the problem.
type Validator func(req *planexv1.PlanRequest, p *planexv1.Plan) error

// Options configure a Backend.
type Options struct {
	// Name of the backend: "openai", "anthropic".
	Name string
	// Model the provider is configured with.
	Model string
	// MaxOutputTokens caps each answer; default 4096.
	MaxOutputTokens int64
	// Validate checks every parsed plan; required.
	Validate Validator
}

// Backend plans with a language model.
type Backend struct {
	p    Provider
	opts Options
}

// New returns a backend over p.
func New(p Provider, opts Options) (*Backend, error) {
	if p == nil || opts.Validate == nil || opts.Name == "" {
		return nil, errors.New("llm backend: provider, name and validator are required")
	}
	if opts.MaxOutputTokens <= 0 {
		opts.MaxOutputTokens = 4096
	}
	return &Backend{p: p, opts: opts}, nil
}

// Name returns the backend name.
func (b *Backend) Name() string { return b.opts.Name }

// Model returns the configured model.
func (b *Backend) Model() string { return b.opts.Model }

// Plan asks the model for the next plan revision.
func (b *Backend) Plan(ctx context.Context, req *planexv1.PlanRequest) (*planexv1.PlanResponse, error) {
	return b.PlanWithExample(ctx, req, nil)
}

// minOutputTokens is the smallest answer worth asking for.
const minOutputTokens = 256

// PlanWithExample is Plan with a plan that worked before for the same goal
// shown to the model as an example (example may be nil).
func (b *Backend) PlanWithExample(ctx context.Context, req *planexv1.PlanRequest, example *planexv1.Plan) (*planexv1.PlanResponse, error) {
	call := Call{
		System: prompt.System(),
		Turns:  []Turn{{Role: RoleUser, Text: prompt.User(req, example)}},
		Tools:  req.GetTools(),
	}
	return ask(ctx, b, call, req.GetConstraints().GetRemainingTokens(),
		func(reply Reply, model string, spent Usage) (*planexv1.PlanResponse, []string) {
			if reply.Refusal != "" {
				return b.finish(&planexv1.PlanResponse{
					Stop:        true,
					Escalate:    true,
					StopMessage: "the model refused to plan: " + oneLine(reply.Refusal),
				}, model, spent), nil
			}
			resp, problems := b.check(req, reply)
			if problems != nil {
				return nil, problems
			}
			if resp.GetPlan() != nil {
				resp.Plan.Revision = req.GetRevision()
			}
			return b.finish(resp, model, spent), nil
		},
		prompt.Repair)
}

// ask sends call and hands the reply to judge, which returns the answer or
// the problems with it (nil when there are none; a refusal is an answer).
// An answer with problems gets one repair round: the model sees its answer
// and repair(problems) and answers again; problems with that answer too are
// an *InvalidAnswerError, or a *TruncatedError when that answer was cut off
// at the output cap as well (the repair message of a cut answer asks for a
// shorter one: a third call with the same cap would be cut again).
// remaining bounds the tokens of both rounds (0: unlimited), and every
// error carries the tokens spent so far.
func ask[T any](ctx context.Context, b *Backend, call Call, remaining int64,
	judge func(reply Reply, model string, spent Usage) (T, []string),
	repair func(problems []string) string,
) (T, error) {
	var none T
	var spent Usage
	var problems []string
	for round := 0; round < 2; round++ {
		maxOut, err := b.budget(remaining, call, spent)
		if err != nil {
			return none, b.withUsage(err, spent)
		}
		call.MaxOutputTokens = maxOut
		reply, err := b.complete(ctx, call, round)
		spent.Input += reply.Usage.Input
		spent.Output += reply.Usage.Output
		if err != nil {
			return none, b.withUsage(err, spent)
		}
		model := reply.Model
		if model == "" {
			model = b.opts.Model
		}
		var resp T
		resp, problems = judge(reply, model, spent)
		if problems == nil {
			return resp, nil
		}
		if round == 1 {
			if reply.Truncated {
				return none, b.withUsage(&TruncatedError{Backend: b.opts.Name, Cap: maxOut, Configured: b.opts.MaxOutputTokens, Problems: problems}, spent)
			}
			break
		}
		text := reply.Text
		if strings.TrimSpace(text) == "" {
			text = "(empty answer)"
		}
		call.Turns = append(call.Turns,
			Turn{Role: RoleAssistant, Text: text, CallID: reply.CallID},
			Turn{Role: RoleUser, Text: repair(problems), CallID: reply.CallID},
		)
	}
	return none, b.withUsage(&InvalidAnswerError{Backend: b.opts.Name, Problems: problems}, spent)
}

// check parses and validates a reply; problems is nil when it is good.
func (b *Backend) check(req *planexv1.PlanRequest, reply Reply) (*planexv1.PlanResponse, []string) {
	resp, err := prompt.Parse(reply.Text)
	if err != nil {
		var ae *prompt.AnswerError
		problems := []string{err.Error()}
		if errors.As(err, &ae) {
			problems = ae.Problems
		}
		if reply.Truncated {
			problems = append([]string{"the answer was cut off at the output token limit; answer with fewer steps and shorter texts"}, problems...)
		}
		return nil, problems
	}
	if resp.GetPlan() == nil {
		return resp, nil
	}
	p := resp.GetPlan()
	p.Revision = req.GetRevision()
	if err := b.opts.Validate(req, p); err != nil {
		var ve *plan.ValidationError
		if errors.As(err, &ve) {
			problems := make([]string, len(ve.Problems))
			for i, pr := range ve.Problems {
				problems[i] = pr.String()
			}
			return nil, problems
		}
		return nil, []string{err.Error()}
	}
	return resp, nil
}

func (b *Backend) finish(resp *planexv1.PlanResponse, model string, u Usage) *planexv1.PlanResponse {
	resp.Backend = b.opts.Name
	resp.Model = model
	resp.PromptVersion = prompt.Version
	resp.Usage = &planexv1.TokenUsage{InputTokens: u.Input, OutputTokens: u.Output}
	return resp
}

func (b *Backend) withUsage(err error, u Usage) error {
	if u.Input == 0 && u.Output == 0 {
		return err
	}
	return &usageError{err: err, usage: &planexv1.TokenUsage{InputTokens: u.Input, OutputTokens: u.Output}}
}

// budget returns the output cap for the next call, or ErrBudget when the
// remaining tokens cannot cover the prompt and a useful answer after what
// is spent. remaining 0 (a request without a budget) is not limited.
func (b *Backend) budget(remaining int64, call Call, spent Usage) (int64, error) {
	limit := b.opts.MaxOutputTokens
	if remaining <= 0 {
		return limit, nil
	}
	remaining -= spent.Input + spent.Output
	in := EstimateTokens(call)
	if avail := remaining - in; avail < minOutputTokens {
		return 0, fmt.Errorf("%w: the call needs about %d prompt tokens and at least %d for the answer, %d remain", ErrBudget, in, minOutputTokens, max(remaining, 0))
	} else if avail < limit {
		limit = avail
	}
	return limit, nil
}

// EstimateTokens estimates the prompt tokens of a call: about four bytes
// per token for the text and the answer schema, plus a few per message.
func EstimateTokens(call Call) int64 {
	n := len(call.System)
	for _, t := range call.Turns {
		n += len(t.Text) + 16
	}
	if schema, err := json.Marshal(call.AnswerJSONSchema(prompt.ArgsObject)); err == nil {
		n += len(schema)
	}
	return int64(n/4 + 1)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// instrumentation names the tracer of model calls.
const instrumentation = "github.com/planex-dev/planex/services/planner/llm"

// genAIProvider is implemented by providers that know their
// gen_ai.provider.name ("openai", "anthropic").
type genAIProvider interface {
	GenAIProvider() string
}

// complete sends one call in a client span following the OpenTelemetry
// GenAI conventions: "chat <model>" with gen_ai.* attributes (provider,
// models, output cap, token usage, finish reasons, error.type). The span
// covers the provider's own retries, as the conventions ask; planex adds
// planex.backend and planex.planner.round (0 first, 1 the repair round).
// No prompt or answer text is recorded.
func (b *Backend) complete(ctx context.Context, call Call, round int) (Reply, error) {
	provider := b.opts.Name
	if p, ok := b.p.(genAIProvider); ok {
		provider = p.GenAIProvider()
	}
	ctx, span := otel.Tracer(instrumentation).Start(ctx, "chat "+b.opts.Model, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			semconv.GenAIOperationNameChat,
			semconv.GenAIProviderNameKey.String(provider),
			semconv.GenAIRequestModel(b.opts.Model),
			semconv.GenAIRequestMaxTokens(int(call.MaxOutputTokens)),
			attribute.String("planex.backend", b.opts.Name),
			attribute.Int("planex.planner.round", round),
		))
	defer span.End()
	reply, err := b.p.Complete(ctx, call)
	if reply.Model != "" {
		span.SetAttributes(semconv.GenAIResponseModel(reply.Model))
	}
	span.SetAttributes(semconv.GenAIUsageInputTokens(int(reply.Usage.Input)), semconv.GenAIUsageOutputTokens(int(reply.Usage.Output)))
	switch {
	case err != nil:
		span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
		span.RecordError(err)
		span.SetStatus(codes.Error, errorType(err))
	case reply.Refusal != "":
		span.SetAttributes(semconv.GenAIResponseFinishReasons("refusal"))
	case reply.Truncated:
		span.SetAttributes(semconv.GenAIResponseFinishReasons("length"))
	}
	return reply, err
}

// errorType is error.type of a failed call: the class of a provider error
// (or the HTTP status it answered), else "_OTHER".
func errorType(err error) string {
	var pe *ProviderError
	switch {
	case errors.As(err, &pe) && pe.StatusCode != 0:
		return strconv.Itoa(pe.StatusCode)
	case errors.Is(err, ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return semconv.ErrorTypeOther.Value.AsString()
}
