package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/planex-dev/planex/internal/policy"
	"github.com/planex-dev/planex/services/supervisor/engine"
)

// GuardrailFlags are the supervisor's guardrail settings (docs/guardrails.md).
type GuardrailFlags struct {
	// Policies are policy files (builtin:default names the embedded
	// default policy); empty: no policy.
	Policies []string
	// PolicyReload is how often the policy files are checked for changes
	// (0: never).
	PolicyReload time.Duration
	// StallLimit is engine.Guardrails.StallLimit (0: off).
	StallLimit int
	// CriticBackend is the planner backend of the model critic (empty:
	// off).
	CriticBackend string
	// CriticTools are the tools whose results the model critic judges
	// ("*": every tool).
	CriticTools []string
	// CriticMaxTokens is the model critic's token budget per run.
	CriticMaxTokens int64
	// CriticOnFail is what a failing verdict does: replan or escalate.
	CriticOnFail string
}

func (g *GuardrailFlags) registerFlags(fs *pflag.FlagSet) {
	fs.StringSliceVar(&g.Policies, "policy", nil, "guardrail policy files in CEL (comma separated or repeated; "+policy.Builtin+" is the embedded default policy); a malformed file refuses the start")
	fs.DurationVar(&g.PolicyReload, "policy-reload-interval", 10*time.Second, "how often policy files are checked for changes; a change that does not compile keeps the policies in force (0: never)")
	fs.StringVar(&g.CriticBackend, "critic-backend", "", "planner backend of the model critic (openai, anthropic, playbook; the planner's own backend or one it allows as an override) that judges step results before the run moves on (empty: off)")
	fs.StringSliceVar(&g.CriticTools, "critic-tools", []string{"*"}, "tools whose results the model critic judges (comma separated; * is every tool)")
	fs.Int64Var(&g.CriticMaxTokens, "critic-max-tokens", 20000, "model critic tokens per run, counted apart from the planner's max_tokens; once spent, results are no longer judged")
	fs.StringVar(&g.CriticOnFail, "critic-on-fail", "replan", "what a failing verdict of the model critic does: replan (the attempt fails with the verdict, retried or replanned) or escalate (the run stops ESCALATED)")
	fs.IntVar(&g.StallLimit, "stall-limit", 3, "stop a run ESCALATED (STALLED) when a step that failed in this many plan revisions is planned again, after this many replans without a newly succeeded step, or when a plan repeats this many earlier revisions (0: off)")
}

// criticBackends are the planner backends --critic-backend may name (the
// planner must also serve it: as its --planner-backend or as an override).
var criticBackends = []string{"playbook", "openai", "anthropic", "replay"}

func (g GuardrailFlags) validate() []error {
	var errs []error
	if g.PolicyReload < 0 || (g.PolicyReload > 0 && g.PolicyReload < time.Second) {
		errs = append(errs, fmt.Errorf("--policy-reload-interval %s: want 0 (never) or at least 1s", g.PolicyReload))
	}
	if g.CriticBackend != "" {
		if !slices.Contains(criticBackends, g.CriticBackend) {
			errs = append(errs, fmt.Errorf("--critic-backend %q: want one of %s (empty: off)", g.CriticBackend, strings.Join(criticBackends, ", ")))
		}
		if g.CriticMaxTokens <= 0 {
			errs = append(errs, fmt.Errorf("--critic-max-tokens %d: must be positive with --critic-backend", g.CriticMaxTokens))
		}
		if len(g.CriticTools) == 0 {
			errs = append(errs, errors.New("--critic-tools: empty; name the tools to judge or * for every tool"))
		}
	}
	if g.CriticOnFail != "replan" && g.CriticOnFail != "escalate" {
		errs = append(errs, fmt.Errorf("--critic-on-fail %q: want replan or escalate", g.CriticOnFail))
	}
	if g.StallLimit < 0 {
		errs = append(errs, fmt.Errorf("--stall-limit %d: must not be negative", g.StallLimit))
	}
	return errs
}

// policies loads the policy files (nil watcher without files) and keeps
// reloading them until ctx ends.
func (g GuardrailFlags) policies(ctx context.Context, logger *slog.Logger) (*policy.Watcher, error) {
	if len(g.Policies) == 0 {
		return nil, nil
	}
	w, err := policy.NewWatcher(logger, g.Policies...)
	if err != nil {
		return nil, fmt.Errorf("--policy: %w", err)
	}
	if g.PolicyReload > 0 {
		go w.Run(ctx, g.PolicyReload)
	}
	return w, nil
}

// critic is the engine's model critic configuration.
func (g GuardrailFlags) critic() engine.ModelCritic {
	return engine.ModelCritic{Backend: g.CriticBackend, Tools: g.CriticTools, MaxTokens: g.CriticMaxTokens, Escalate: g.CriticOnFail == "escalate"}
}
