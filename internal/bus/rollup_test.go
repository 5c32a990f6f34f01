package bus_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
)

// Buckets created before roll-ups were refused (by nats.go's
// CreateKeyValue, which allows them) are bound as they are by services
// that do not own retention, and the supervisor's Setup (Update) makes
// them refuse roll-ups: a "Nats-Rollup: all" on one key no longer purges
// the bucket.
func TestSetupRefusesRollups(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	ctx := ctxT(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	old, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bus.BucketTools, History: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Put(ctx, "email.draft.r1", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	res, err := bus.Setup(ctx, nc, bus.Options{Identity: "executor-sql"})
	if err != nil {
		t.Fatalf("an executor binds the existing bucket: %v", err)
	}
	if _, err := res.Tools.Get(ctx, "email.draft.r1"); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Setup(ctx, nc, bus.Options{Identity: "supervisor", Update: true}); err != nil {
		t.Fatalf("the supervisor updates the existing bucket: %v", err)
	}
	for _, name := range []string{"KV_" + bus.BucketTools, "KV_" + bus.BucketEffects, "KV_" + bus.BucketRuns} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if cfg := s.CachedInfo().Config; cfg.AllowRollup || !cfg.AllowDirect || cfg.MaxMsgsPerSubject != 1 {
			t.Errorf("%s: allow roll-up %v, direct %v, history %d; want no roll-ups, direct gets, history 1", name, cfg.AllowRollup, cfg.AllowDirect, cfg.MaxMsgsPerSubject)
		}
	}
	m := nats.NewMsg("$KV." + bus.BucketTools + ".sql.query.r1")
	m.Header.Set("Nats-Rollup", "all")
	if _, err := res.JS.PublishMsg(ctx, m); err == nil {
		t.Fatal("a roll-up was accepted")
	}
	if _, err := res.Tools.Get(ctx, "email.draft.r1"); err != nil {
		t.Fatalf("email.draft.r1 after the refused roll-up: %v", err)
	}
}
