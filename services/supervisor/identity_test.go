package supervisor_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn/authntest"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// TestJWTCannotClaimAnAPIKey reproduces issue 26 against a supervisor
// with API keys and JWTs on: a JWT with sub "apikey:<name>" acted as that
// API key and cancelled its run. Its subject is now
// "jwt:<issuer>:apikey:<name>": it cannot cancel the key's run, the key's
// runs are not "its own" for the self-approval rule, and the runs it
// starts are not the key's.
func TestJWTCannotClaimAnAPIKey(t *testing.T) {
	f := authntest.New(t)
	addr := startSecured(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dial := func(token string) planexv1.SupervisorServiceClient {
		return planexv1.NewSupervisorServiceClient(f.Dial(addr, tlsconfig.Files{}, token))
	}
	key := dial(f.APIKeys["runner"])
	impostor := dial(f.Token("apikey:runner-key", []string{"runner"}, nil))

	victim, err := key.StartRun(ctx, &planexv1.StartRunRequest{Goal: "list open tickets"})
	if err != nil {
		t.Fatal(err)
	}
	if got := victim.GetRun().GetStartedBy(); got != "apikey:runner-key" {
		t.Fatalf("started_by = %q, want apikey:runner-key", got)
	}
	_, err = impostor.CancelRun(ctx, &planexv1.CancelRunRequest{RunId: victim.GetRun().GetId(), Reason: "mine"})
	if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != "permission denied" {
		t.Fatalf("JWT sub apikey:runner-key cancels the key's run: %v, want PermissionDenied", err)
	}
	got, err := key.GetRun(ctx, &planexv1.GetRunRequest{RunId: victim.GetRun().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetRun().GetStatus() == planexv1.RunStatus_RUN_STATUS_CANCELLED {
		t.Fatal("the key's run was cancelled")
	}

	own, err := impostor.StartRun(ctx, &planexv1.StartRunRequest{Goal: "list open tickets"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := own.GetRun().GetStartedBy(), "jwt:"+authntest.Issuer+":apikey:runner-key"; got != want {
		t.Fatalf("a run the JWT starts: started_by %q, want %q", got, want)
	}
	if _, err := key.CancelRun(ctx, &planexv1.CancelRunRequest{RunId: own.GetRun().GetId()}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("the API key cancels the JWT's run: %v, want PermissionDenied", err)
	}
	if _, err := impostor.CancelRun(ctx, &planexv1.CancelRunRequest{RunId: own.GetRun().GetId()}); err != nil {
		t.Fatalf("the JWT cancels its own run: %v", err)
	}
	if _, err := key.CancelRun(ctx, &planexv1.CancelRunRequest{RunId: victim.GetRun().GetId()}); err != nil {
		t.Fatalf("the API key cancels its own run: %v", err)
	}

	// Self-approval: an approver JWT named like the approver key is
	// another identity; the key's own run stays its own.
	approverKey := dial(f.APIKeys["approver"])
	approverJWT := dial(f.Token("apikey:approver-key", []string{"approver"}, nil))
	r, err := approverKey.StartRun(ctx, &planexv1.StartRunRequest{Goal: "list open tickets"})
	if err != nil {
		t.Fatal(err)
	}
	approve := &planexv1.DecideRequest{RunId: r.GetRun().GetId(), GateId: "g", Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE}
	if _, err := approverKey.Decide(ctx, approve); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("the key approves its own run: %v, want PermissionDenied", err)
	}
	if _, err := approverJWT.Decide(ctx, approve); status.Code(err) != codes.NotFound {
		t.Fatalf("the JWT decides the key's run: %v, want NotFound (no such gate: it is not the run's owner)", err)
	}
}
