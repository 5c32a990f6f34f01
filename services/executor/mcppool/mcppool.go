// Package mcppool is the executor pool that serves the tools of Model
// Context Protocol servers as planex tools.
//
// Each configured server (a stdio command or a streamable-HTTP URL, in the
// "mcpServers" shape of MCP client configs) is connected with the official
// Go SDK and supervised: when its process exits or its session breaks it
// is restarted with exponential backoff. Every tool it lists becomes a
// planex tool "<pool>.<server>_<tool>" (lower case, other characters than
// letters and digits replaced by '_') whose args_schema is the tool's MCP
// input schema, so arguments are validated before a step is dispatched and
// again before tools/call.
//
// # Annotations
//
// MCP tool annotations are hints; planex maps them to its own semantics,
// safe by default:
//
//	no annotations            EXTERNAL, requires approval, not retried
//	readOnlyHint: true        READ, no approval, retried
//	destructiveHint: true     requires approval (also when absent, as in MCP)
//	destructiveHint: false    no approval
//	openWorldHint: false      WRITE instead of EXTERNAL
//	idempotentHint: true      retried when the server dies mid-call
//
// A per-tool override in the config file replaces any of these.
//
// # Results
//
// structuredContent becomes the step output; otherwise the text content
// becomes {"text": …} (other content kinds are kept under "content"). A
// result with isError fails the step with the server's text. When the
// server dies during a call, a READ or idempotent tool is retried (on
// this or another replica); any other tool ends OUTCOME_UNKNOWN and is
// escalated, never repeated.
package mcppool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/executor/runner"
)

const instrumentation = "github.com/planex-dev/planex/services/executor/mcppool"

// DefaultPool is the pool name of `planex executor --pool mcp`.
const DefaultPool = "mcp"

// maxErrorText caps the server text copied into a step error.
const maxErrorText = 2000

// Config configures the pool.
type Config struct {
	// Pool is the pool name, the first part of every tool name.
	Pool string
	// File is the parsed --mcp-config.
	File FileConfig
	// StartTimeout bounds the first connection to every server (default
	// 60s: npx may download the server first).
	StartTimeout time.Duration
	// Logger receives the pool's logs and the servers' stderr.
	Logger *slog.Logger
	// OnHealth, when set, is called whenever a server's session comes up
	// (err nil) or goes down (err says why), from the server's supervisor
	// goroutine.
	OnHealth func(server string, err error)
}

// Pool is a set of supervised MCP servers and their tools.
type Pool struct {
	cfg     Config
	logger  *slog.Logger
	servers []*server
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	tracer  trace.Tracer
	calls   metric.Int64Counter
	reg     metric.Registration

	mu       sync.Mutex
	tools    []*tool
	onChange func(ctx context.Context, tools []runner.Tool) error
}

// Open starts (or dials) every server, waits for its first session and
// lists its tools. A server that cannot be reached fails Open with its
// name; later failures are retried in the background.
func Open(ctx context.Context, cfg Config) (*Pool, error) {
	if cfg.Pool == "" {
		cfg.Pool = DefaultPool
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	if err := cfg.File.Validate(); err != nil {
		return nil, err
	}
	p := &Pool{cfg: cfg, logger: cfg.Logger, tracer: otel.Tracer(instrumentation)}
	meter := otel.Meter(instrumentation)
	var err error
	p.calls, err = meter.Int64Counter("planex.mcp.calls", metric.WithDescription("tools/call requests by server, tool and outcome"))
	if err != nil {
		return nil, fmt.Errorf("mcp metrics: %w", err)
	}
	up, err := meter.Int64ObservableGauge("planex.mcp.server.up", metric.WithDescription("1 while the MCP server's session is live"))
	if err != nil {
		return nil, fmt.Errorf("mcp metrics: %w", err)
	}
	restarts, err := meter.Int64ObservableCounter("planex.mcp.server.restarts", metric.WithDescription("sessions of the MCP server that ended and were restarted"))
	if err != nil {
		return nil, fmt.Errorf("mcp metrics: %w", err)
	}
	p.reg, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, s := range p.servers {
			attrs := metric.WithAttributes(attribute.String("mcp.server", s.name))
			s.mu.Lock()
			v := int64(0)
			if s.session != nil {
				v = 1
			}
			n := int64(s.restarts)
			s.mu.Unlock()
			o.ObserveInt64(up, v, attrs)
			o.ObserveInt64(restarts, n, attrs)
		}
		return nil
	}, up, restarts)
	if err != nil {
		return nil, fmt.Errorf("mcp metrics: %w", err)
	}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = cancel
	for _, name := range slices.Sorted(maps.Keys(cfg.File.Servers)) {
		id, _ := serverID(name)
		s := &server{
			name: name, id: id, cfg: cfg.File.Servers[name], mask: cfg.File.mask,
			logger:         cfg.Logger.With("mcp_server", name),
			ready:          make(chan struct{}),
			connectTimeout: cfg.StartTimeout,
		}
		s.onList, s.onHealth = p.relist, cfg.OnHealth
		p.servers = append(p.servers, s)
	}
	// The first listing of each server, written by its supervisor.
	var firstMu sync.Mutex
	first := make(map[*server][]*mcp.Tool)
	firstErr := make(map[*server]error)
	for _, s := range p.servers {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			listed := false
			s.supervise(runCtx, func(ctx context.Context, cs *mcp.ClientSession) {
				tools, err := listTools(ctx, cs)
				if !listed {
					listed = true
					firstMu.Lock()
					first[s], firstErr[s] = tools, s.mask.Error(err)
					firstMu.Unlock()
					return
				}
				if err == nil {
					p.compare(ctx, s, tools)
				}
			})
		}()
	}
	wait, cancelWait := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancelWait()
	var errs []error
	for _, s := range p.servers {
		select {
		case <-s.ready:
			s.mu.Lock()
			ok, lastErr := s.readyOK, s.lastErr
			s.mu.Unlock()
			firstMu.Lock()
			lerr := firstErr[s]
			firstMu.Unlock()
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("mcp server %s: %w", s.name, lastErr))
			case lerr != nil:
				errs = append(errs, fmt.Errorf("mcp server %s: list tools: %w", s.name, lerr))
			}
		case <-wait.Done():
			errs = append(errs, fmt.Errorf("mcp server %s: not connected within %s", s.name, cfg.StartTimeout))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	// A server may already have sent tools/list_changed, and relist
	// (compare) set its tools from a newer listing: keep those.
	p.mu.Lock()
	for _, s := range p.servers {
		for name := range s.cfg.Tools {
			if !slices.ContainsFunc(first[s], func(t *mcp.Tool) bool { return t.Name == name }) {
				p.logger.Warn("mcp config overrides a tool the server does not list", "mcp_server", s.name, "tool", name)
			}
		}
		if slices.ContainsFunc(p.tools, func(t *tool) bool { return t.srv == s }) {
			continue
		}
		tools, terrs := p.build(s, first[s], p.tools)
		errs = append(errs, terrs...)
		p.tools = append(p.tools, tools...)
	}
	ntools := len(p.tools)
	p.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	p.logger.Info("mcp pool ready", "servers", len(p.servers), "tools", ntools)
	return p, nil
}

func listTools(ctx context.Context, cs *mcp.ClientSession) ([]*mcp.Tool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out []*mcp.Tool
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// relist follows notifications/tools/list_changed.
func (p *Pool) relist(ctx context.Context, s *server) {
	cs, err := s.current()
	if err != nil {
		return
	}
	tools, err := listTools(ctx, cs)
	if err != nil {
		s.logger.Warn("list tools after list_changed", "err", s.mask.Error(err))
		return
	}
	p.compare(ctx, s, tools)
}

// build maps the tools a server lists to planex tools, leaving out the
// disabled ones and those whose planex name one of others already has.
func (p *Pool) build(s *server, listed []*mcp.Tool, others []*tool) ([]*tool, []error) {
	names := map[string]string{}
	for _, t := range others {
		names[t.spec.GetName()] = t.srv.name + "/" + t.mcpName
	}
	var out []*tool
	var errs []error
	for _, mt := range listed {
		o := s.cfg.Tools[mt.Name]
		if o.Disabled {
			continue
		}
		t, err := p.newTool(s, mt, o)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if other, dup := names[t.spec.GetName()]; dup {
			errs = append(errs, fmt.Errorf("mcp server %s: tool %q and %s both map to planex tool %s; disable one in the config", s.name, mt.Name, other, t.spec.GetName()))
			continue
		}
		names[t.spec.GetName()] = s.name + "/" + mt.Name
		out = append(out, t)
	}
	return out, errs
}

// OnToolsChanged sets the function told the pool's whole tool set each
// time a server's listing changes (notifications/tools/list_changed, or a
// restarted server listing other tools); the executor passes
// runner.Runner.SetTools, so added tools are registered and served and
// removed ones stop being advertised without a restart.
func (p *Pool) OnToolsChanged(fn func(ctx context.Context, tools []runner.Tool) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onChange = fn
}

// compare replaces the server's tools by the ones it lists now when they
// differ (added, removed, or a changed schema, description or
// annotations) and hands the new set to the OnToolsChanged function. A
// tool that cannot be mapped is left out and logged; the others change.
func (p *Pool) compare(ctx context.Context, s *server, listed []*mcp.Tool) {
	p.mu.Lock()
	var others, mine []*tool
	for _, t := range p.tools {
		if t.srv == s {
			mine = append(mine, t)
		} else {
			others = append(others, t)
		}
	}
	fresh, errs := p.build(s, listed, others)
	for _, err := range errs {
		s.logger.Warn("mcp tool left out", "err", err)
	}
	if sameTools(mine, fresh) {
		p.mu.Unlock()
		return
	}
	for _, t := range fresh {
		if !slices.ContainsFunc(mine, func(o *tool) bool { return o.mcpName == t.mcpName }) {
			s.logger.Info("mcp tool added", "tool", t.mcpName, "planex_tool", t.spec.GetName())
		}
	}
	for _, t := range mine {
		if !slices.ContainsFunc(fresh, func(o *tool) bool { return o.mcpName == t.mcpName }) {
			s.logger.Info("mcp tool removed", "tool", t.mcpName, "planex_tool", t.spec.GetName())
		}
	}
	p.tools = append(others, fresh...)
	all := make([]runner.Tool, len(p.tools))
	for i, t := range p.tools {
		all[i] = t
	}
	fn := p.onChange
	p.mu.Unlock()
	if fn == nil {
		return
	}
	if err := fn(ctx, all); err != nil {
		s.logger.Warn("update the replica's tools", "err", err)
	}
}

// sameTools reports whether two listings map to the same planex specs.
func sameTools(a, b []*tool) bool {
	if len(a) != len(b) {
		return false
	}
	specs := func(ts []*tool) map[string]*planexv1.ToolSpec {
		m := make(map[string]*planexv1.ToolSpec, len(ts))
		for _, t := range ts {
			m[t.spec.GetName()] = t.spec
		}
		return m
	}
	sa, sb := specs(a), specs(b)
	for name, x := range sa {
		if y, ok := sb[name]; !ok || !proto.Equal(x, y) {
			return false
		}
	}
	return true
}

// Tools returns the pool's tools.
func (p *Pool) Tools() []runner.Tool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]runner.Tool, len(p.tools))
	for i, t := range p.tools {
		out[i] = t
	}
	return out
}

// Health reports nil while every server has a live session, else which
// are down and why.
func (p *Pool) Health() error {
	var errs []error
	for _, s := range p.servers {
		if _, err := s.current(); err != nil {
			errs = append(errs, fmt.Errorf("mcp server %s: %w", s.name, err))
		}
	}
	return errors.Join(errs...)
}

// Close stops every server (stdin closed, then SIGTERM, then SIGKILL) and
// waits for the supervisors.
func (p *Pool) Close() error {
	p.cancel()
	p.wg.Wait()
	if p.reg != nil {
		return p.reg.Unregister()
	}
	return nil
}

// tool is one MCP tool served as a planex tool.
type tool struct {
	p         *Pool
	srv       *server
	mcpName   string
	spec      *planexv1.ToolSpec
	retryable bool // safe to repeat when the server died mid-call
}

func (p *Pool) newTool(s *server, mt *mcp.Tool, o ToolOverride) (*tool, error) {
	verb := s.id + "_" + sanitize(mt.Name)
	spec := &planexv1.ToolSpec{
		Name:        p.cfg.Pool + "." + verb,
		Pool:        p.cfg.Pool,
		Description: strings.TrimSpace(mt.Description),
		Version:     "mcp:" + s.name + "/" + mt.Name,
	}
	if mt.Title != "" && spec.Description == "" {
		spec.Description = mt.Title
	}
	spec.Description += fmt.Sprintf(" (MCP tool %q of server %q)", mt.Name, s.name)
	var err error
	if spec.ArgsSchema, err = schemaStruct(mt.InputSchema); err != nil {
		return nil, fmt.Errorf("mcp server %s: tool %q: inputSchema: %w", s.name, mt.Name, err)
	}
	if mt.OutputSchema != nil {
		if spec.OutputSchema, err = schemaStruct(mt.OutputSchema); err != nil {
			return nil, fmt.Errorf("mcp server %s: tool %q: outputSchema: %w", s.name, mt.Name, err)
		}
	}
	idempotent := semantics(spec, mt.Annotations)
	if se, _ := sideEffectOf(o.SideEffect); se != planexv1.SideEffect_SIDE_EFFECT_UNSPECIFIED {
		spec.SideEffect = se
		if se == planexv1.SideEffect_SIDE_EFFECT_READ {
			idempotent = true
		}
	}
	if o.RequiresApproval != nil {
		spec.RequiresApproval = *o.RequiresApproval
	}
	if o.Idempotent != nil {
		idempotent = *o.Idempotent
	}
	spec.Idempotent = idempotent
	timeout, _ := parseTimeout(s.cfg.Timeout)
	if d, _ := parseTimeout(o.Timeout); d > 0 {
		timeout = d
	}
	if timeout > 0 {
		spec.DefaultTimeout = durationpb.New(timeout)
	}
	spec.SensitiveFields = o.SensitiveFields
	return &tool{p: p, srv: s, mcpName: mt.Name, spec: spec, retryable: idempotent}, nil
}

// semantics sets side_effect and requires_approval from the annotations
// and returns whether the tool is idempotent.
func semantics(spec *planexv1.ToolSpec, a *mcp.ToolAnnotations) (idempotent bool) {
	switch {
	case a == nil:
		spec.SideEffect = planexv1.SideEffect_SIDE_EFFECT_EXTERNAL
		spec.RequiresApproval = true
		return false
	case a.ReadOnlyHint:
		spec.SideEffect = planexv1.SideEffect_SIDE_EFFECT_READ
		return true
	}
	spec.SideEffect = planexv1.SideEffect_SIDE_EFFECT_EXTERNAL
	if a.OpenWorldHint != nil && !*a.OpenWorldHint {
		spec.SideEffect = planexv1.SideEffect_SIDE_EFFECT_WRITE
	}
	spec.RequiresApproval = a.DestructiveHint == nil || *a.DestructiveHint
	return a.IdempotentHint
}

func sideEffectOf(s string) (planexv1.SideEffect, error) {
	switch s {
	case "":
		return planexv1.SideEffect_SIDE_EFFECT_UNSPECIFIED, nil
	case "read":
		return planexv1.SideEffect_SIDE_EFFECT_READ, nil
	case "write":
		return planexv1.SideEffect_SIDE_EFFECT_WRITE, nil
	case "external":
		return planexv1.SideEffect_SIDE_EFFECT_EXTERNAL, nil
	}
	return 0, fmt.Errorf("%q: want read, write or external", s)
}

// schemaStruct converts a JSON Schema as decoded by the SDK.
func schemaStruct(v any) (*structpb.Struct, error) {
	if v == nil {
		return nil, nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("want a JSON object: %w", err)
	}
	return structpb.NewStruct(m)
}

// Spec implements runner.Tool.
func (t *tool) Spec() *planexv1.ToolSpec { return t.spec }

// Run calls the tool on its server.
func (t *tool) Run(ctx context.Context, call runner.Call) (out any, err error) {
	s := t.srv
	ctx, span := t.p.tracer.Start(ctx, "tools/call "+t.mcpName, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("mcp.method.name", "tools/call"),
		attribute.String("mcp.server", s.name),
		attribute.String("mcp.tool", t.mcpName),
		attribute.String("gen_ai.tool.name", t.mcpName),
	))
	defer span.End()
	outcome := "succeeded"
	defer func() {
		// Neither the step error nor its logged cause shows an expanded
		// value: transport errors embed the URL, servers echo what they got.
		var te *runner.Error
		if errors.As(err, &te) {
			te.Message = s.mask.String(te.Message)
			te.Err = s.mask.Error(te.Err)
		} else {
			err = s.mask.Error(err)
		}
		if err != nil {
			outcome = "failed"
			span.SetStatus(codes.Error, err.Error())
		}
		t.p.calls.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(
			attribute.String("mcp.server", s.name), attribute.String("mcp.tool", t.mcpName), attribute.String("outcome", outcome)))
	}()

	cs, err := s.current()
	if err != nil {
		// Nothing was sent: safe to retry whatever the tool does.
		return nil, runner.Unavailable(err, "MCP server %s is not connected", s.name)
	}
	meta := mcp.Meta{}
	propagation.TraceContext{}.Inject(ctx, metaCarrier(meta)) // W3C traceparent in _meta, as the MCP tracing convention has it
	if sid := cs.ID(); sid != "" {
		span.SetAttributes(attribute.String("mcp.session.id", sid))
	}
	if testHookCallSent != nil {
		testHookCallSent(t.spec.GetName())
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Meta: meta, Name: t.mcpName, Arguments: call.Args.AsMap()})
	err = s.mask.Error(err)
	if err != nil {
		span.RecordError(err)
		return nil, t.callError(ctx, cs, err)
	}
	if res.IsError {
		msg := truncate(contentText(res.Content), maxErrorText)
		if msg == "" {
			msg = "the tool reported an error without text"
		}
		return nil, runner.Failed(nil, "%s: %s", t.mcpName, msg)
	}
	if res.StructuredContent != nil {
		return res.StructuredContent, nil
	}
	return contentOutput(res.Content), nil
}

// callError classifies a failed tools/call.
func (t *tool) callError(ctx context.Context, cs *mcp.ClientSession, err error) error {
	if ctx.Err() != nil {
		return ctx.Err() // the runner reports TIMEOUT or CANCELLED; the SDK sent notifications/cancelled
	}
	var we *jsonrpc.Error
	if errors.As(err, &we) && we.Code != -32003 && we.Code != -32004 { // not "client/server is closing"
		// The server answered with a protocol error (unknown tool,
		// invalid params): it did not act.
		return runner.Failed(err, "%s: MCP server %s refused the call: %s", t.mcpName, t.srv.name, truncate(we.Message, maxErrorText))
	}
	t.srv.broken(cs, err)
	if t.retryable {
		return runner.Unavailable(err, "MCP server %s went away during %s; the call is retried", t.srv.name, t.mcpName)
	}
	return runner.OutcomeUnknown(err, "MCP server %s went away during %s, which is not idempotent: whether it acted is unknown", t.srv.name, t.mcpName)
}

// testHookCallSent is called just before tools/call is sent (tests only).
var testHookCallSent func(tool string)

// metaCarrier lets the propagator write traceparent/tracestate into _meta.
type metaCarrier mcp.Meta

func (m metaCarrier) Get(key string) string {
	s, _ := m[key].(string)
	return s
}

func (m metaCarrier) Set(key, value string) { m[key] = value }

func (m metaCarrier) Keys() []string { return slices.Collect(maps.Keys(m)) }

func contentText(cs []mcp.Content) string {
	var parts []string
	for _, c := range cs {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// contentOutput is the output of a result without structured content.
func contentOutput(cs []mcp.Content) map[string]any {
	out := map[string]any{"text": contentText(cs)}
	var other []any
	for _, c := range cs {
		if _, ok := c.(*mcp.TextContent); ok {
			continue
		}
		data, err := json.Marshal(c)
		if err != nil {
			continue
		}
		var v any
		if json.Unmarshal(data, &v) == nil {
			other = append(other, v)
		}
	}
	if len(other) > 0 {
		out["content"] = other
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
