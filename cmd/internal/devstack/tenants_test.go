package devstack

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
)

// TestTenantCredentials: EnsureTenant keeps a tenant's seeds (0600) across
// calls and restarts; the embedded server started with ConfigureNATS and
// ServeNATS serves JetStream to the stack's services ($G) and to a
// tenant's account; AdmitTenant adds a tenant without a restart or a
// reload, the connections stay up and the new account has JetStream at
// once.
func TestTenantCredentials(t *testing.T) {
	dataDir := t.TempDir()
	c, err := EnsureCredentials(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.EnsureTenant("default", nil); err == nil || !strings.Contains(err.Error(), "tenant") {
		t.Fatalf("EnsureTenant(default): %v, want an error naming the tenant", err)
	}
	if _, err := c.EnsureTenant("a", []string{"a.b"}); err == nil || !strings.Contains(err.Error(), "pool") {
		t.Fatalf("EnsureTenant(a, [a.b]): %v, want an error naming the pool", err)
	}
	a, err := c.EnsureTenant("a", []string{"sql"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Account != "planex-tenant-a" || len(a.SeedFiles) != 2 {
		t.Fatalf("tenant a: %+v", a)
	}
	for id, f := range a.SeedFiles {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 || f != filepath.Join(dataDir, "credentials", "nats", "tenants", "a", id+".nk") {
			t.Errorf("%s seed %s: %v %v, want mode 0600 under credentials/nats/tenants/a", id, f, fi, err)
		}
	}
	// A restart finds tenant a with the same keys; a pool is added.
	c, err = EnsureCredentials(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := c.EnsureTenant("a", []string{"email"})
	if err != nil {
		t.Fatal(err)
	}
	for id, pub := range a.PublicKeys {
		if a2.PublicKeys[id] != pub {
			t.Errorf("tenant a's %s key changed across EnsureCredentials/EnsureTenant", id)
		}
	}
	if len(a2.SeedFiles) != 3 {
		t.Errorf("tenant a after adding pool email: %v", a2.SeedFiles)
	}

	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: filepath.Join(dataDir, "nats"), NoSigs: true, NoLog: true}
	c.ConfigureNATS(opts)
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	if err := c.ServeNATS(ns); err != nil {
		t.Fatal(err)
	}
	connect := func(seedFile string) *nats.Conn {
		t.Helper()
		o, err := natsauth.Options{NKeySeedFile: seedFile}.NATSOptions()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		nc, err := bus.Connect(ctx, ns.ClientURL(), "planex-supervisor", slog.New(slog.NewTextHandler(io.Discard, nil)), o...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		if _, err := bus.Setup(ctx, nc, bus.Options{}); err != nil {
			t.Fatalf("setup with %s: %v", seedFile, err)
		}
		return nc
	}
	platform := connect(c.NATSSeedFiles["supervisor"])
	tenantA := connect(a2.SeedFiles["supervisor"])

	b, err := c.EnsureTenant("b", []string{"sql"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AdmitTenant("c"); err == nil {
		t.Error("AdmitTenant(c) without EnsureTenant: no error")
	}
	if err := c.AdmitTenant("b"); err != nil {
		t.Fatal(err)
	}
	connect(b.SeedFiles["supervisor"])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, nc := range map[string]*nats.Conn{"platform": platform, "tenant a": tenantA} {
		js, _ := jetstream.New(nc)
		if _, err := js.Publish(ctx, bus.RunLogSubject("r1"), []byte("x")); err != nil || nc.Stats().Reconnects != 0 {
			t.Errorf("%s after tenant b was admitted: %v, %d reconnects", name, err, nc.Stats().Reconnects)
		}
	}

	// A restart: a tenant the stack knows again (EnsureTenant, as the
	// supervisor's reconcile does) finds its account's streams on disk.
	platform.Close()
	tenantA.Close()
	ns.Shutdown()
	ns.WaitForShutdown()
	if c, err = EnsureCredentials(dataDir); err != nil {
		t.Fatal(err)
	}
	if _, err := c.EnsureTenant("a", nil); err != nil {
		t.Fatal(err)
	}
	opts = &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: filepath.Join(dataDir, "nats"), NoSigs: true, NoLog: true}
	c.ConfigureNATS(opts)
	if ns, err = server.NewServer(opts); err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready after the restart")
	}
	if err := c.ServeNATS(ns); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(connect(a2.SeedFiles["supervisor"]))
	name, err := js.StreamNameBySubject(ctx, bus.RunLogSubject("r1"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("tenant a's %s after a restart: %+v, %v; want the one message published before it", name, info, err)
	}
}
