package api

import (
	"context"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
)

func TestCheckApprovers(t *testing.T) {
	g := &planexv1.Gate{Id: "send.r1", Approvers: []string{"apikey:alice", "role:admin"}}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		ok   bool
	}{
		{"named approver", authn.WithIdentity(context.Background(), authn.Identity{Subject: "apikey:alice", Roles: []authn.Role{authn.RoleApprover}}), true},
		{"admin by role", authn.WithIdentity(context.Background(), authn.Identity{Subject: "apikey:root", Roles: []authn.Role{authn.RoleAdmin}}), true},
		{"other approver", authn.WithIdentity(context.Background(), authn.Identity{Subject: "apikey:bob", Roles: []authn.Role{authn.RoleApprover}}), false},
		{"no authentication", context.Background(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkApprovers(tc.ctx, g)
			if (err == nil) != tc.ok {
				t.Fatalf("checkApprovers: %v, want ok=%v", err, tc.ok)
			}
		})
	}
	if err := checkApprovers(authn.WithIdentity(context.Background(), authn.Identity{Subject: "apikey:bob"}), &planexv1.Gate{}); err != nil {
		t.Fatalf("a gate without approvers: %v", err)
	}
}
