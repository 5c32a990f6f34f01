// Package planner is planex's planner service (planex.v1.PlannerService):
// it turns a goal, the tool catalog and a run's history into the next plan
// revision. It never calls a tool, and it keeps no state between calls, so
// it scales by replicas.
//
// A request is answered by one backend:
//
//   - playbook (the default, no network): YAML playbooks that match a goal
//     with a regular expression, bind parameters and emit a step DAG, with
//     on_failure branches for replanning (package playbook);
//   - openai: the Chat Completions API of OpenAI or any compatible server,
//     with strict JSON-Schema output (package openai);
//   - anthropic: the Messages API with a forced tool call (package
//     anthropic).
//
// Model answers are parsed and validated like the engine validates plans;
// an invalid answer gets one repair round with the problems fed back
// (package llm), prompts live in package prompt. The server validates every
// answer again against the request's catalog and limits, optionally caches
// first plans in the KV bucket planex-plans (--plan-cache) and escalates to
// a stronger model when confidence is low (--escalation-backend). See
// [Server] for the gRPC error codes.
package planner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/service"
)

// DefaultGRPCAddr is the planner's default listen address.
const DefaultGRPCAddr = "127.0.0.1:7401"

// Config configures a planner replica.
type Config struct {
	// Common service flags.
	Common service.Common
	// Backend selects and configures the backends.
	Backend BackendConfig
	// OnReady, when set, is called with the gRPC address once SERVING.
	OnReady func(net.Addr)
}

// RegisterFlags adds the planner's flags to fs: the common flags, the
// backend flags, and --backend as a short alias of --planner-backend.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	c.Common.RegisterFlags(fs, DefaultGRPCAddr)
	c.Backend.RegisterFlags(fs)
	fs.StringVar(&c.Backend.Backend, "backend", BackendPlaybook, "alias of --planner-backend")
	// Only the planner service's: `planex dev` and `planex eval` have
	// their own --replay, for the planner and the tools together.
	fs.StringVar(&c.Backend.Replay, "replay", "", "cassette directory the replay backend answers from (recorded with planex eval --dev --record or planex dev --record)")
	fs.StringVar(&c.Backend.ReplayMiss, "replay-miss", ReplayMissError, "a request the cassette lacks: error (fail naming it) or live (ask --replay-live-backend)")
	fs.StringVar(&c.Backend.ReplayLiveBackend, "replay-live-backend", BackendPlaybook, "backend answering the misses of --replay-miss live: playbook, openai or anthropic")
	fs.StringVar(&c.Backend.Record, "record", "", "record every answer of the planner's backends (plans, stops, errors; redacted) into this cassette directory, for --planner-backend replay and planex eval --replay")
}

// Validate checks the configuration, naming the flag and value at fault.
func (c Config) Validate() error {
	return errors.Join(c.Common.Validate(), c.Backend.Validate())
}

// CreatePlanCache creates or updates the plan cache bucket.
func CreatePlanCache(ctx context.Context, js jetstream.JetStream, ttl time.Duration, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      PlanCacheBucket,
		Description: "planex planner: validated first plans by normalized goal and tool catalog",
		History:     1,
		TTL:         ttl,
		Replicas:    max(replicas, 1),
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("create KV bucket %s: %w", PlanCacheBucket, err)
	}
	return kv, nil
}

// Run serves the planner until ctx ends, then shuts down gracefully. The
// playbooks are loaded and the backends built before anything is served,
// so a malformed playbook or a missing API key stops the start with an
// error naming the file and line or the flag.
func Run(ctx context.Context, cfg Config, logger *slog.Logger, metrics service.MetricsHandler) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	bs, err := buildBackends(cfg.Backend, logger)
	if err != nil {
		return err
	}
	logger.Info("planner backends ready", "backend", bs.def, "playbooks", bs.playbooks, "override", cfg.Backend.AllowOverride, "plan_cache", cfg.Backend.PlanCache)
	return service.Serve(ctx, service.Params{
		Name:    "planner",
		Common:  cfg.Common,
		Logger:  logger,
		Metrics: metrics,
		Ready:   cfg.OnReady,
		Start: func(ctx context.Context, d service.Deps) (func(context.Context) error, error) {
			var kv jetstream.KeyValue
			if cfg.Backend.PlanCache != CacheOff {
				var err error
				if kv, err = CreatePlanCache(ctx, d.Bus.JS, cfg.Backend.PlanCacheTTL, cfg.Common.StreamReplicas); err != nil {
					return nil, err
				}
			}
			srv, err := newServer(bs, cfg.Backend, d.Logger, kv)
			if err != nil {
				return nil, err
			}
			planexv1.RegisterPlannerServiceServer(d.Server.GRPC, srv)
			return func(context.Context) error { return nil }, nil
		},
	})
}
