package natsauth

import (
	"context"
	"errors"
	"fmt"
	"net"
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
)

func TestValidTenant(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"a", true}, {"acme-2", true}, {"a" + strings.Repeat("b", 30), true},
		{"default", false}, {"", false}, {"A", false}, {"1a", false}, {"-a", false},
		{"a.b", false}, {"a_b", false}, {"a>", false}, {"a" + strings.Repeat("b", 31), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidTenant(tc.name)
			if (err == nil) != tc.ok {
				t.Fatalf("ValidTenant(%q) = %v, want ok %v", tc.name, err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "tenant") {
				t.Errorf("error %q does not name the field tenant", err)
			}
		})
	}
	if got := TenantAccount("acme"); got != "planex-tenant-acme" {
		t.Errorf("TenantAccount(acme) = %q", got)
	}
}

// userKey is a fresh user nkey: its seed and public key.
func userKey(t *testing.T) (seed []byte, pub string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ = kp.Seed()
	pub, _ = kp.PublicKey()
	return seed, pub
}

func TestServerConfigWithTenants(t *testing.T) {
	platform := map[string]string{}
	for _, svc := range Services("sql", "email") {
		_, platform[svc] = userKey(t)
	}
	tenants := map[string]map[string]string{"a": {}, "b": {}}
	for _, tn := range []string{"a", "b"} {
		for _, svc := range TenantServices("sql") {
			_, tenants[tn][svc] = userKey(t)
		}
	}
	t.Run("no tenants renders ServerConfig", func(t *testing.T) {
		want, err := ServerConfig(platform)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ServerConfigWithTenants(platform, nil)
		if err != nil || got != want {
			t.Fatalf("ServerConfigWithTenants(platform, nil) = %v\n%s\nwant ServerConfig's\n%s", err, got, want)
		}
	})
	t.Run("loads in nats-server", func(t *testing.T) {
		conf, err := ServerConfigWithTenants(platform, tenants)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "auth.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		opts, err := server.ProcessConfigFile(path)
		if err != nil {
			t.Fatalf("nats-server rejects the config: %v\n%s", err, conf)
		}
		inAccount := map[string]int{}
		for _, u := range opts.Nkeys {
			acc := "$G"
			if u.Account != nil {
				acc = u.Account.Name
			}
			inAccount[acc]++
		}
		want := map[string]int{"$G": 4, "planex-tenant-a": 2, "planex-tenant-b": 2}
		if fmt.Sprint(inAccount) != fmt.Sprint(want) {
			t.Errorf("users per account %v, want %v", inAccount, want)
		}
	})
	t.Run("default account", func(t *testing.T) {
		want, err := ServerConfig(platform)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := ServerConfigWithOptions(platform, nil, ServerConfigOptions{DefaultAccount: true}); err != nil || got != want {
			t.Fatalf("without tenants = %v\n%s\nwant ServerConfig's (an installation without tenants keeps $G)\n%s", err, got, want)
		}
		_, adminPub := userKey(t)
		for name, tc := range map[string]struct {
			tenants map[string]map[string]string
			opts    ServerConfigOptions
			want    map[string]int
		}{
			"in planex-default":        {tenants, ServerConfigOptions{DefaultAccount: true}, map[string]int{"planex-default": 4, "planex-tenant-a": 2, "planex-tenant-b": 2}},
			"with an admin":            {tenants, ServerConfigOptions{DefaultAccount: true, Admin: adminPub}, map[string]int{"planex-default": 5, "planex-tenant-a": 2, "planex-tenant-b": 2}},
			"admin in $G":              {nil, ServerConfigOptions{DefaultAccount: true, Admin: adminPub}, map[string]int{"$G": 5}},
			"admin in $G with tenants": {tenants, ServerConfigOptions{Admin: adminPub}, map[string]int{"$G": 5, "planex-tenant-a": 2, "planex-tenant-b": 2}},
		} {
			t.Run(name, func(t *testing.T) {
				conf, err := ServerConfigWithOptions(platform, tc.tenants, tc.opts)
				if err != nil {
					t.Fatal(err)
				}
				path := filepath.Join(t.TempDir(), "auth.conf")
				if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
					t.Fatal(err)
				}
				opts, err := server.ProcessConfigFile(path)
				if err != nil {
					t.Fatalf("nats-server rejects the config: %v\n%s", err, conf)
				}
				inAccount := map[string]int{}
				for _, u := range opts.Nkeys {
					acc := "$G"
					if u.Account != nil {
						acc = u.Account.Name
					}
					inAccount[acc]++
					if u.Nkey == adminPub && u.Permissions != nil {
						t.Errorf("the admin has permissions %+v, want none (an account admin)", u.Permissions)
					}
					if u.Nkey != adminPub && u.Permissions == nil {
						t.Errorf("user %s has no permissions", u.Nkey)
					}
				}
				if fmt.Sprint(inAccount) != fmt.Sprint(tc.want) {
					t.Errorf("users per account %v, want %v\n%s", inAccount, tc.want, conf)
				}
			})
		}
		for name, tc := range map[string]struct {
			admin, want string
		}{
			"admin not a user key": {"SUABC", `admin nkey "SUABC": want a user public nkey`},
			"admin reused":         {platform[Supervisor], "admin nkey: already used by identity supervisor"},
		} {
			t.Run(name, func(t *testing.T) {
				_, err := ServerConfigWithOptions(platform, tenants, ServerConfigOptions{DefaultAccount: true, Admin: tc.admin})
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want one containing %q", err, tc.want)
				}
			})
		}
	})
	for name, tc := range map[string]struct {
		tenants map[string]map[string]string
		want    string
	}{
		"reserved default": {map[string]map[string]string{"default": {"supervisor": platform["supervisor"] + "X"}}, `tenant "default": reserved`},
		"bad name":         {map[string]map[string]string{"A b": {}}, `tenant "A b"`},
		"planner":          {map[string]map[string]string{"a": {"planner": tenants["a"]["supervisor"]}}, "the planner has no identity"},
		"key reused":       {map[string]map[string]string{"a": {"supervisor": platform["supervisor"]}}, "nkey already used by identity supervisor"},
		"bad pool":         {map[string]map[string]string{"a": {"executor-a.b": tenants["a"]["supervisor"]}}, "not a subject token"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ServerConfigWithTenants(platform, tc.tenants)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestGlobalAccountJetStream records what ServerConfigWithTenants' doc
// says about $G: a server started from a configuration with tenant
// accounts has no JetStream in $G until EnableGlobalJetStream; one
// reloaded into such a configuration keeps it until its next restart;
// EnableGlobalJetStream's JetStream survives reloads that add tenants,
// and $G's streams written before are found again. If a nats-server
// upgrade makes the first step pass, revisit that doc.
func TestGlobalAccountJetStream(t *testing.T) {
	dir := t.TempDir()
	port := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}()
	gSeed, gPub := userKey(t)
	platform := map[string]string{Supervisor: gPub}
	tenants := map[string]map[string]string{}
	seeds := map[string][]byte{"$G": gSeed}
	addTenant := func(tn string) {
		seed, pub := userKey(t)
		tenants[tn] = map[string]string{Supervisor: pub}
		seeds[tn] = seed
	}
	conf := filepath.Join(dir, "nats.conf")
	write := func() {
		auth, err := ServerConfigWithTenants(platform, tenants)
		if err != nil {
			t.Fatal(err)
		}
		c := fmt.Sprintf("listen: \"127.0.0.1:%d\"\njetstream { store_dir: %q }\n%s", port, filepath.Join(dir, "js"), auth)
		if err := os.WriteFile(conf, []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	start := func() *server.Server {
		opts, err := server.ProcessConfigFile(conf)
		if err != nil {
			t.Fatal(err)
		}
		opts.NoLog, opts.NoSigs = true, true
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats not ready")
		}
		return s
	}
	// stream creates (or finds) stream S as who and returns its message
	// count, or the JetStream error.
	stream := func(s *server.Server, who string) (uint64, error) {
		kp, err := nkeys.FromSeed(seeds[who])
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		nc, err := nats.Connect(s.ClientURL(), nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(bus.InboxPrefix(Supervisor)))
		if err != nil {
			t.Fatalf("connect as %s: %v", who, err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "PLANEX_EVENTS", Subjects: []string{"planex.events.>"}})
		if err != nil {
			return 0, err
		}
		return st.CachedInfo().State.Msgs, nil
	}
	notEnabled := func(err error) bool {
		var apiErr *jetstream.APIError
		return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeJetStreamNotEnabledForAccount
	}

	// The upgrade path: $G alone, a stream with a message in it.
	write()
	s := start()
	if _, err := stream(s, "$G"); err != nil {
		t.Fatalf("$G alone: %v", err)
	}
	nc, err := nats.Connect(s.ClientURL(), nats.Nkey(gPub, func(b []byte) ([]byte, error) {
		kp, _ := nkeys.FromSeed(gSeed)
		return kp.Sign(b)
	}), nats.CustomInboxPrefix(bus.InboxPrefix(Supervisor)))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.Publish(context.Background(), "planex.events.r1.log", []byte("x")); err != nil {
		t.Fatal(err)
	}
	nc.Close()

	// Reloaded with a tenant: $G keeps JetStream (its start-up limits).
	addTenant("a")
	write()
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if n, err := stream(s, "$G"); err != nil || n != 1 {
		t.Fatalf("$G after the reload adding tenant a: %d messages, %v; want 1", n, err)
	}
	if _, err := stream(s, "a"); err != nil {
		t.Fatalf("tenant a after the reload: %v", err)
	}

	// Restarted from that file: $G has lost JetStream.
	s.Shutdown()
	s.WaitForShutdown()
	s = start()
	if _, err := stream(s, "$G"); !notEnabled(err) {
		t.Fatalf("$G after a restart with tenant accounts: %v, want JetStream not enabled for account (has nats-server changed? revisit ServerConfigWithTenants' doc)", err)
	}
	if _, err := stream(s, "a"); err != nil {
		t.Fatalf("tenant a after the restart: %v", err)
	}

	// EnableGlobalJetStream gives it back with its stream, and it holds
	// across a reload adding another tenant.
	if err := EnableGlobalJetStream(s); err != nil {
		t.Fatal(err)
	}
	if err := EnableGlobalJetStream(s); err != nil {
		t.Fatalf("second EnableGlobalJetStream: %v", err)
	}
	if n, err := stream(s, "$G"); err != nil || n != 1 {
		t.Fatalf("$G after EnableGlobalJetStream: %d messages, %v; want its stream back with 1", n, err)
	}
	addTenant("b")
	write()
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{"$G", "a", "b"} {
		if _, err := stream(s, who); err != nil {
			t.Fatalf("%s after the reload adding tenant b: %v", who, err)
		}
	}
}
