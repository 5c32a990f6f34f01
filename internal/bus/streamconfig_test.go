package bus_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/stepsign"
)

var updateStreams = flag.Bool("update", false, "rewrite testdata/streams.golden.json with the JetStream configs planex creates now (refused unless nats-server accepts the change as an in-place update, both ways)")

// streamsGolden holds the configs of the JetStream assets planex creates,
// as nats-server reports them: the streams (KV buckets and object stores
// are streams too) and the durable consumers.
const streamsGolden = "testdata/streams.golden.json"

// assets are the JetStream assets of a planex deployment.
type assets struct {
	// Streams by name.
	Streams map[string]jetstream.StreamConfig `json:"streams"`
	// Consumers by "<stream>/<durable>".
	Consumers map[string]jetstream.ConsumerConfig `json:"consumers"`
}

// The pools whose executors the golden deployment runs.
var goldenPools = []string{"sql", "email", "search"}

// Consumer parameters of the golden deployment. The numbers are the
// test's (replicas scale MaxAckPending at run time); what the golden file
// pins is the consumers' shape: filters, ack and deliver policies.
const (
	goldenAckPending = 8
	goldenAckWait    = 30 * time.Second
	goldenMaxDeliver = 5
)

// createAssets creates what a production deployment of this commit
// creates at start, with the services' default flags on one node:
// the supervisor's Setup (it owns retention: Update, --events-max-age
// 30d, --jetstream-max-bytes 1GiB) with its supervisors, tool floors
// and run index buckets, each pool's executors' Setup (their output buckets) and
// shared step replay cache, and the engine and pool consumers.
func createAssets(ctx context.Context, nc *nats.Conn) error {
	res, err := bus.Setup(ctx, nc, bus.Options{Identity: "supervisor", Update: true, EventsMaxAge: 30 * 24 * time.Hour})
	if err != nil {
		return fmt.Errorf("supervisor setup: %w", err)
	}
	if _, err := res.SupervisorsBucket(ctx); err != nil {
		return err
	}
	if _, err := res.ToolFloorsBucket(ctx); err != nil {
		return err
	}
	if _, err := res.RunIndexBucket(ctx); err != nil {
		return err
	}
	if _, err := res.JS.CreateOrUpdateConsumer(ctx, bus.StreamEngine, bus.EngineConsumerConfig(goldenAckPending, goldenAckWait)); err != nil {
		return fmt.Errorf("engine consumer: %w", err)
	}
	for _, pool := range goldenPools {
		eres, err := bus.Setup(ctx, nc, bus.Options{Identity: "executor-" + pool})
		if err != nil {
			return fmt.Errorf("executor-%s setup: %w", pool, err)
		}
		if _, err := stepsign.OpenSharedReplays(ctx, eres.JS, pool, 1); err != nil {
			return err
		}
		if _, err := eres.JS.CreateOrUpdateConsumer(ctx, bus.StreamSteps, bus.PoolConsumerConfig(pool, goldenAckPending, goldenAckWait, goldenMaxDeliver)); err != nil {
			return fmt.Errorf("pool consumer %s: %w", pool, err)
		}
		if _, err := eres.JS.CreateOrUpdateConsumer(ctx, bus.StreamEvents, bus.DispatchConsumerConfig(pool, goldenAckPending, goldenAckWait, goldenMaxDeliver)); err != nil {
			return fmt.Errorf("dispatch consumer %s: %w", pool, err)
		}
	}
	return nil
}

// readAssets reads every stream and consumer of the server, as it reports
// them, without the metadata the server adds itself (_nats.*: its version
// and API level, which change with the server, not with planex).
func readAssets(ctx context.Context, js jetstream.JetStream) (assets, error) {
	a := assets{Streams: map[string]jetstream.StreamConfig{}, Consumers: map[string]jetstream.ConsumerConfig{}}
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return a, fmt.Errorf("stream %s: %w", name, err)
		}
		cfg := s.CachedInfo().Config
		cfg.Metadata = userMetadata(cfg.Metadata)
		a.Streams[name] = cfg
		cons := s.ListConsumers(ctx)
		for ci := range cons.Info() {
			c := ci.Config
			c.Metadata = userMetadata(c.Metadata)
			a.Consumers[name+"/"+ci.Name] = c
		}
		if err := cons.Err(); err != nil {
			return a, fmt.Errorf("consumers of %s: %w", name, err)
		}
	}
	return a, names.Err()
}

func userMetadata(m map[string]string) map[string]string {
	maps.DeleteFunc(m, func(k, _ string) bool { return strings.HasPrefix(k, "_nats.") })
	if len(m) == 0 {
		return nil
	}
	return m
}

func marshalAssets(a assets) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b) // map keys sorted
	enc.SetEscapeHTML(false)   // subjects end in ">"
	enc.SetIndent("", "  ")
	if err := enc.Encode(a); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// The JetStream assets planex creates are part of the N-1 promise
// (docs/deploy.md, "Upgrades and compatibility"): during a rolling upgrade
// supervisors of both releases run Setup with Update, each bringing the
// streams to its own release's config, and every service of either
// release works on whatever the other left. The configs are pinned in
// testdata/streams.golden.json; a change fails here, naming each changed
// field and whether nats-server accepts it as an in-place update from the
// previous config and back (what JetStream allows: subjects added, limits,
// descriptions, duplicate windows; not storage, retention to or from work
// queue, undoing deny-delete or deny-purge, a consumer's deliver or ack
// policy). -update rewrites the file only when it does, both ways.
func TestStreamConfigsAreUpgradeCompatible(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	if err := createAssets(ctx, nc); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	now, err := readAssets(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	got, err := marshalAssets(now)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(streamsGolden)
	if err != nil && !(*updateStreams && os.IsNotExist(err)) {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if bytes.Equal(got, want) {
		return
	}
	var golden assets
	if want != nil {
		if err := json.Unmarshal(want, &golden); err != nil {
			t.Fatalf("%s: %v", streamsGolden, err)
		}
	}
	changes := diffAssets(golden, now)
	refused := checkInPlace(t, ctx, golden, now)
	var b strings.Builder
	for _, c := range changes {
		fmt.Fprintf(&b, "  %s\n", c)
	}
	for _, r := range refused {
		fmt.Fprintf(&b, "  REFUSED IN PLACE: %s\n", r)
	}
	switch {
	case len(refused) > 0:
		t.Fatalf("the JetStream configs planex creates changed incompatibly:\n%s"+
			"A rolling upgrade runs supervisors of the previous release and this one side by side, each updating the streams to its own config at start (bus.Options.Update): "+
			"a change must be an update nats-server accepts in place, from the previous config and back (subjects added, limits, descriptions, duplicate windows; "+
			"not storage, retention to or from work queue, undoing deny-delete/deny-purge, a consumer's deliver or ack policy). "+
			"Make it one, or give the asset a new name and a migration, documented in docs/deploy.md (\"Upgrades and compatibility\"). %s was not rewritten.",
			b.String(), streamsGolden)
	case *updateStreams:
		if err := os.MkdirAll(filepath.Dir(streamsGolden), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(streamsGolden, got, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote %s:\n%s", streamsGolden, b.String())
	default:
		t.Fatalf("the JetStream configs planex creates changed (%s):\n%s"+
			"nats-server accepts each change as an in-place update from the previous config and back, so supervisors of both releases can run side by side. "+
			"Say what changes for operators in docs/deploy.md (\"Upgrades and compatibility\": existing streams take the new config when the first new supervisor starts, "+
			"and an old supervisor that restarts puts its own back), then rerun with -update: go test ./internal/bus -run '^TestStreamConfigsAreUpgradeCompatible$' -update",
			streamsGolden, b.String())
	}
}

// diffAssets lists what changed from old to new, field by field (JSON
// names), added and removed assets included.
func diffAssets(old, new assets) []string {
	var out []string
	out = append(out, diffMaps("stream", old.Streams, new.Streams)...)
	return append(out, diffMaps("consumer", old.Consumers, new.Consumers)...)
}

func diffMaps[C any](kind string, old, new map[string]C) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(old)) {
		if _, ok := new[name]; !ok {
			out = append(out, fmt.Sprintf("%s %s removed (the previous release still uses it)", kind, name))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(new)) {
		o, ok := old[name]
		if !ok {
			out = append(out, fmt.Sprintf("%s %s added (services of the previous release neither create nor use it)", kind, name))
			continue
		}
		of, nf := fields(o), fields(new[name])
		keys := slices.Sorted(maps.Keys(of))
		for k := range nf {
			if _, ok := of[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			if of[k] != nf[k] {
				out = append(out, fmt.Sprintf("%s %s: %s %s -> %s", kind, name, k, orUnset(of[k]), orUnset(nf[k])))
			}
		}
	}
	return out
}

// fields is a config's JSON fields, each value as JSON text.
func fields(v any) map[string]string {
	b, _ := json.Marshal(v)
	var m map[string]json.RawMessage
	_ = json.Unmarshal(b, &m)
	out := make(map[string]string, len(m))
	for k, raw := range m {
		out[k] = strings.ReplaceAll(string(raw), `\u003e`, ">")
	}
	return out
}

func orUnset(s string) string {
	if s == "" {
		return "(unset)"
	}
	return s
}

// checkInPlace asks real servers whether every changed asset can be
// updated in place: from the old config to the new one (the first
// supervisor of the new release starting) and from the new one back to
// the old (a supervisor of the previous release restarting during the
// rollout, or a rollback). It returns what a server refused.
func checkInPlace(t *testing.T, ctx context.Context, old, new assets) []string {
	t.Helper()
	var refused []string
	for _, dir := range []struct {
		name     string
		from, to assets
	}{{"previous -> this", old, new}, {"this -> previous", new, old}} {
		srv := natstest.Start(t)
		js, err := jetstream.New(srv.Connect(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range slices.Sorted(maps.Keys(dir.from.Streams)) {
			if _, err := js.CreateStream(ctx, dir.from.Streams[name]); err != nil {
				t.Fatalf("%s: create stream %s as it was: %v", dir.name, name, err)
			}
		}
		for _, key := range slices.Sorted(maps.Keys(dir.from.Consumers)) {
			stream, _, _ := strings.Cut(key, "/")
			if _, err := js.CreateConsumer(ctx, stream, dir.from.Consumers[key]); err != nil {
				t.Fatalf("%s: create consumer %s as it was: %v", dir.name, key, err)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(dir.to.Streams)) {
			cfg := dir.to.Streams[name]
			if _, ok := dir.from.Streams[name]; !ok {
				continue // a new stream: created, not updated
			}
			if reflectEqualJSON(cfg, dir.from.Streams[name]) {
				continue
			}
			if _, err := js.UpdateStream(ctx, cfg); err != nil {
				refused = append(refused, fmt.Sprintf("%s: stream %s: %v", dir.name, name, err))
			}
		}
		for _, key := range slices.Sorted(maps.Keys(dir.to.Consumers)) {
			cfg := dir.to.Consumers[key]
			prev, ok := dir.from.Consumers[key]
			if !ok || reflectEqualJSON(cfg, prev) {
				continue
			}
			stream, _, _ := strings.Cut(key, "/")
			if _, err := js.UpdateConsumer(ctx, stream, cfg); err != nil {
				refused = append(refused, fmt.Sprintf("%s: consumer %s: %v", dir.name, key, err))
			}
		}
	}
	return refused
}

func reflectEqualJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}
