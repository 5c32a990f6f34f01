package natstest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/freeport"
	"github.com/planex-dev/planex/internal/natsauth"
)

// Tenants are embedded JetStream servers — one, or a cluster routed on
// loopback — started from a nats-server configuration file whose
// authorization natsauth.ServerConfigWithOptions renders: the default
// tenant's nkey users (supervisor, planner, executor-<pool>) in the global
// account (or, with InDefaultAccount, in natsauth.DefaultAccount), and
// every other tenant in its own JetStream account (natsauth.TenantAccount)
// with its supervisor and executor-<pool> users, all with their
// natsauth.ForService permissions. Tenants are added with a configuration
// reload of every node (AddTenant), or declared and applied by a restart
// (DeclareTenant, Restart).
type Tenants struct {
	// Name is the cluster's name (also the prefix of its server names).
	Name string

	defaultAccount bool // natsauth.ServerConfigOptions.DefaultAccount
	admin          bool // the default tenant has a natsauth.AccountAdmin

	dir          string
	clientPorts  []int
	clusterPorts []int
	servers      []*server.Server

	mu    sync.Mutex
	seeds map[string]map[string]string // tenant → identity → seed file
	pubs  map[string]map[string]string // tenant → identity → public nkey
}

// TenantsOption changes how StartTenants and StartTenantCluster render
// the configuration.
type TenantsOption func(*Tenants)

// InDefaultAccount renders the default tenant, once there are tenants, in
// natsauth.DefaultAccount (natsauth.ServerConfigOptions.DefaultAccount) —
// what a stock nats-server is given — rather than in $G kept alive by
// natsauth.EnableGlobalJetStream: the servers then run from the file
// alone, as a stock nats-server would. Without tenants the default tenant
// is in $G, as in an installation without tenants.
func InDefaultAccount() TenantsOption { return func(ts *Tenants) { ts.defaultAccount = true } }

// WithAdmin gives the default tenant's account an account admin,
// natsauth.AccountAdmin (natsauth.ServerConfigOptions.Admin): its seed is
// SeedFile(t, natsauth.DefaultTenant, natsauth.AccountAdmin).
func WithAdmin() TenantsOption { return func(ts *Tenants) { ts.admin = true } }

// StartTenants starts one embedded JetStream server from a tenant
// configuration: defaultPools are the executor pools of the default
// tenant (global account), tenants maps every other tenant to its pools.
// It stops the server when the test ends.
func StartTenants(t testing.TB, defaultPools []string, tenants map[string][]string, opts ...TenantsOption) *Tenants {
	t.Helper()
	return startTenants(t, 1, defaultPools, tenants, opts)
}

// StartTenantCluster is StartTenants with a cluster of n nodes (3 for R3
// streams in every account): it waits until every node is routed to the
// others and JetStream answers in every account through every node.
func StartTenantCluster(t testing.TB, n int, defaultPools []string, tenants map[string][]string, opts ...TenantsOption) *Tenants {
	t.Helper()
	return startTenants(t, n, defaultPools, tenants, opts)
}

func startTenants(t testing.TB, n int, defaultPools []string, tenants map[string][]string, opts []TenantsOption) *Tenants {
	t.Helper()
	if n < 1 {
		t.Fatalf("natstest: %d nodes", n)
	}
	ts := &Tenants{
		Name: fmt.Sprintf("planex-tenants-%d", time.Now().UnixNano()%1_000_000_000),
		dir:  t.TempDir(), seeds: map[string]map[string]string{}, pubs: map[string]map[string]string{},
	}
	for _, o := range opts {
		o(ts)
	}
	for range n {
		ts.clientPorts = append(ts.clientPorts, freeport.Port(t))
		if n > 1 {
			ts.clusterPorts = append(ts.clusterPorts, freeport.Port(t))
		}
	}
	ts.addIdentities(t, natsauth.DefaultTenant, natsauth.Services(defaultPools...))
	if ts.admin {
		ts.addIdentities(t, natsauth.DefaultTenant, []string{natsauth.AccountAdmin})
	}
	names := make([]string, 0, len(tenants))
	for tn := range tenants {
		names = append(names, tn)
	}
	slices.Sort(names)
	for _, tn := range names {
		if err := natsauth.ValidTenant(tn); err != nil {
			t.Fatalf("natstest: %v", err)
		}
		ts.addIdentities(t, tn, natsauth.TenantServices(tenants[tn]...))
	}
	t.Cleanup(ts.Shutdown)
	ts.start(t)
	return ts
}

// start starts every node from its configuration file as it stands and
// waits until JetStream answers in every tenant's account.
func (ts *Tenants) start(t testing.TB) {
	t.Helper()
	servers := make([]*server.Server, len(ts.clientPorts))
	for i := range servers {
		srv, err := server.NewServer(ts.options(t, i))
		if err != nil {
			t.Fatalf("natstest: node %d: %v", i, err)
		}
		go srv.Start()
		servers[i] = srv
	}
	ts.mu.Lock()
	ts.servers = servers
	ts.mu.Unlock()
	for _, srv := range servers {
		if !srv.ReadyForConnections(20 * time.Second) {
			t.Fatalf("natstest: node %s not ready within 20s", srv.Name())
		}
		if ts.defaultAccount {
			continue // as a stock nats-server: the file alone
		}
		// The accounts block leaves $G without JetStream (natsauth.ServerConfigWithTenants).
		if err := natsauth.EnableGlobalJetStream(srv); err != nil {
			t.Fatalf("natstest: node %s: %v", srv.Name(), err)
		}
	}
	if err := ts.waitJetStream(60*time.Second, ts.TenantNames()...); err != nil {
		t.Fatalf("natstest: %s: %v", ts.Name, err)
	}
}

// Restart stops every node and starts it again from its configuration
// file rewritten from the tenants as they stand (DeclareTenant's included),
// on the same ports and store directories — what a stock nats-server's
// restart (a pod's) does — and waits until JetStream answers in every
// tenant's account. Connections reconnect.
func (ts *Tenants) Restart(t testing.TB) {
	t.Helper()
	ts.Shutdown()
	ts.start(t)
}

// DeclareTenant gives tenant (with its supervisor and an executor
// identity per pool) an account in the configuration without applying
// it: the next Reload or Restart does.
func (ts *Tenants) DeclareTenant(t testing.TB, tenant string, pools ...string) {
	t.Helper()
	if err := natsauth.ValidTenant(tenant); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	ts.addIdentities(t, tenant, natsauth.TenantServices(pools...))
}

// addIdentities makes an nkey, kept in a seed file, for each identity of
// tenant that has none yet.
func (ts *Tenants) addIdentities(t testing.TB, tenant string, identities []string) {
	t.Helper()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.seeds[tenant] == nil {
		ts.seeds[tenant], ts.pubs[tenant] = map[string]string{}, map[string]string{}
	}
	dir := filepath.Join(ts.dir, "seeds", tenant)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, id := range identities {
		if _, ok := ts.seeds[tenant][id]; ok {
			continue
		}
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		file := filepath.Join(dir, id+".nk")
		if err := os.WriteFile(file, seed, 0o600); err != nil {
			t.Fatal(err)
		}
		ts.seeds[tenant][id], ts.pubs[tenant][id] = file, pub
	}
}

// Config is node i's configuration file as it stands (the tenants' current
// authorization).
func (ts *Tenants) Config(t testing.TB, i int) string {
	t.Helper()
	ts.mu.Lock()
	opts := natsauth.ServerConfigOptions{DefaultAccount: ts.defaultAccount}
	platform := map[string]string{}
	for id, pub := range ts.pubs[natsauth.DefaultTenant] {
		if id == natsauth.AccountAdmin {
			opts.Admin = pub
			continue
		}
		platform[id] = pub
	}
	tenants := map[string]map[string]string{}
	for tn, p := range ts.pubs {
		if tn != natsauth.DefaultTenant {
			tenants[tn] = p
		}
	}
	auth, err := natsauth.ServerConfigWithOptions(platform, tenants, opts)
	ts.mu.Unlock()
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %q\nlisten: \"127.0.0.1:%d\"\njetstream { store_dir: %q }\n",
		fmt.Sprintf("%s-%d", ts.Name, i), ts.clientPorts[i], filepath.Join(ts.dir, "store-"+strconv.Itoa(i)))
	if len(ts.clusterPorts) > 0 {
		routes := make([]string, len(ts.clusterPorts))
		for j, p := range ts.clusterPorts {
			routes[j] = strconv.Quote("nats://127.0.0.1:" + strconv.Itoa(p))
		}
		fmt.Fprintf(&b, "cluster {\n  name: %q\n  listen: \"127.0.0.1:%d\"\n  routes: [%s]\n}\n", ts.Name, ts.clusterPorts[i], strings.Join(routes, ", "))
	}
	b.WriteString(auth)
	return b.String()
}

// options writes node i's configuration file and loads it the way
// nats-server does.
func (ts *Tenants) options(t testing.TB, i int) *server.Options {
	t.Helper()
	file := filepath.Join(ts.dir, fmt.Sprintf("nats-%d.conf", i))
	if err := os.WriteFile(file, []byte(ts.Config(t, i)), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("natstest: node %d configuration: %v", i, err)
	}
	opts.NoLog, opts.NoSigs = true, true
	return opts
}

// AddTenant gives tenant (with its supervisor and an executor identity
// per pool) an account, or pools more identities in an existing one,
// rewrites every node's configuration and reloads it — no restart — then
// waits until JetStream answers in the tenant's account through every
// node.
func (ts *Tenants) AddTenant(t testing.TB, tenant string, pools ...string) {
	t.Helper()
	if err := natsauth.ValidTenant(tenant); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	ts.addIdentities(t, tenant, natsauth.TenantServices(pools...))
	ts.Reload(t)
	if err := ts.waitJetStream(30*time.Second, tenant); err != nil {
		t.Fatalf("natstest: tenant %s after the reload: %v", tenant, err)
	}
}

// Reload rewrites every node's configuration file from the tenants as they
// stand and reloads each node in place (server.ReloadOptions, what SIGHUP
// does with the file): connections and routes stay up.
func (ts *Tenants) Reload(t testing.TB) {
	t.Helper()
	for i, srv := range ts.Servers() {
		if err := srv.ReloadOptions(ts.options(t, i)); err != nil {
			t.Fatalf("natstest: reload node %s: %v", srv.Name(), err)
		}
	}
}

// waitJetStream waits until every node is routed to the others and each
// tenant's supervisor gets its account's JetStream information through
// every node.
func (ts *Tenants) waitJetStream(timeout time.Duration, tenants ...string) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if last = ts.jetStreamReady(tenants); last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not ready within %s: %w", timeout, last)
}

func (ts *Tenants) jetStreamReady(tenants []string) error {
	servers := ts.Servers()
	for _, srv := range servers {
		if srv.NumRoutes() < len(servers)-1 {
			return fmt.Errorf("node %s has %d routes, want %d", srv.Name(), srv.NumRoutes(), len(servers)-1)
		}
	}
	for _, tn := range tenants {
		if _, ok := ts.seedFile(tn, natsauth.Supervisor); !ok {
			continue // a default tenant without identities
		}
		for _, srv := range servers {
			nc, err := ts.dial(srv.ClientURL(), tn, natsauth.Supervisor, nats.Timeout(2*time.Second))
			if err != nil {
				return err
			}
			js, err := jetstream.New(nc)
			if err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err = js.AccountInfo(ctx)
				cancel()
			}
			nc.Close()
			if err != nil {
				return fmt.Errorf("tenant %s via %s: account info: %w", tn, srv.Name(), err)
			}
		}
	}
	return nil
}

// TenantNames are the tenants, natsauth.DefaultTenant first.
func (ts *Tenants) TenantNames() []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	out := []string{natsauth.DefaultTenant}
	for tn := range ts.seeds {
		if tn != natsauth.DefaultTenant {
			out = append(out, tn)
		}
	}
	slices.Sort(out[1:])
	return out
}

func (ts *Tenants) seedFile(tenant, identity string) (string, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	f, ok := ts.seeds[tenant][identity]
	return f, ok
}

// SeedFile is the nkey seed file of a tenant's identity
// (natsauth.DefaultTenant for the global account's), for
// natsauth.Options.NKeySeedFile; the test fails when it has none.
func (ts *Tenants) SeedFile(t testing.TB, tenant, identity string) string {
	t.Helper()
	f, ok := ts.seedFile(tenant, identity)
	if !ok {
		t.Fatalf("natstest: tenant %s has no identity %s", tenant, identity)
	}
	return f
}

// URL is every node's client URL, comma separated (the same across
// Restart).
func (ts *Tenants) URL() string {
	urls := make([]string, len(ts.clientPorts))
	for i, p := range ts.clientPorts {
		urls[i] = "nats://127.0.0.1:" + strconv.Itoa(p)
	}
	return strings.Join(urls, ",")
}

// Servers are the running nodes, in order.
func (ts *Tenants) Servers() []*server.Server {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return slices.Clone(ts.servers)
}

// Dial connects to the servers as a tenant's identity with its nkey, the
// way bus.Connect does (client name planex-<identity>, its own inbox
// prefix), reconnecting forever; extra options come last. The caller
// closes the connection.
func (ts *Tenants) Dial(tenant, identity string, extra ...nats.Option) (*nats.Conn, error) {
	return ts.dial(ts.URL(), tenant, identity, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, extra...)...)
}

func (ts *Tenants) dial(url, tenant, identity string, extra ...nats.Option) (*nats.Conn, error) {
	file, ok := ts.seedFile(tenant, identity)
	if !ok {
		return nil, fmt.Errorf("tenant %s has no identity %s", tenant, identity)
	}
	opts, err := natsauth.Options{NKeySeedFile: file}.NATSOptions()
	if err != nil {
		return nil, err
	}
	opts = append(opts, nats.Name("planex-"+identity), nats.CustomInboxPrefix(bus.InboxPrefix(identity)))
	nc, err := nats.Connect(url, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("connect as tenant %s identity %s: %w", tenant, identity, err)
	}
	return nc, nil
}

// Connect is Dial for a test: the connection's async errors, the server's
// permission violations among them, go to errs (dropped when it is full or
// nil), and it is closed when the test ends.
func (ts *Tenants) Connect(t testing.TB, tenant, identity string, errs chan<- error) *nats.Conn {
	t.Helper()
	nc, err := ts.Dial(tenant, identity, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Shutdown stops every node (idempotent).
func (ts *Tenants) Shutdown() {
	servers := ts.Servers()
	for _, srv := range servers {
		srv.Shutdown()
	}
	for _, srv := range servers {
		srv.WaitForShutdown()
	}
}
