package natstest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
)

// tenantData is what one tenant's supervisor wrote: its connection and
// resources.
type tenantData struct {
	nc  *nats.Conn
	res *bus.Resources
}

// probedStreams are the streams a probe counts (every one has the same
// name in every account).
var probedStreams = []string{bus.StreamEvents, bus.StreamSteps, bus.StreamEngine, "KV_" + bus.BucketTools, "KV_" + bus.BucketRuns}

func marker(tenant string) string { return "secret-of-" + tenant }

// openTenant connects as tenant's supervisor and sets up (creates, or
// finds) the planex streams and buckets in its account, with as many
// replicas as ts has nodes.
func openTenant(t *testing.T, ts *Tenants, tenant string) tenantData {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts, err := natsauth.Options{NKeySeedFile: ts.SeedFile(t, tenant, natsauth.Supervisor)}.NATSOptions()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := bus.Connect(ctx, ts.URL(), "planex-supervisor", Logger(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	res, err := bus.Setup(ctx, nc, bus.Options{Replicas: len(ts.Servers())})
	if err != nil {
		t.Fatalf("tenant %s: setup: %v", tenant, err)
	}
	return tenantData{nc: nc, res: res}
}

// setupTenant is openTenant, then n run log events, a dispatch to pool
// sql, a tool registration of pool sql and a run snapshot, each carrying
// marker(tenant).
func setupTenant(t *testing.T, ts *Tenants, tenant string, n int) tenantData {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d := openTenant(t, ts, tenant)
	nc, res := d.nc, d.res
	m := []byte(marker(tenant))
	for range n {
		if _, err := res.JS.Publish(ctx, bus.RunLogSubject("run-"+tenant), m); err != nil {
			t.Fatalf("tenant %s: run log: %v", tenant, err)
		}
	}
	if _, err := res.JS.Publish(ctx, bus.DispatchSubject("run-"+tenant, "sql"), m); err != nil {
		t.Fatalf("tenant %s: dispatch: %v", tenant, err)
	}
	if _, err := res.Tools.Put(ctx, "sql.query.r-"+tenant, m); err != nil {
		t.Fatal(err)
	}
	if _, err := res.Runs.Put(ctx, "run-"+tenant, m); err != nil {
		t.Fatal(err)
	}
	return tenantData{nc: nc, res: res}
}

// counts are the message counts of probedStreams in d's account.
func (d tenantData) counts(t *testing.T) map[string]uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[string]uint64{}
	for _, name := range probedStreams {
		s, err := d.res.JS.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		out[name] = s.CachedInfo().State.Msgs
	}
	return out
}

// probe is viewer's executor-sql trying, through the NATS API directly,
// to see or change owner's data. It fails the test when anything of
// owner shows, or when owner's streams or keys changed.
func probe(t *testing.T, ts *Tenants, viewer string, own tenantData, ownerName string, owner tenantData) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	secret := marker(ownerName)
	// A fresh dispatch for the viewer's pool consumer (earlier probes
	// acknowledged theirs).
	if _, err := own.res.JS.Publish(ctx, bus.DispatchSubject("run-"+viewer, "sql"), []byte(marker(viewer))); err != nil {
		t.Fatal(err)
	}
	before := owner.counts(t)
	ownCounts := own.counts(t)
	errs := make(chan error, 64)
	nc := ts.Connect(t, viewer, "executor-sql", errs)
	defer nc.Close()

	// Wide subscriptions are refused.
	subjects := []string{">", "planex.>", bus.SubjectEventsPrefix + ">", bus.RunLogSubject("run-" + ownerName), "$KV.>", "$JS.API.>", bus.InboxPrefix(natsauth.Supervisor) + ".>"}
	var subs []*nats.Subscription
	for _, s := range subjects {
		sub, err := nc.SubscribeSync(s)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, sub)
	}
	refused := map[string]bool{}
	deadline := time.After(10 * time.Second)
	for len(refused) < len(subjects) {
		select {
		case err := <-errs:
			for _, s := range subjects {
				if strings.Contains(err.Error(), fmt.Sprintf("Subscription to %q", s)) {
					refused[s] = true
				}
			}
		case <-deadline:
			t.Fatalf("%s executor: subscriptions refused %v, want all of %v", viewer, refused, subjects)
		}
	}

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// Stream look-ups answer with the viewer's own streams.
	for _, name := range []string{bus.StreamEvents, bus.StreamSteps, bus.StreamEngine, "KV_" + bus.BucketTools} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("%s executor: stream info %s: %v", viewer, name, err)
		}
		if got := s.CachedInfo().State.Msgs; got != ownCounts[name] {
			t.Fatalf("%s executor: stream %s has %d messages, its own account's %d (%s's: %d)", viewer, name, got, ownCounts[name], ownerName, before[name])
		}
	}
	// A stream it may not look up stays hidden.
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	if s, err := js.Stream(short, "KV_"+bus.BucketRuns); err == nil {
		t.Errorf("%s executor: stream info KV_%s answered: %+v", viewer, bus.BucketRuns, s.CachedInfo().State)
	}
	cancelShort()

	// Its pool's consumer reads its own dispatch only.
	cons, err := js.CreateOrUpdateConsumer(ctx, bus.StreamEvents, jetstream.ConsumerConfig{
		Durable: bus.PoolConsumer("sql"), FilterSubject: bus.DispatchFilter("sql"), AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatalf("%s executor: pool consumer: %v", viewer, err)
	}
	// A consumer just created on a replicated stream may answer its first
	// fetch before it has the stream's messages: fetch until some arrive
	// (or 10s), then what else is pending.
	var got []string
	for deadline := time.Now().Add(10 * time.Second); ; {
		batch, err := cons.FetchNoWait(10)
		if err != nil {
			t.Fatal(err)
		}
		n := len(got)
		for m := range batch.Messages() {
			got = append(got, string(m.Data()))
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatalf("%s executor: ack: %v", viewer, err)
			}
		}
		if (len(got) > 0 && len(got) == n) || time.Now().After(deadline) {
			break
		}
		if len(got) == n {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if len(got) == 0 || slices.ContainsFunc(got, func(d string) bool { return d != marker(viewer) }) {
		t.Errorf("%s executor: its pool consumer delivered %q, want only its own dispatches %q", viewer, got, marker(viewer))
	}

	// KV reads: its own pool's registration, never the owner's.
	kv, err := js.KeyValue(ctx, bus.BucketTools)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx, "sql.query.r-"+viewer); err != nil || string(e.Value()) != marker(viewer) {
		t.Fatalf("%s executor: own tool key: %v", viewer, err)
	}
	if e, err := kv.Get(ctx, "sql.query.r-"+ownerName); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("%s executor: %s's tool key: %v %v, want not found", viewer, ownerName, e, err)
	}
	for _, req := range []struct{ subject, body string }{
		{"$JS.API.DIRECT.GET.KV_" + bus.BucketRuns + ".$KV." + bus.BucketRuns + ".run-" + ownerName, ""},
		{"$JS.API.DIRECT.GET.KV_" + bus.BucketTools, `{"last_by_subj":"$KV.` + bus.BucketTools + `.sql.query.r-` + ownerName + `"}`},
		{"$JS.API.STREAM.MSG.GET." + bus.StreamEvents, `{"last_by_subj":"` + bus.RunLogSubject("run-"+ownerName) + `"}`},
		{"$JS.API.STREAM.INFO." + bus.StreamEvents, ""},
	} {
		msg, err := nc.Request(req.subject, []byte(req.body), 500*time.Millisecond)
		if err == nil && strings.Contains(string(msg.Data), secret) {
			t.Errorf("%s executor: %s answered with %s's data: %s", viewer, req.subject, ownerName, msg.Data)
		}
	}

	// Writes to the owner's subjects land in the viewer's own account or
	// nowhere.
	if ack, err := js.Publish(ctx, bus.EngineSubject("run-"+ownerName, bus.KindResult), []byte("intrusion")); err != nil {
		t.Fatalf("%s executor: publish a result: %v", viewer, err)
	} else if ack.Stream != bus.StreamEngine {
		t.Errorf("%s executor: result stored in %s", viewer, ack.Stream)
	}
	if _, err := kv.Put(ctx, "sql.query.r-"+ownerName, []byte("intrusion")); err != nil {
		t.Fatalf("%s executor: put its pool's key: %v", viewer, err)
	}
	for _, s := range []string{bus.RunLogSubject("run-" + ownerName), bus.DispatchSubject("run-"+ownerName, "sql"), "$KV." + bus.BucketRuns + ".run-" + ownerName, "planex.steps.sql.query"} {
		if err := nc.Publish(s, []byte("intrusion")); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if after := owner.counts(t); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("after %s's executor wrote to %s's subjects, %s's streams went from %v to %v", viewer, ownerName, ownerName, before, after)
	}
	for _, kv := range []struct {
		bucket jetstream.KeyValue
		key    string
	}{{owner.res.Tools, "sql.query.r-" + ownerName}, {owner.res.Runs, "run-" + ownerName}} {
		if e, err := kv.bucket.Get(ctx, kv.key); err != nil || string(e.Value()) != secret {
			t.Errorf("%s's key %s after %s's executor wrote: %v", ownerName, kv.key, viewer, err)
		}
	}
	for i, sub := range subs {
		if m, err := sub.NextMsg(0); err == nil {
			t.Errorf("%s executor: refused subscription %s received %s: %q", viewer, subjects[i], m.Subject, m.Data)
		}
	}
}

// TestTenantAccounts: on a 3-node cluster started from a tenant
// configuration, tenants a and b and the default tenant ($G) each set up
// planex through their supervisor; no tenant's executor sees or changes
// anything of another tenant. Then tenant c is added with a configuration
// reload: same servers, connections of a and b up, and JetStream works in
// c's account at once.
func TestTenantAccounts(t *testing.T) {
	ts := StartTenantCluster(t, 3, []string{"sql"}, map[string][]string{"a": {"sql"}, "b": {"sql", "email"}})
	data := map[string]tenantData{}
	for i, tn := range []string{natsauth.DefaultTenant, "a", "b"} {
		data[tn] = setupTenant(t, ts, tn, i+1) // different counts: a stream of another account would show
	}
	t.Run("isolation", func(t *testing.T) {
		for _, pair := range [][2]string{{"a", "b"}, {"b", "a"}, {"a", natsauth.DefaultTenant}, {natsauth.DefaultTenant, "a"}, {natsauth.DefaultTenant, "b"}} {
			t.Run(pair[0]+" reads "+pair[1], func(t *testing.T) {
				probe(t, ts, pair[0], data[pair[0]], pair[1], data[pair[1]])
			})
		}
	})
	t.Run("tenant added by reload", func(t *testing.T) {
		servers := ts.Servers()
		ids := make([]string, len(servers))
		for i, s := range servers {
			ids[i] = s.ID()
		}
		reconnects := map[string]uint64{}
		for tn, d := range data {
			reconnects[tn] = d.nc.Stats().Reconnects
		}
		ts.AddTenant(t, "c", "sql")
		for i, s := range ts.Servers() {
			if s != servers[i] || s.ID() != ids[i] || !s.Running() {
				t.Fatalf("node %d was replaced or stopped by the reload", i)
			}
		}
		c := setupTenant(t, ts, "c", 4)
		if got := c.counts(t)[bus.StreamEvents]; got != 5 {
			t.Errorf("c's run log has %d messages, want 5", got)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for tn, d := range data {
			if !d.nc.IsConnected() || d.nc.Stats().Reconnects != reconnects[tn] {
				t.Errorf("tenant %s's connection: connected %v, reconnects %d→%d", tn, d.nc.IsConnected(), reconnects[tn], d.nc.Stats().Reconnects)
			}
			if _, err := d.res.JS.Publish(ctx, bus.RunLogSubject("run-"+tn), []byte(marker(tn))); err != nil {
				t.Errorf("tenant %s after the reload: %v", tn, err)
			}
		}
		probe(t, ts, "c", c, "a", data["a"])
		probe(t, ts, "a", data["a"], "c", c)
	})
}

// TestTenantsSingleNode: one server from a tenant configuration; a tenant
// added by reload keeps the port and the connections, and its executor
// cannot reach the other tenant's subjects.
func TestTenantsSingleNode(t *testing.T) {
	ts := StartTenants(t, nil, map[string][]string{"a": {"sql"}})
	url := ts.URL()
	errs := make(chan error, 8)
	a := ts.Connect(t, "a", natsauth.Supervisor, errs)
	ts.AddTenant(t, "b", "sql")
	if ts.URL() != url || !a.IsConnected() || a.Stats().Reconnects != 0 {
		t.Fatalf("after the reload: URL %s (was %s), a connected %v, %d reconnects", ts.URL(), url, a.IsConnected(), a.Stats().Reconnects)
	}
	if _, err := ts.Dial("b", "planner"); err == nil {
		t.Fatal("tenant b has a planner identity")
	}
	bExec := ts.Connect(t, "b", "executor-sql", errs)
	if _, err := bExec.SubscribeSync("planex.>"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("b's executor subscribing planex.>: %v, want a permission violation", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b's executor subscribed to planex.> without a permission violation")
	}
}

// streamsByAccount are the streams of every account with JetStream on
// srv: account → stream names.
func streamsByAccount(t *testing.T, srv *server.Server) map[string][]string {
	t.Helper()
	jsz, err := srv.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, acc := range jsz.AccountDetails {
		out[acc.Name] = []string{}
		for _, st := range acc.Streams {
			out[acc.Name] = append(out[acc.Name], st.Name)
		}
		slices.Sort(out[acc.Name])
	}
	return out
}

// TestTenantsDefaultAccount: a server started from a configuration whose
// default tenant is in natsauth.DefaultAccount, from the file alone (no
// EnableGlobalJetStream, as a stock nats-server), gives the default
// tenant's supervisor JetStream there; the planex streams are set up in
// planex-default and in tenant a's account, never in $G; no executor of
// one sees or changes anything of the other; and a restart from the same
// file finds every stream and key again, isolation intact.
func TestTenantsDefaultAccount(t *testing.T) {
	ts := StartTenants(t, []string{"sql"}, map[string][]string{"a": {"sql"}}, InDefaultAccount())
	srv := ts.Servers()[0]
	if srv.GlobalAccount().JetStreamEnabled() {
		t.Fatal("$G has JetStream on a server started from a configuration with accounts (has nats-server changed? revisit natsauth.ServerConfigWithTenants' doc)")
	}
	data := map[string]tenantData{natsauth.DefaultTenant: setupTenant(t, ts, natsauth.DefaultTenant, 2), "a": setupTenant(t, ts, "a", 3)}
	checkAccounts := func(t *testing.T, srv *server.Server) {
		t.Helper()
		got := streamsByAccount(t, srv)
		if _, ok := got["$G"]; ok {
			t.Errorf("$G has JetStream: %v", got["$G"])
		}
		for _, acc := range []string{natsauth.DefaultAccount, natsauth.TenantAccount("a")} {
			if !slices.Contains(got[acc], bus.StreamEvents) || !slices.Contains(got[acc], "KV_"+bus.BucketRuns) {
				t.Errorf("account %s has streams %v, want the planex streams", acc, got[acc])
			}
		}
	}
	checkAccounts(t, srv)
	isolation := func(t *testing.T) {
		for _, pair := range [][2]string{{"a", natsauth.DefaultTenant}, {natsauth.DefaultTenant, "a"}} {
			t.Run(pair[0]+" reads "+pair[1], func(t *testing.T) {
				probe(t, ts, pair[0], data[pair[0]], pair[1], data[pair[1]])
			})
		}
	}
	t.Run("isolation", isolation)

	want := map[string]map[string]uint64{}
	for tn, d := range data {
		want[tn] = d.counts(t)
	}
	ts.Restart(t)
	srv = ts.Servers()[0]
	checkAccounts(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for tn := range data {
		d := openTenant(t, ts, tn) // bus.Setup finds the streams: creates nothing
		if got := d.counts(t); fmt.Sprint(got) != fmt.Sprint(want[tn]) {
			t.Errorf("tenant %s after the restart: streams hold %v messages, want %v", tn, got, want[tn])
		}
		if e, err := d.res.Runs.Get(ctx, "run-"+tn); err != nil || string(e.Value()) != marker(tn) {
			t.Errorf("tenant %s after the restart: run snapshot: %v", tn, err)
		}
		// The first probes wrote the other tenant's tool key in this
		// account (it landed here, as it should): clear it for the next.
		for other := range data {
			if other != tn {
				if err := d.res.Tools.Delete(ctx, "sql.query.r-"+other); err != nil {
					t.Fatal(err)
				}
			}
		}
		data[tn] = d
	}
	t.Run("isolation after the restart", isolation)
}
