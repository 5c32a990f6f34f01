package devstack

import (
	"fmt"
	"slices"
	"strings"

	"github.com/planex-dev/planex/services/planner"
)

// CriticBackends are the values --critic-backend accepts besides empty
// (off): the planner backends that can judge a result.
var CriticBackends = []string{planner.BackendPlaybook, planner.BackendOpenAI, planner.BackendAnthropic}

// ValidateName checks that --critic-backend names a planner backend, so a
// typo is refused at start instead of escalating every judged run.
func (c CriticOptions) ValidateName() error {
	if c.Backend == "" || slices.Contains(CriticBackends, c.Backend) {
		return nil
	}
	return fmt.Errorf("--critic-backend %q: want one of %s (empty: off)", c.Backend, strings.Join(CriticBackends, ", "))
}

// Validate checks --critic-backend against the dev stack's planner p: the
// critic must name a backend that planner serves (its --planner-backend,
// or another one with --planner-allow-backend-override).
func (c CriticOptions) Validate(p planner.BackendConfig) error {
	if err := c.ValidateName(); err != nil || c.Backend == "" {
		return err
	}
	if c.Backend != p.Backend && p.Backend != planner.BackendReplay && !p.AllowOverride {
		return fmt.Errorf("--critic-backend %s: the planner serves only --planner-backend %s; give --planner-backend %s or --planner-allow-backend-override", c.Backend, p.Backend, c.Backend)
	}
	return nil
}
