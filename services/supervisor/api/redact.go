package api

import (
	"context"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// sensitiveMask hides the fields tools declare sensitive
// (ToolSpec.sensitive_fields) in everything the API returns: runs, plans
// and WatchRun events (runlog.Mask, which `planex runs export` uses too).
// Clients see the values of other fields as they are (no pattern
// redaction). Event hashes cover the stored payloads, so a client
// verifying the chain of a redacted event stream must use the stored log.
type sensitiveMask struct{ m *runlog.Mask }

// mask reads the tool catalog; when it cannot, every argument, input,
// output and result is hidden (fail closed).
func (s *Server) mask(ctx context.Context) sensitiveMask {
	if s.cfg.Tools == nil {
		return sensitiveMask{}
	}
	cat, err := s.cfg.Tools.Get(ctx)
	if err != nil {
		s.logger.WarnContext(ctx, "read tool catalog for redaction; hiding all arguments and outputs", "err", err)
		return sensitiveMask{runlog.MaskAll()}
	}
	return sensitiveMask{runlog.NewMask(cat.Specs(), nil)}
}

// run returns a copy of run with sensitive fields hidden.
func (m sensitiveMask) run(run *planexv1.Run) *planexv1.Run { return m.m.Run(run) }

// event returns a copy of ev with sensitive fields hidden; toolOf maps a
// step id to its tool.
func (m sensitiveMask) event(ev *planexv1.RunEvent, toolOf map[string]string) *planexv1.RunEvent {
	return m.m.Event(ev, toolOf)
}
