package tenant

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/natstest"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tenant *planexv1.Tenant
		want   string // substring of the error; "" = valid
	}{
		{"ok", &planexv1.Tenant{Name: "acme", Pools: []string{"acme-sql"}}, ""},
		{"nil", nil, "tenant: required"},
		{"default", &planexv1.Tenant{Name: "default"}, "tenant.name"},
		{"upper", &planexv1.Tenant{Name: "Acme"}, "tenant.name"},
		{"long", &planexv1.Tenant{Name: strings.Repeat("a", 32)}, "tenant.name"},
		{"pool", &planexv1.Tenant{Name: "acme", Pools: []string{"a.b"}}, "tenant.pools[0]"},
		{"pool twice", &planexv1.Tenant{Name: "acme", Pools: []string{"x", "x"}}, "tenant.pools[1]"},
		{"subject", &planexv1.Tenant{Name: "acme", Members: &planexv1.TenantMembers{Subjects: []string{"bob"}}}, "tenant.members.subjects[0]"},
		{"quota", &planexv1.Tenant{Name: "acme", Quotas: &planexv1.TenantQuotas{MaxConcurrentRuns: -1}}, "max_concurrent_runs"},
		{"pool quota", &planexv1.Tenant{Name: "acme", Quotas: &planexv1.TenantQuotas{PoolStepsInFlight: map[string]int32{"sql": -2}}}, "pool_steps_in_flight[sql]"},
		{"policy", &planexv1.Tenant{Name: "acme", Policies: "rules: [{"}, "tenant.policies"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.tenant)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	tenants := []*planexv1.Tenant{
		{Name: "acme", Members: &planexv1.TenantMembers{JwtClaimValues: []string{"org-17"}, Subjects: []string{"apikey:ci-acme"}}},
		{Name: "beta"},
	}
	for _, tc := range []struct {
		id   authn.Identity
		want string
		err  error
	}{
		{authn.Identity{Subject: "apikey:ops"}, Default, nil},
		{authn.Identity{Subject: "apikey:ci-acme"}, "acme", nil},
		{authn.Identity{Subject: "jwt:iss:u1", Method: authn.MethodJWT, Tenant: "org-17"}, "acme", nil},
		{authn.Identity{Subject: "apikey:b", Tenant: "beta"}, "beta", nil},
		{authn.Identity{Subject: "apikey:b", Tenant: "default"}, Default, nil},
		{authn.Identity{Subject: "apikey:ci-acme", Tenant: "gone"}, "", ErrUnknownTenant},
	} {
		got, err := Resolve(tc.id, tenants)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("Resolve(%v) = %q, %v; want %q, %v", tc.id, got, err, tc.want, tc.err)
		}
	}
}

func TestRegistry(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := res.TenantsBucket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry(kv)
	changes := reg.Changes()
	go func() { _ = reg.Run(ctx) }()
	<-reg.Ready()

	created, err := reg.Create(ctx, &planexv1.Tenant{Name: "acme", Members: &planexv1.TenantMembers{Subjects: []string{"apikey:ci-acme"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Create(ctx, &planexv1.Tenant{Name: "acme"}); !errors.Is(err, ErrExists) {
		t.Fatalf("second Create: %v, want ErrExists", err)
	}
	waitFor(t, changes, func() bool { return reg.Cached("acme") != nil })
	if got, _ := reg.Resolve(authn.Identity{Subject: "apikey:ci-acme"}); got != "acme" {
		t.Fatalf("Resolve = %q, want acme", got)
	}
	upd := &planexv1.Tenant{Name: "acme", Description: "team A", Revision: created.GetRevision()}
	if _, err := reg.Update(ctx, upd); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Update(ctx, upd); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale Update: %v, want ErrConflict", err)
	}
	got, err := reg.Get(ctx, "acme")
	if err != nil || got.GetDescription() != "team A" || got.GetCreateTime() == nil {
		t.Fatalf("Get = %v, %v", got, err)
	}
	if err := reg.Delete(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Get(ctx, "acme"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Delete: %v, want ErrNotFound", err)
	}
	waitFor(t, changes, func() bool { return reg.Cached("acme") == nil })
	if got, _ := reg.Resolve(authn.Identity{Subject: "apikey:ci-acme"}); got != Default {
		t.Fatalf("Resolve after Delete = %q, want default", got)
	}
}

func waitFor(t *testing.T, changes <-chan struct{}, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-changes:
		case <-deadline:
			t.Fatal("registry cache did not catch up within 10s")
		}
	}
}

func TestParseFile(t *testing.T) {
	list, err := ParseFile([]byte(`
- name: team-a
  retention: 720h
- name: team-b
  budget: {maxDuration: 1h30m}
`))
	if err != nil || list[0].GetRetention().AsDuration() != 720*time.Hour || list[1].GetBudget().GetMaxDuration().AsDuration() != 90*time.Minute {
		t.Fatalf("ParseFile with Go durations = %v, %v", list, err)
	}
	list, err = ParseFile([]byte(`
- name: team-a
  pools: [team-a-sql]
  quotas: {maxConcurrentRuns: 20, poolStepsInFlight: {team-a-sql: 4}}
  retention: 2592000s
- name: team-b
  members: {jwt_claim_values: [org-b]}
`))
	if err != nil || len(list) != 2 || list[0].GetQuotas().GetPoolStepsInFlight()["team-a-sql"] != 4 || list[1].GetMembers().GetJwtClaimValues()[0] != "org-b" {
		t.Fatalf("ParseFile = %v, %v", list, err)
	}
	if _, err := ParseFile([]byte("- name: x\n- name: x\n")); err == nil || !strings.Contains(err.Error(), "also entry 0") {
		t.Fatalf("duplicate: %v", err)
	}
	if _, err := ParseFile([]byte("- name: Bad\n")); err == nil || !strings.Contains(err.Error(), "tenant.name") {
		t.Fatalf("bad name: %v", err)
	}
}

func TestApply(t *testing.T) {
	srv := natstest.Start(t)
	_, res := srv.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := res.TenantsBucket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry(kv)
	list := []*planexv1.Tenant{{Name: "team-a"}, {Name: "team-b", Description: "b"}}
	if c, u, err := reg.Apply(ctx, list); err != nil || c != 2 || u != 0 {
		t.Fatalf("Apply = %d created, %d updated, %v", c, u, err)
	}
	if c, u, err := reg.Apply(ctx, list); err != nil || c != 0 || u != 0 {
		t.Fatalf("Apply again = %d created, %d updated, %v; want nothing to do", c, u, err)
	}
	list[1].Description = "team b"
	if c, u, err := reg.Apply(ctx, list[1:]); err != nil || c != 0 || u != 1 {
		t.Fatalf("Apply changed = %d created, %d updated, %v", c, u, err)
	}
	if _, err := reg.Get(ctx, "team-a"); err != nil {
		t.Fatalf("team-a, absent from the second list, must stay: %v", err)
	}
}
