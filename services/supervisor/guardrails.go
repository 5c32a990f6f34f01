package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/pflag"

	"github.com/planex-dev/planex/internal/policy"
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
}

func (g *GuardrailFlags) registerFlags(fs *pflag.FlagSet) {
	fs.StringSliceVar(&g.Policies, "policy", nil, "guardrail policy files in CEL (comma separated or repeated; "+policy.Builtin+" is the embedded default policy); a malformed file refuses the start")
	fs.DurationVar(&g.PolicyReload, "policy-reload-interval", 10*time.Second, "how often policy files are checked for changes; a change that does not compile keeps the policies in force (0: never)")
	fs.IntVar(&g.StallLimit, "stall-limit", 3, "stop a run ESCALATED (STALLED) when a step that failed in this many plan revisions is planned again, after this many replans without a newly succeeded step, or when a plan repeats this many earlier revisions (0: off)")
}

func (g GuardrailFlags) validate() []error {
	var errs []error
	if g.PolicyReload < 0 || (g.PolicyReload > 0 && g.PolicyReload < time.Second) {
		errs = append(errs, fmt.Errorf("--policy-reload-interval %s: want 0 (never) or at least 1s", g.PolicyReload))
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
