package api

import (
	"context"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
)

// TestNamespacedOwners: a JWT whose sub is "apikey:<name>" can neither
// cancel that key's run, nor pass for it among a gate's approvers, nor be
// refused as if it had started that key's run; a JWT caller keeps owning
// the runs it started before subjects were namespaced (started_by is its
// bare sub) and bare approver names keep naming JWT subs.
func TestNamespacedOwners(t *testing.T) {
	as := func(id authn.Identity) context.Context { return authn.WithIdentity(context.Background(), id) }
	jwt := func(sub string, roles ...authn.Role) context.Context {
		return as(authn.Identity{Subject: "jwt:https://idp:" + sub, LegacySubject: sub, Method: authn.MethodJWT, Roles: roles})
	}
	keyRun := &planexv1.Run{Id: "r-key", StartedBy: "apikey:ci"}
	certRun := &planexv1.Run{Id: "r-cert", StartedBy: "cert:abe"}
	legacyRun := &planexv1.Run{Id: "r-old", StartedBy: "alice"}
	newRun := &planexv1.Run{Id: "r-new", StartedBy: "jwt:https://idp:alice"}
	anonRun := &planexv1.Run{Id: "r-anon"}

	cancels := []struct {
		name string
		ctx  context.Context
		run  *planexv1.Run
		ok   bool
	}{
		{"JWT sub apikey:ci cancels the key's run", jwt("apikey:ci", authn.RoleRunner), keyRun, false},
		{"JWT sub cert:abe cancels the certificate's run", jwt("cert:abe", authn.RoleRunner), certRun, false},
		{"the API key cancels its run", as(authn.Identity{Subject: "apikey:ci", Method: authn.MethodAPIKey, Roles: []authn.Role{authn.RoleRunner}}), keyRun, true},
		{"JWT alice cancels her pre-upgrade run", jwt("alice", authn.RoleRunner), legacyRun, true},
		{"JWT alice cancels her run", jwt("alice", authn.RoleRunner), newRun, true},
		{"JWT bob cancels alice's run", jwt("bob", authn.RoleRunner), legacyRun, false},
		{"API key named alice cancels the pre-upgrade JWT run", as(authn.Identity{Subject: "apikey:alice", Method: authn.MethodAPIKey, Roles: []authn.Role{authn.RoleRunner}}), legacyRun, false},
		{"runner cancels a run without owner", jwt("alice", authn.RoleRunner), anonRun, false},
		{"admin cancels any run", jwt("root", authn.RoleAdmin), keyRun, true},
	}
	for _, tc := range cancels {
		t.Run("cancel/"+tc.name, func(t *testing.T) {
			if err := checkCancel(tc.ctx, tc.run); (err == nil) != tc.ok {
				t.Fatalf("checkCancel: %v, want ok=%v", err, tc.ok)
			}
		})
	}

	s := &Server{}
	approve := planexv1.DecisionKind_DECISION_KIND_APPROVE
	decides := []struct {
		name string
		ctx  context.Context
		run  *planexv1.Run
		ok   bool
	}{
		{"JWT sub apikey:ci approves the key's run (not self)", jwt("apikey:ci", authn.RoleApprover), keyRun, true},
		{"JWT alice approves her pre-upgrade run (self)", jwt("alice", authn.RoleApprover), legacyRun, false},
		{"JWT alice approves her run (self)", jwt("alice", authn.RoleApprover), newRun, false},
		{"API key approves its run (self)", as(authn.Identity{Subject: "apikey:ci", Method: authn.MethodAPIKey, Roles: []authn.Role{authn.RoleApprover}}), keyRun, false},
	}
	for _, tc := range decides {
		t.Run("self-approval/"+tc.name, func(t *testing.T) {
			if err := s.checkDecide(tc.ctx, tc.run, approve); (err == nil) != tc.ok {
				t.Fatalf("checkDecide: %v, want ok=%v", err, tc.ok)
			}
		})
	}

	gate := &planexv1.Gate{Id: "send.r1", Approvers: []string{"apikey:ci", "cert:abe", "alice", "jwt:https://idp:carol", "role:admin"}}
	approvers := []struct {
		name string
		ctx  context.Context
		ok   bool
	}{
		{"JWT sub apikey:ci", jwt("apikey:ci", authn.RoleApprover), false},
		{"JWT sub cert:abe", jwt("cert:abe", authn.RoleApprover), false},
		{"JWT sub role:admin", jwt("role:admin", authn.RoleApprover), false},
		{"the API key", as(authn.Identity{Subject: "apikey:ci", Method: authn.MethodAPIKey, Roles: []authn.Role{authn.RoleApprover}}), true},
		{"the certificate", as(authn.Identity{Subject: "cert:abe", Method: authn.MethodMTLS, Roles: []authn.Role{authn.RoleApprover}}), true},
		{"bare name: JWT alice", jwt("alice", authn.RoleApprover), true},
		{"bare name: API key alice", as(authn.Identity{Subject: "apikey:alice", Method: authn.MethodAPIKey, Roles: []authn.Role{authn.RoleApprover}}), false},
		{"namespaced JWT carol", jwt("carol", authn.RoleApprover), true},
		{"admin by role", jwt("root", authn.RoleAdmin), true},
	}
	for _, tc := range approvers {
		t.Run("approvers/"+tc.name, func(t *testing.T) {
			if err := checkApprovers(tc.ctx, gate); (err == nil) != tc.ok {
				t.Fatalf("checkApprovers: %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
