package api

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
)

// TestApproverOutsideAGatesApproversIsToldWho: an approver who is not
// among a gate's approvers learns which approvers may decide it (the
// gate's policy), not the generic "lacks the role" answer that sends them
// looking for a role they hold; other refusals stay generic.
func TestApproverOutsideAGatesApproversIsToldWho(t *testing.T) {
	s := &Server{logger: slog.New(slog.DiscardHandler)}
	bob := authn.WithIdentity(context.Background(), authn.Identity{Subject: "apikey:bob", Roles: []authn.Role{authn.RoleApprover}})
	err := checkApprovers(bob, &planexv1.Gate{Id: "close.r1", Approvers: []string{"role:admin"}})
	if err == nil {
		t.Fatal("bob decided a gate only admins may decide")
	}
	st := status.Convert(s.status(bob, "Decide", err))
	if st.Code() != codes.PermissionDenied {
		t.Fatalf("code %s, want PermissionDenied", st.Code())
	}
	for _, want := range []string{"gate close.r1 may be decided by role:admin", "apikey:bob"} {
		if !strings.Contains(st.Message(), want) {
			t.Errorf("answer %q lacks %q", st.Message(), want)
		}
	}

	other := s.status(bob, "CancelRun", &deniedError{msg: "cancel run r started by apikey:alice: apikey:bob is not its owner nor admin"})
	if got := status.Convert(other).Message(); got != "permission denied" {
		t.Errorf("another refusal says %q, want the generic answer (its reason names another caller)", got)
	}
}
