package api

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/redact"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// Request limits.
const (
	maxGoalBytes     = 4096
	maxInputsBytes   = 64 << 10
	maxLabels        = 32
	maxLabelValue    = 256
	maxKeyBytes      = 128
	maxReasonBytes   = 1024
	maxActorBytes    = 256
	maxCommentBytes  = 4096
	maxBackendLength = 64
)

var (
	labelKeyRE = regexp.MustCompile(`^[a-z0-9_./-]{1,63}$`)
	backendRE  = regexp.MustCompile(`^[a-z0-9_-]+$`)
)

// secrets matches credentials and card numbers (not e-mail addresses,
// which goals legitimately name).
var secrets = redact.New(redact.SecretPatterns()...)

// maxEcho caps how much of a client's value an error message repeats.
const maxEcho = 64

// clip shortens a client value for an error message: at most maxEcho
// runes, then "…"; invalid UTF-8 is replaced, and what looks like a
// secret is masked (an error never echoes one).
func clip(s string) string {
	s = secrets.String(strings.ToValidUTF8(s, "\uFFFD"))
	n := 0
	for i := range s {
		if n == maxEcho {
			return s[:i] + "…"
		}
		n++
	}
	return s
}

// checkSecret returns an invalid-argument error naming field when text
// looks like it carries a credential or a card number; the value itself is
// never echoed.
func checkSecret(field, text string) error {
	if name, ok := secrets.Match(text); ok {
		return invalid("%s: contains what looks like a secret (%s); pass credentials through tool configuration, never in a request", field, name)
	}
	return nil
}

// checkText validates a free-text field: valid UTF-8, at most limit bytes,
// no secret.
func checkText(field, text string, limit int) error {
	switch {
	case len(text) > limit:
		return invalid("%s: %d bytes, at most %d", field, len(text), limit)
	case !utf8.ValidString(text):
		return invalid("%s: not valid UTF-8", field)
	}
	return checkSecret(field, text)
}

// validateStart checks a StartRunRequest and returns the effective budget
// and planning mode.
func (s *Server) validateStart(req *planexv1.StartRunRequest) (*planexv1.Budget, planexv1.PlanningMode, error) {
	var errs []error
	goal := req.GetGoal()
	switch {
	case goal == "":
		errs = append(errs, invalid("goal: required"))
	case len(goal) > maxGoalBytes:
		errs = append(errs, invalid("goal: %d bytes, at most %d", len(goal), maxGoalBytes))
	case !utf8.ValidString(goal):
		errs = append(errs, invalid("goal: not valid UTF-8"))
	case strings.TrimSpace(goal) == "":
		errs = append(errs, invalid("goal: required (only whitespace given)"))
	}
	if n := proto.Size(req.GetInputs()); n > maxInputsBytes {
		errs = append(errs, invalid("inputs: %d bytes encoded, at most %d", n, maxInputsBytes))
	}
	// The goal, inputs, labels and key go into the run log and to the
	// planner (perhaps a remote model): no credential or card number may
	// ride along. The inputs are checked in a canonical form that cannot
	// fail (NaN and ±Inf included), every string next to its key.
	if err := checkSecret("goal", goal); err != nil {
		errs = append(errs, err)
	}
	if err := checkSecret("inputs", redact.CanonicalStruct(req.GetInputs())); err != nil {
		errs = append(errs, err)
	}
	if n := len(req.GetLabels()); n > maxLabels {
		errs = append(errs, invalid("labels: %d labels, at most %d", n, maxLabels))
	}
	for _, k := range slices.Sorted(maps.Keys(req.GetLabels())) {
		v := req.GetLabels()[k]
		if _, inKey := secrets.Match(k); inKey {
			// The key itself looks like a secret: never echo it.
			errs = append(errs, checkSecret("labels (a key)", k))
			continue
		}
		if !labelKeyRE.MatchString(k) {
			errs = append(errs, invalid("labels: key %q: want 1 to 63 of [a-z0-9_./-]", clip(k)))
			continue
		}
		if len(v) > maxLabelValue || !utf8.ValidString(v) {
			errs = append(errs, invalid("labels[%q]: value must be valid UTF-8 of at most %d bytes", k, maxLabelValue))
		} else if err := checkSecret(fmt.Sprintf("labels[%q]", k), k+": "+v); err != nil {
			errs = append(errs, err)
		}
	}
	if key := req.GetIdempotencyKey(); key != "" {
		if err := checkText("idempotency_key", key, maxKeyBytes); err != nil {
			errs = append(errs, err)
		}
	}
	if b := req.GetPlannerBackend(); b != "" && (len(b) > maxBackendLength || !backendRE.MatchString(b)) {
		errs = append(errs, invalid("planner_backend %q: want a backend name like \"playbook\"", clip(b)))
	}
	mode := req.GetMode()
	switch mode {
	case planexv1.PlanningMode_PLANNING_MODE_UNSPECIFIED:
		mode = s.cfg.DefaultMode
	case planexv1.PlanningMode_PLANNING_MODE_FULL, planexv1.PlanningMode_PLANNING_MODE_NEXT_STEP:
	default:
		errs = append(errs, invalid("mode %d: want PLANNING_MODE_FULL or PLANNING_MODE_NEXT_STEP", mode))
	}
	budget, err := s.cfg.Limits.Resolve(req.GetBudget())
	if err != nil {
		errs = append(errs, invalid("%v", err))
	}
	if len(errs) > 0 {
		return nil, 0, joinInvalid(errs)
	}
	return budget, mode, nil
}

// joinInvalid merges field errors into one invalid-argument error listing
// them all.
func joinInvalid(errs []error) error {
	msg := ""
	for i, e := range errs {
		if i > 0 {
			msg += "; "
		}
		msg += e.Error()
	}
	return &invalidError{msg: msg}
}

func validRunID(id string) error {
	if id == "" {
		return invalid("run_id: required")
	}
	if !bus.ValidToken(id) {
		return invalid("run_id %q: not a run id", clip(id))
	}
	return nil
}

// load reads a run, turning an unknown run into a NotFound naming it.
func (s *Server) load(ctx context.Context, id string) (*runlog.State, error) {
	st, err := s.log.Load(ctx, id)
	if errors.Is(err, runlog.ErrRunNotFound) {
		return nil, &notFoundError{msg: fmt.Sprintf("run %q not found", clip(id))}
	}
	return st, err
}
