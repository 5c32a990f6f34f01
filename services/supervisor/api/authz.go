package api

import (
	"context"
	"strings"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
)

// deniedError is a PermissionDenied answer; msg stays server-side. public,
// when set, is why in words safe to show the caller (who may decide a
// gate), sent after "permission denied: ".
type deniedError struct{ msg, public string }

func (e *deniedError) Error() string { return e.msg }

// caller is the authenticated subject of ctx, "" when the API runs without
// the gRPC server's authentication (in-process embeddings).
func caller(ctx context.Context) (authn.Identity, bool) { return authn.FromContext(ctx) }

// startedBy is the subject a new run records.
func startedBy(ctx context.Context) string {
	id, _ := caller(ctx)
	return id.Subject
}

// checkCancel lets runners cancel their own runs and operators and
// admins any run (RunBatch cancels by a filter, an operator's power). A
// run's owner is its started_by as Identity.Matches reads it: the caller's
// namespaced subject, or a JWT caller's bare sub for runs started before
// subjects were namespaced — never an "apikey:" or "cert:" owner for a JWT.
func checkCancel(ctx context.Context, run *planexv1.Run) error {
	id, ok := caller(ctx)
	if !ok || id.Has(authn.RoleOperator) || id.Matches(run.GetStartedBy()) {
		return nil
	}
	return &deniedError{msg: "cancel run " + run.GetId() + " started by " + run.GetStartedBy() + ": " + id.Subject + " is not its owner nor operator"}
}

// checkDecide refuses approving (or editing) one's own run unless the
// self-approval policy allows it; rejecting one's own run is allowed.
func (s *Server) checkDecide(ctx context.Context, run *planexv1.Run, d planexv1.DecisionKind) error {
	id, ok := caller(ctx)
	if !ok || s.cfg.AllowSelfApproval || d == planexv1.DecisionKind_DECISION_KIND_REJECT {
		return nil
	}
	if id.Matches(run.GetStartedBy()) {
		return &deniedError{msg: "decide on run " + run.GetId() + ": " + id.Subject + " started it and self-approval is not allowed"}
	}
	return nil
}

// checkApprovers lets only a gate's approvers decide it, when its policy
// names approvers: namespaced subjects ("apikey:<name>", "cert:<cn>",
// "jwt:<iss>:<sub>"), "role:<role>" for any identity holding that role or
// a higher one, or a bare name, which (as before subjects were namespaced)
// matches a JWT caller whose sub it is and nothing else. Without
// authentication (no identity) nothing can be checked, like every other
// authorization of the API.
func checkApprovers(ctx context.Context, g *planexv1.Gate) error {
	id, ok := caller(ctx)
	if !ok || len(g.GetApprovers()) == 0 {
		return nil
	}
	for _, a := range g.GetApprovers() {
		if id.Matches(a) {
			return nil
		}
		if name, isRole := strings.CutPrefix(a, authn.SubjectRole); isRole {
			if role, err := authn.ParseRole(name); err == nil && id.Has(role) {
				return nil
			}
		}
	}
	// The caller holds a deciding role but is not among this gate's
	// approvers: the generic role message would send them looking for a
	// role they have. The approvers are the gate's policy, not a secret.
	who := strings.Join(g.GetApprovers(), ", ")
	return &deniedError{
		msg:    "decide gate " + g.GetId() + ": " + id.Subject + " is not among its approvers",
		public: "gate " + g.GetId() + " may be decided by " + who + " only; you are " + id.Subject,
	}
}
