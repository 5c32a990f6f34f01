package main

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/natstest"
)

// connectAs is bus.Connect and bus.Setup as a tenant's identity of ts
// (its streams and buckets created, or found).
func connectAs(t *testing.T, ts *natstest.Tenants, tenant, identity string) *bus.Resources {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	opts, err := natsauth.Options{NKeySeedFile: ts.SeedFile(t, tenant, identity)}.NATSOptions()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := bus.Connect(ctx, ts.URL(), "planex-"+identity, natstest.Logger(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	res, err := bus.Setup(ctx, nc, bus.Options{})
	if err != nil {
		t.Fatalf("tenant %s: setup as %s: %v", tenant, identity, err)
	}
	return res
}

// TestMoveDefaultTenantIntoItsAccount is the one-time move of
// docs/tenancy.md ("Adding the first tenant to an existing installation")
// on one server and its store directory: an installation without tenants
// (the default tenant in $G, as today, plus an account admin) holds a run
// and an idempotency key; `planex backup` as the admin; the server
// restarts from the configuration with tenant a, where the default tenant
// is in planex-default and its old streams stay behind in $G; `planex
// restore` as the default tenant's supervisor is refused (a service's
// confined identity may not send a restore's archive), as the admin it
// restores; then the run's log verifies and its snapshot and the key are
// there for the default tenant's supervisor, and tenant a's supervisor
// sees none of it.
func TestMoveDefaultTenantIntoItsAccount(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	ts := natstest.StartTenants(t, []string{"sql"}, nil, natstest.InDefaultAccount(), natstest.WithAdmin())
	if ts.Servers()[0].GlobalAccount().JetStreamEnabled() != true {
		t.Fatal("without tenants the default tenant's $G has no JetStream")
	}
	const run, key = "run-moved", "idem-moved"
	res := connectAs(t, ts, natsauth.DefaultTenant, natsauth.Supervisor)
	auditRun(t, res, run)
	if _, err := res.Idempotency.Put(ctx, key, []byte(run)); err != nil {
		t.Fatal(err)
	}
	res.JS.Conn().Close()

	supervisor := "--nats-nkey-file=" + ts.SeedFile(t, natsauth.DefaultTenant, natsauth.Supervisor)
	admin := []string{"--nats-url=" + ts.URL(), "--nats-nkey-file=" + ts.SeedFile(t, natsauth.DefaultTenant, natsauth.AccountAdmin), "--nats-identity=" + natsauth.AccountAdmin}
	dir := filepath.Join(t.TempDir(), "backup")
	if out, code := planexCLI(t, append([]string{"backup", "--out=" + dir}, admin...)...); code != 0 || !strings.Contains(out, "backed up") {
		t.Fatalf("planex backup as the admin of $G: exit %d\n%s", code, out)
	}

	ts.DeclareTenant(t, "a", "sql")
	ts.Restart(t)
	if ts.Servers()[0].GlobalAccount().JetStreamEnabled() {
		t.Fatal("$G has JetStream after the restart with tenants")
	}
	opts, err := natsauth.Options{NKeySeedFile: ts.SeedFile(t, natsauth.DefaultTenant, natsauth.Supervisor)}.NATSOptions()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := bus.Connect(ctx, ts.URL(), "planex-supervisor", natstest.Logger(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(ctx, bus.StreamEvents); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("planex-default before the restore: %s: %v, want none (the data is in $G's store)", bus.StreamEvents, err)
	}
	nc.Close()
	in := []string{"restore", "--in=" + dir, "--replicas=1", "--timeout=2s", "--nats-url=" + ts.URL()}
	if out, code := planexCLI(t, append(in, supervisor, "--nats-identity="+natsauth.Supervisor)...); code == 0 {
		t.Fatalf("planex restore as the default tenant's supervisor succeeded, want it refused (no publish to $JS.SNAPSHOT.RESTORE.>):\n%s", out)
	} else {
		t.Logf("planex restore as the supervisor: exit %d\n%s", code, out)
	}
	restore := append(in, admin[1:]...)
	out, code := planexCLI(t, restore...)
	if code != 0 || !strings.Contains(out, "1 runs: 1 logs verified") {
		t.Fatalf("planex restore as the admin of planex-default: exit %d\n%s", code, out)
	}

	if out, code := planexCLI(t, "audit", "verify", run, "--nats-url="+ts.URL(), supervisor); code != 0 || !strings.Contains(out, "verified") {
		t.Errorf("planex audit verify %s as the default tenant's supervisor: exit %d\n%s", run, code, out)
	}
	res = connectAs(t, ts, natsauth.DefaultTenant, natsauth.Supervisor)
	if _, err := res.Runs.Get(ctx, run); err != nil {
		t.Errorf("run snapshot in planex-default: %v", err)
	}
	if e, err := res.Idempotency.Get(ctx, key); err != nil || string(e.Value()) != run {
		t.Errorf("idempotency key in planex-default: %v", err)
	}
	tenant := connectAs(t, ts, "a", natsauth.Supervisor)
	if st, err := tenant.JS.Stream(ctx, bus.StreamEvents); err != nil || st.CachedInfo().State.Msgs != 0 {
		t.Errorf("tenant a's %s: %v, want it empty", bus.StreamEvents, err)
	}
	if _, err := tenant.Runs.Get(ctx, run); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("tenant a's run snapshot of %s: %v, want not found", run, err)
	}
	if _, err := tenant.Idempotency.Get(ctx, key); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("tenant a's idempotency key: %v, want not found", err)
	}
}
