package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Options tune the JetStream resources Setup creates. The zero value is
// valid and gives single-node defaults.
type Options struct {
	// Replicas of every stream and bucket (1 for dev, 3 in a cluster).
	Replicas int
	// EventsMaxAge is how long run logs are kept; 0 keeps them forever.
	EventsMaxAge time.Duration
	// DuplicateWindow is how long Nats-Msg-Id deduplication remembers an
	// id; default 10 minutes.
	DuplicateWindow time.Duration
	// ToolsTTL is how long a tool registration lives without a heartbeat;
	// default 30 seconds.
	ToolsTTL time.Duration
	// SupervisorsTTL is how long a supervisor replica's registration in
	// planex-supervisors lives without a heartbeat; default 30 seconds.
	SupervisorsTTL time.Duration
	// EffectsTTL is how long idempotency records of side effects, and
	// email drafts, are kept; default 7 days.
	EffectsTTL time.Duration
	// Memory keeps everything in memory instead of on disk (tests only).
	Memory bool
	// MaxBytes is the budget of all planex streams and buckets together
	// (per replica); Setup splits it between them (budgetShares), so every
	// stream and bucket has a MaxBytes and refuses writes when full
	// (DiscardNew) instead of growing until the JetStream volume is.
	// Default DefaultMaxBytes.
	MaxBytes int64
	// Update makes Setup update existing streams and buckets to these
	// options. Only the supervisor, which owns retention, sets it; other
	// services create what is missing and leave existing settings alone.
	Update bool
	// HoldTimers lets HoldTimer hand timers to StreamTimers (which Setup
	// creates on NATS 2.12+ either way, so that every supervisor consumes
	// what any of them held).
	HoldTimers bool
	// TimersAfter is how far ahead a run deadline or gate SLA must be due
	// to be held by NATS as a message schedule (HoldTimer); default
	// ScheduleAfter. Tests shorten it.
	TimersAfter time.Duration
	// Identity is the NATS identity Setup runs as: "supervisor",
	// "planner" or "executor-<pool>" (see IdentityOf). It decides what
	// Setup opens — only what that identity uses and internal/natsauth
	// grants it — and what the usage gauge reads. Empty: the identity of
	// the connection's name as Connect sets it ("planex-<identity>");
	// any other name opens every shared resource, as the supervisor does.
	Identity string
}

func (o Options) withDefaults() Options {
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.DuplicateWindow <= 0 {
		o.DuplicateWindow = 10 * time.Minute
	}
	if o.ToolsTTL <= 0 {
		o.ToolsTTL = 30 * time.Second
	}
	if o.SupervisorsTTL <= 0 {
		o.SupervisorsTTL = 30 * time.Second
	}
	if o.EffectsTTL <= 0 {
		o.EffectsTTL = 7 * 24 * time.Hour
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.TimersAfter <= 0 {
		o.TimersAfter = ScheduleAfter
	}
	return o
}

// Resources are the JetStream handles every planex service works with.
type Resources struct {
	// JS is the JetStream context.
	JS jetstream.JetStream
	// Runs is the run snapshot bucket.
	Runs jetstream.KeyValue
	// Tools is the tool catalog bucket.
	Tools jetstream.KeyValue
	// Effects is the side-effect idempotency bucket.
	Effects jetstream.KeyValue
	// Idempotency maps StartRun keys to run ids.
	Idempotency jetstream.KeyValue
	// Drafts holds the email pool's drafts.
	Drafts jetstream.KeyValue
	// Outputs stores large step outputs: an executor's own pool's
	// OutputBucket, ObjectOutputs for every other identity.
	Outputs jetstream.ObjectStore
	// OutputsBucket is the name of Outputs' bucket, what an OutputRef to
	// an object stored there names.
	OutputsBucket string

	opts     Options // as given to Setup, for the buckets only some services open
	identity string  // the identity Setup ran as ("" for every resource)

	readers *outputReaders // output buckets ReadOutput opened, shared by copies of r
	timers  *timerStream   // StreamTimers when it holds message schedules, else nil
	usage   []string       // streams the usage gauge reads through JS; set by Setup only
}

// outputReaders caches the output buckets a Resources opened for reading.
// It sits behind a pointer so that a copy of Resources (a test swapping one
// bucket) shares it and can be copied without copying a lock.
type outputReaders struct {
	mu sync.Mutex
	m  map[string]jetstream.ObjectStore
}

// InboxPrefix is the reply-subject prefix of a NATS identity ("supervisor",
// "planner", "executor-<pool>"). Every reply a service waits for — request
// and reply, JetStream API answers, KV and object store calls, pull
// fetches — arrives on its own inboxes, and internal/natsauth lets each
// identity subscribe to its own prefix only, so no service can read
// another's replies.
func InboxPrefix(identity string) string { return "_INBOX_" + identity }

// Connect dials NATS and fails fast, with an error naming the URL, when the
// server is unreachable. After the first connection it reconnects forever
// and logs connection changes. name is the client name "planex-<identity>";
// the connection's inboxes use InboxPrefix(identity). extra adds options
// (credentials, TLS).
func Connect(ctx context.Context, url, name string, logger *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	timeout := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	opts := append([]nats.Option{
		nats.Name(name),
		nats.CustomInboxPrefix(InboxPrefix(strings.TrimPrefix(name, "planex-"))),
		nats.Timeout(timeout),
		nats.RetryOnFailedConnect(false),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				logger.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			logger.Info("nats reconnected", "url", c.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			logger.Error("nats async error", "subject", subj, "err", err)
		}),
	}, extra...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", redactURL(url), err)
	}
	return nc, nil
}

// Setup creates the streams, KV buckets and object store that planex uses
// when they are missing, and with Options.Update also brings existing ones
// to the given options. It is idempotent and safe to run from every
// replica at start-up. It opens only what its identity (Options.Identity)
// uses: the supervisor everything; an executor of pool its steps, the run
// logs it consumes its dispatches from, the engine inbox it answers on,
// the tool catalog, effect records, the drafts (email pool only) and its
// pool's OutputBucket; the planner nothing (it only needs JetStream for
// its own plan cache). Resources it did not open are nil.
func Setup(ctx context.Context, nc *nats.Conn, opts Options) (*Resources, error) {
	opts = opts.withDefaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	identity := opts.Identity
	if identity == "" {
		identity = IdentityOf(nc)
	}
	prof := profileOf(identity)
	storage := opts.storage()
	streams := []jetstream.StreamConfig{
		{
			Name:        StreamEvents,
			Description: "planex run logs: one subject (or subject filter) per run, append-only",
			Subjects:    []string{SubjectEventsPrefix + ">"},
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      opts.EventsMaxAge,
			Storage:     storage,
			Replicas:    opts.Replicas,
			Duplicates:  opts.DuplicateWindow,
			// Full: refuse new events rather than drop the oldest ones of
			// runs still in progress (the run log is hash-chained).
			Discard:     jetstream.DiscardNew,
			MaxBytes:    maxBytesFor(opts.MaxBytes, StreamEvents),
			AllowDirect: true,
		},
		{
			Name:        StreamSteps,
			Description: "planex step requests for executor pools",
			Subjects:    []string{SubjectStepsPrefix + ">"},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     storage,
			Replicas:    opts.Replicas,
			Duplicates:  opts.DuplicateWindow,
			// Full: refuse new steps; never drop queued ones.
			Discard:  jetstream.DiscardNew,
			MaxBytes: maxBytesFor(opts.MaxBytes, StreamSteps),
		},
		{
			Name:        StreamEngine,
			Description: "planex engine inbox: step results, decisions, timers, kicks",
			Subjects:    []string{SubjectEnginePrefix + ">", SubjectTimersPrefix + "*"},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     storage,
			Replicas:    opts.Replicas,
			Duplicates:  opts.DuplicateWindow,
			Discard:     jetstream.DiscardNew,
			MaxBytes:    maxBytesFor(opts.MaxBytes, StreamEngine),
		},
	}
	res := &Resources{JS: js, opts: opts, identity: identity, readers: &outputReaders{}}
	for _, cfg := range streams {
		if !prof.opens(cfg.Name) {
			continue
		}
		err := retry(ctx, func(ctx context.Context) error {
			if opts.Update {
				_, err := js.CreateOrUpdateStream(ctx, cfg)
				return err
			}
			_, err := js.CreateStream(ctx, cfg)
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				_, err = js.Stream(ctx, cfg.Name)
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("create stream %s: %w", cfg.Name, err)
		}
		res.usage = append(res.usage, cfg.Name)
	}
	if prof.opens(StreamTimers) {
		if res.timers, err = setupTimers(ctx, nc, js, opts); err != nil {
			return nil, fmt.Errorf("create stream %s: %w", StreamTimers, err)
		}
		if res.timers != nil {
			res.usage = append(res.usage, StreamTimers)
		}
	}
	kvs := []jetstream.KeyValueConfig{
		{Bucket: BucketRuns, MaxBytes: maxBytesFor(opts.MaxBytes, BucketRuns), Description: "run snapshots (cache of the event fold)", History: 1, Storage: storage, Replicas: opts.Replicas, TTL: opts.EventsMaxAge},
		{Bucket: BucketTools, MaxBytes: maxBytesFor(opts.MaxBytes, BucketTools), Description: "tool catalog, renewed by executor heartbeats", History: 1, Storage: storage, Replicas: opts.Replicas, TTL: opts.ToolsTTL},
		{Bucket: BucketEffects, MaxBytes: maxBytesFor(opts.MaxBytes, BucketEffects), Description: "idempotency records of side-effecting steps", History: 1, Storage: storage, Replicas: opts.Replicas, TTL: opts.EffectsTTL},
		{Bucket: BucketIdempotency, MaxBytes: maxBytesFor(opts.MaxBytes, BucketIdempotency), Description: "StartRun idempotency keys", History: 1, Storage: storage, Replicas: opts.Replicas, TTL: opts.EventsMaxAge},
		{Bucket: BucketDrafts, MaxBytes: maxBytesFor(opts.MaxBytes, BucketDrafts), Description: "email drafts awaiting email.send, shared by the email pool's replicas", History: 1, Storage: storage, Replicas: opts.Replicas, TTL: opts.EffectsTTL},
	}
	for _, cfg := range kvs {
		if !prof.opens("KV_" + cfg.Bucket) {
			continue
		}
		kv, err := openKV(ctx, js, cfg, opts.Update)
		if err != nil {
			return nil, err
		}
		res.usage = append(res.usage, "KV_"+cfg.Bucket)
		switch cfg.Bucket {
		case BucketRuns:
			res.Runs = kv
		case BucketTools:
			res.Tools = kv
		case BucketEffects:
			res.Effects = kv
		case BucketIdempotency:
			res.Idempotency = kv
		case BucketDrafts:
			res.Drafts = kv
		}
	}
	if prof.outputs != "" {
		obj, err := openOutputs(ctx, js, prof.outputs, opts)
		if err != nil {
			return nil, err
		}
		res.Outputs, res.OutputsBucket = obj, prof.outputs
		res.usage = append(res.usage, "OBJ_"+prof.outputs)
	}
	// Buckets other packages create, read by the gauge when present.
	res.usage = append(res.usage, prof.observe...)
	registerUsage(res)
	return res, nil
}

// openOutputs creates (or, with Options.Update, updates) an output object
// store, or binds it when it exists.
func openOutputs(ctx context.Context, js jetstream.JetStream, bucket string, opts Options) (jetstream.ObjectStore, error) {
	return openObjectStore(ctx, js, jetstream.ObjectStoreConfig{
		Bucket:      bucket,
		Description: "large step outputs",
		Storage:     opts.storage(),
		Replicas:    opts.Replicas,
		TTL:         opts.EventsMaxAge,
		MaxBytes:    maxBytesFor(opts.MaxBytes, bucket),
	}, opts.Update)
}

// openObjectStore creates (or, with update, updates) the object store
// ocfg describes, or binds it when it exists.
func openObjectStore(ctx context.Context, js jetstream.JetStream, ocfg jetstream.ObjectStoreConfig, update bool) (jetstream.ObjectStore, error) {
	var obj jetstream.ObjectStore
	err := retry(ctx, func(ctx context.Context) (err error) {
		if update {
			obj, err = js.CreateOrUpdateObjectStore(ctx, ocfg)
			return err
		}
		obj, err = js.CreateObjectStore(ctx, ocfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			obj, err = js.ObjectStore(ctx, ocfg.Bucket)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create object store %s: %w", ocfg.Bucket, err)
	}
	return obj, nil
}

// Identity is the NATS identity these resources were set up as
// ("supervisor", "planner", "executor-<pool>"), or "" when Setup opened
// every shared resource for a connection of no planex identity.
func (r *Resources) Identity() string { return r.identity }

// IdentityOf is the planex NATS identity of a connection Connect opened
// ("planex-<identity>" is its name): "supervisor", "planner" or
// "executor-<pool>", or "" for any other connection.
func IdentityOf(nc *nats.Conn) string {
	if nc == nil {
		return ""
	}
	id, ok := strings.CutPrefix(nc.Opts.Name, "planex-")
	if !ok {
		return ""
	}
	if id == "supervisor" || id == "planner" {
		return id
	}
	if pool, ok := strings.CutPrefix(id, "executor-"); ok && ValidToken(pool) {
		return id
	}
	return ""
}

// profile is what Setup opens for an identity.
type profile struct {
	all     bool     // every shared stream and bucket
	names   []string // else: these streams ("KV_<bucket>" for buckets)
	outputs string   // the output bucket to open ("" none)
	observe []string // further streams the usage gauge reads when present
}

func (p profile) opens(name string) bool { return p.all || slices.Contains(p.names, name) }

// profileOf is what an identity opens. It mirrors internal/natsauth's
// grants: each identity opens only what it may create and look up.
func profileOf(identity string) profile {
	switch {
	case identity == "planner":
		return profile{}
	case strings.HasPrefix(identity, "executor-"):
		pool := strings.TrimPrefix(identity, "executor-")
		names := []string{StreamEvents, StreamSteps, StreamEngine, "KV_" + BucketTools, "KV_" + BucketEffects}
		if pool == EmailPool {
			names = append(names, "KV_"+BucketDrafts)
		}
		return profile{names: names, outputs: OutputBucket(pool), observe: []string{"KV_" + BucketStepReplay}}
	default: // the supervisor, and tools of no planex identity
		return profile{all: true, outputs: ObjectOutputs,
			observe: []string{"KV_" + BucketSupervisors, "KV_" + BucketStepReplay, "KV_" + BucketToolFloors, "OBJ_" + ObjectRunIndex}}
	}
}

// EmailPool is the pool whose executors keep drafts in BucketDrafts; no
// other executor identity opens (or may use) it.
const EmailPool = "email"

// SupervisorsBucket creates (or, with Options.Update, updates) the
// planex-supervisors bucket with the options Setup was given and returns
// it. It is not part of Setup because only the supervisor identity may
// create it: the other services run Setup too.
func (r *Resources) SupervisorsBucket(ctx context.Context) (jetstream.KeyValue, error) {
	opts := r.opts.withDefaults()
	return openKV(ctx, r.JS, jetstream.KeyValueConfig{
		Bucket: BucketSupervisors, Description: "live supervisor replicas, renewed by their heartbeats",
		History: 1, Storage: opts.storage(), Replicas: opts.Replicas, TTL: opts.SupervisorsTTL,
		MaxBytes: maxBytesFor(opts.MaxBytes, BucketSupervisors),
	}, opts.Update)
}

// openKV creates a bucket, or opens it when it exists (with update:
// brings it to cfg). The bucket's stream is kvStreamConfig: a KV bucket
// that refuses roll-ups.
func openKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, update bool) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	scfg := kvStreamConfig(cfg)
	err := retry(ctx, func(ctx context.Context) (err error) {
		if update {
			_, err = js.CreateOrUpdateStream(ctx, scfg)
		} else if _, err = js.CreateStream(ctx, scfg); errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			err = nil // exists, perhaps with other settings: the supervisor's to change
		}
		if err != nil {
			return err
		}
		kv, err = js.KeyValue(ctx, cfg.Bucket)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create KV bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// kvStreamConfig is the stream of a KV bucket as nats.go's
// CreateKeyValue makes it, except that roll-ups are refused: a message
// with "Nats-Rollup: all" on any key a service may write would otherwise
// purge the whole bucket — every pool's tool registrations, every effect
// record — with no purge permission. planex never rolls a bucket up (it
// neither purges keys nor their history, which is one entry).
func kvStreamConfig(cfg jetstream.KeyValueConfig) jetstream.StreamConfig {
	history := int64(max(cfg.History, 1))
	replicas := max(cfg.Replicas, 1)
	maxBytes := cfg.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	// As nats.go: the duplicate window is 2 minutes, or the TTL when
	// shorter.
	dup := 2 * time.Minute
	if cfg.TTL > 0 && cfg.TTL < dup {
		dup = cfg.TTL
	}
	return jetstream.StreamConfig{
		Name:              "KV_" + cfg.Bucket,
		Description:       cfg.Description,
		Subjects:          []string{"$KV." + cfg.Bucket + ".>"},
		MaxMsgsPerSubject: history,
		MaxBytes:          maxBytes,
		MaxAge:            cfg.TTL,
		MaxMsgSize:        -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		Storage:           cfg.Storage,
		Replicas:          replicas,
		AllowRollup:       false,
		DenyDelete:        true,
		Duplicates:        dup,
		AllowDirect:       true,
		Discard:           jetstream.DiscardNew,
	}
}

func (o Options) storage() jetstream.StorageType {
	if o.Memory {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
}

// Check reports whether the JetStream resources are reachable, for health
// checks: the connection is up and the streams the connection's identity
// (IdentityOf) uses exist — for the planner, which uses none of them,
// that JetStream answers.
func Check(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error {
	if nc == nil || !nc.IsConnected() {
		return errors.New("nats: not connected")
	}
	prof := profileOf(IdentityOf(nc))
	checked := 0
	for _, name := range []string{StreamEvents, StreamSteps, StreamEngine} {
		if !prof.opens(name) {
			continue
		}
		checked++
		if _, err := js.Stream(ctx, name); err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
	}
	if checked == 0 {
		if _, err := js.AccountInfo(ctx); err != nil {
			return fmt.Errorf("jetstream: %w", err)
		}
	}
	return nil
}

// PoolConsumerConfig is the durable consumer of an executor pool: explicit
// acks, at most maxAckPending steps in flight across the pool's replicas per
// replica count, redelivery after ackWait, and maxDeliver attempts.
func PoolConsumerConfig(pool string, maxAckPending int, ackWait time.Duration, maxDeliver int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       PoolConsumer(pool),
		Description:   "planex executor pool " + pool,
		FilterSubject: PoolFilter(pool),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    maxDeliver,
		MaxAckPending: maxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// DispatchConsumerConfig is the durable consumer of an executor pool on
// PLANEX_EVENTS: the routed runs' decisions that dispatch one step of the
// pool (DispatchFilter), each that step's request, with the same
// acknowledgement, redelivery and flow limits as PoolConsumerConfig. It
// delivers only what is appended after its creation (the stream holds the
// whole log); the supervisor dispatches this way only to pools whose
// consumer exists.
func DispatchConsumerConfig(pool string, maxAckPending int, ackWait time.Duration, maxDeliver int) jetstream.ConsumerConfig {
	cfg := PoolConsumerConfig(pool, maxAckPending, ackWait, maxDeliver)
	cfg.Description = "planex executor pool " + pool + ": steps dispatched in run logs"
	cfg.FilterSubject = DispatchFilter(pool)
	cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	return cfg
}

// RoutedLogs reports whether the connected server checks an append against
// a subject filter (Nats-Expected-Last-Subject-Sequence-Subject, NATS
// 2.11+), which the routed run log layout needs.
func RoutedLogs(nc *nats.Conn) bool {
	if nc == nil {
		return false
	}
	return versionAtLeast(nc.ConnectedServerVersion(), 2, 11)
}

// versionAtLeast reports whether a server version "2.11.3" (or
// "2.12.0-beta") is at least major.minor.
func versionAtLeast(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || (ma == major && mi >= minor)
}

// EngineConsumerConfig is the durable consumer shared by all supervisors.
func EngineConsumerConfig(maxAckPending int, ackWait time.Duration) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       ConsumerEngine,
		Description:   "planex supervisors",
		FilterSubject: SubjectEnginePrefix + ">",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
		MaxAckPending: maxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// retry runs op with a per-attempt timeout until it succeeds, fails with a
// non-transient error, or ctx ends. Several replicas creating the same
// replicated stream at once on a fresh cluster make the meta leader answer
// slowly; timeouts and "cluster not ready" are therefore retried.
//
// The attempt timeout starts short (1s) and doubles up to 10s: when two
// replicas create the same replicated stream or bucket of a new account
// at once on a 3-node cluster, one of the two requests can go unanswered
// (seen in the upgrade test with the nats-server go.mod pins; the other create succeeds), and
// a 10s first attempt made a new tenant's ~10 streams and buckets take
// minutes to set up. The retry finds the stream made and binds it.
func retry(ctx context.Context, op func(context.Context) error) error {
	backoff := 200 * time.Millisecond
	attempt := time.Second
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		attempt = min(2*attempt, 10*time.Second)
		err := op(actx)
		cancel()
		if err == nil || !transient(err) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 3*time.Second)
	}
}

func transient(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// 503 and "JetStream not ready / no leader" class errors.
		return apiErr.Code == 503 || apiErr.ErrorCode == jetstream.JSErrCodeJetStreamNotEnabled
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, nats.ErrNoResponders)
}
