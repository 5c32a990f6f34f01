package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
)

// `planex auth nats-config` with tenants prints a file a stock nats-server
// starts from: the default tenant's supervisor and a tenant's supervisor
// each reach JetStream, each in an account of its own (a tenant sees
// nothing of the default tenant's streams); bad flags are refused naming
// the flag.
func TestNATSConfigTenants(t *testing.T) {
	type user struct {
		kp  nkeys.KeyPair
		pub string
	}
	newUser := func() user {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		return user{kp, pub}
	}
	sup, tenantSup, tenantSQL, admin := newUser(), newUser(), newUser(), newUser()
	auth, err := planexIn(t, "auth", "nats-config", "--nkey", "supervisor="+sup.pub,
		"--tenant-nkey", "team-a:supervisor="+tenantSup.pub, "--tenant-nkey", "team-a:executor-sql="+tenantSQL.pub,
		"--admin-nkey", admin.pub)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{natsauth.DefaultAccount, natsauth.TenantAccount("team-a"), tenantSQL.pub, admin.pub} {
		if !strings.Contains(auth, want) {
			t.Errorf("the file does not name %s:\n%s", want, auth)
		}
	}

	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "listen: \"127.0.0.1:-1\"\njetstream { store_dir: %q }\n%s", filepath.Join(dir, "js"), auth), 0o600); err != nil {
		t.Fatal(err)
	}
	s := serveConf(t, conf)
	connect := func(u user) jetstream.JetStream {
		t.Helper()
		nc, err := nats.Connect(s.ClientURL(), nats.Nkey(u.pub, u.kp.Sign), nats.CustomInboxPrefix(bus.InboxPrefix(natsauth.Supervisor)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	// The default tenant's supervisor: JetStream in its account.
	def := connect(sup)
	if _, err := def.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: bus.StreamEvents, Subjects: []string{"planex.events.>"}}); err != nil {
		t.Fatalf("the default tenant's supervisor: %v", err)
	}
	if _, err := def.Publish(ctx, "planex.events.r1.log", []byte("default")); err != nil {
		t.Fatal(err)
	}
	// The tenant's supervisor: JetStream in its own account, where the
	// default tenant's stream is not.
	ten := connect(tenantSup)
	if _, err := ten.Stream(ctx, bus.StreamEvents); err == nil {
		t.Fatal("the tenant's supervisor sees the default tenant's stream")
	}
	st, err := ten.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: bus.StreamEvents, Subjects: []string{"planex.events.>"}})
	if err != nil {
		t.Fatalf("the tenant's supervisor: %v", err)
	}
	if n := st.CachedInfo().State.Msgs; n != 0 {
		t.Fatalf("the tenant's %s holds %d messages, want its own (none)", bus.StreamEvents, n)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tenant-nkey", "team-a=" + tenantSup.pub}, "--tenant-nkey"},
		{[]string{"--tenant-nkey", "Team A:supervisor=" + tenantSup.pub}, "--tenant-nkey"},
		{[]string{"--tenant-nkey", "team-a:executor-sql=" + tenantSQL.pub}, "tenant team-a has no supervisor"},
		{[]string{"--tenant-nkey", "team-a:supervisor=" + tenantSup.pub, "--tenant-nkey", "team-a:supervisor=" + tenantSQL.pub}, "given twice"},
		{[]string{"--tenant-nkey", "team-a:supervisor=" + sup.pub}, "already used"},
		{[]string{"--tenant-nkey", "team-a:planner=" + tenantSup.pub, "--tenant-nkey", "team-a:supervisor=" + tenantSQL.pub}, "planner"},
		{[]string{"--admin-nkey", "SUAB"}, "--admin-nkey"},
	} {
		out, err := planexIn(t, append([]string{"auth", "nats-config", "--nkey", "supervisor=" + sup.pub}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("nats-config %q: %v (output %d bytes); want an error naming %q", tc.args, err, len(out), tc.want)
		}
		if out != "" {
			t.Errorf("nats-config %q printed a file with its error", tc.args)
		}
	}
}

// serveConf starts a nats-server from the configuration file conf (the
// test fails when nats-server refuses it) and stops it when the test ends.
func serveConf(t *testing.T, conf string) *server.Server {
	t.Helper()
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		b, _ := os.ReadFile(conf)
		t.Fatalf("nats-server refuses %s: %v\n%s", conf, err, b)
	}
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return s
}
