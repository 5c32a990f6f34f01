package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
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
	// Outputs stores large step outputs.
	Outputs jetstream.ObjectStore

	opts Options // as given to Setup, for the buckets only some services open
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
// replica at start-up.
func Setup(ctx context.Context, nc *nats.Conn, opts Options) (*Resources, error) {
	opts = opts.withDefaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
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
	for _, cfg := range streams {
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
	}
	kvs := []jetstream.KeyValueConfig{
		{Bucket: BucketRuns, MaxBytes: maxBytesFor(opts.MaxBytes, BucketRuns), Description: "run snapshots (cache of the event fold)", History: 1, Storage: storage, Replicas: opts.Replicas, TTL: opts.EventsMaxAge},
		{Bucket: BucketTools, MaxBytes: maxBytesFor(opts.MaxBytes, BucketTools), Description: "tool catalog, renewed by executor heartbeats", History: 1, Storage: storage, Replicas: opts.Replicas, TTL: opts.ToolsTTL},
		{Bucket: BucketEffects, MaxBytes: maxBytesFor(opts.MaxBytes, BucketEffects), Description: "idempotency records of side-effecting steps", History: 1, Storage: storage, Replicas: opts.Replicas, TTL: opts.EffectsTTL},
		{Bucket: BucketIdempotency, MaxBytes: maxBytesFor(opts.MaxBytes, BucketIdempotency), Description: "StartRun idempotency keys", History: 1, Storage: storage, Replicas: opts.Replicas, TTL: opts.EventsMaxAge},
		{Bucket: BucketDrafts, MaxBytes: maxBytesFor(opts.MaxBytes, BucketDrafts), Description: "email drafts awaiting email.send, shared by the email pool's replicas", History: 1, Storage: storage, Replicas: opts.Replicas, TTL: opts.EffectsTTL},
	}
	res := &Resources{JS: js, opts: opts}
	for _, cfg := range kvs {
		kv, err := openKV(ctx, js, cfg, opts.Update)
		if err != nil {
			return nil, err
		}
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
	var obj jetstream.ObjectStore
	err = retry(ctx, func(ctx context.Context) (err error) {
		ocfg := jetstream.ObjectStoreConfig{
			Bucket:      ObjectOutputs,
			Description: "large step outputs",
			Storage:     storage,
			Replicas:    opts.Replicas,
			TTL:         opts.EventsMaxAge,
			MaxBytes:    maxBytesFor(opts.MaxBytes, ObjectOutputs),
		}
		if opts.Update {
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
		return nil, fmt.Errorf("create object store %s: %w", ObjectOutputs, err)
	}
	res.Outputs = obj
	registerUsage(js)
	return res, nil
}

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
// brings it to cfg).
func openKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, update bool) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	err := retry(ctx, func(ctx context.Context) (err error) {
		if update {
			kv, err = js.CreateOrUpdateKeyValue(ctx, cfg)
			return err
		}
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create KV bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

func (o Options) storage() jetstream.StorageType {
	if o.Memory {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
}

// Check reports whether the JetStream resources are reachable, for health
// checks: the connection is up and the streams exist.
func Check(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error {
	if nc == nil || !nc.IsConnected() {
		return errors.New("nats: not connected")
	}
	for _, name := range []string{StreamEvents, StreamSteps, StreamEngine} {
		if _, err := js.Stream(ctx, name); err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
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
func retry(ctx context.Context, op func(context.Context) error) error {
	backoff := 200 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
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
