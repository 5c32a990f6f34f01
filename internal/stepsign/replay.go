package stepsign

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ReplayBucket is the JetStream KV bucket the replicas of every executor
// pool share to refuse a step request replayed to another replica: one key
// per accepted signature, "<pool>.<hex SHA-256 of the signature>", holding
// the stream sequence it was first accepted under. Each key lives until
// its signature expires (per-key TTL; a replay after that is refused as
// expired), so the bucket holds the signatures valid right now only. On
// servers without per-key TTLs (nats-server before 2.11, e.g. Debian's
// 2.9) every key lives the bucket's MaxAge, MaxValidity: replay
// protection holds the same, the bucket just keeps expired signatures
// longer.
const ReplayBucket = "planex-step-replay"

// replayBucketMaxBytes caps the bucket: about 400,000 signatures valid at
// once (some 150 bytes each) — small beside the planex budget
// (--jetstream-max-bytes), which it comes on top of.
const replayBucketMaxBytes = 64 << 20

// replayMarkerTTL is how long the server keeps the marker of an expired
// key (it needs one to allow per-key TTLs).
const replayMarkerTTL = time.Minute

// ErrReplayCacheUnavailable is wrapped when the shared replay cache could
// not be asked: the request is neither executed nor refused for good (the
// executor gives the message back for later).
var ErrReplayCacheUnavailable = errors.New("replay_cache_unavailable")

// SharedReplays is the replay cache of one pool shared across its
// replicas, in a JetStream KV bucket whose entries live MaxValidity — as
// long as any signature they record can be valid.
type SharedReplays struct {
	kv   jetstream.KeyValue
	pool string
	// keyTTL: the bucket takes per-key TTLs (nats-server 2.11+).
	keyTTL bool
}

// OpenSharedReplays creates the ReplayBucket when missing (replicas as
// the other planex buckets) and returns pool's view of it. Keys expire
// with their signature where the server has per-message TTLs
// (nats-server 2.11 or later), else after MaxValidity.
func OpenSharedReplays(ctx context.Context, js jetstream.JetStream, pool string, replicas int) (*SharedReplays, error) {
	if replicas < 1 {
		replicas = 1
	}
	cfg := jetstream.KeyValueConfig{
		Bucket:         ReplayBucket,
		Description:    "planex: step request signatures already accepted by an executor replica (replay protection)",
		TTL:            MaxValidity,
		LimitMarkerTTL: replayMarkerTTL,
		History:        1,
		MaxBytes:       replayBucketMaxBytes,
		Storage:        jetstream.FileStorage,
		Replicas:       replicas,
	}
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
		cfg.LimitMarkerTTL = 0 // nats-server < 2.11: keys live MaxValidity
		kv, err = js.CreateKeyValue(ctx, cfg)
	}
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.KeyValue(ctx, ReplayBucket)
	}
	if err != nil {
		return nil, fmt.Errorf("step replay bucket %s: %w", ReplayBucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("step replay bucket %s: %w", ReplayBucket, err)
	}
	keyTTL := false
	if kvs, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		keyTTL = kvs.LimitMarkerTTL() > 0
		if st.TTL() < MaxValidity && !keyTTL {
			return nil, fmt.Errorf("step replay bucket %s: keys live %s, less than a signature's validity (%s); delete it (nats kv del %s) and restart", ReplayBucket, st.TTL(), MaxValidity, ReplayBucket)
		}
	}
	return &SharedReplays{kv: kv, pool: pool, keyTTL: keyTTL}, nil
}

// claim records sig, valid until expires, as accepted under stream
// sequence seq. The same
// signature already recorded under another sequence (or under sequence 0,
// a direct Execute call) is ErrReplayed; a failure to reach the bucket is
// ErrReplayCacheUnavailable.
func (s *SharedReplays) claim(ctx context.Context, sig [32]byte, seq uint64, expires, now time.Time) error {
	key := s.pool + "." + hex.EncodeToString(sig[:])
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// The server's smallest TTL is a second; a little past the expiry
	// covers clock skew between replicas.
	ttl := max(expires.Sub(now)+time.Minute, time.Second)
	var opts []jetstream.KVCreateOpt
	if s.keyTTL {
		opts = append(opts, jetstream.KeyTTL(ttl))
	}
	_, err := s.kv.Create(ctx, key, []byte(strconv.FormatUint(seq, 10)), opts...)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("%w: %w", ErrReplayCacheUnavailable, err)
	}
	e, err := s.kv.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrReplayCacheUnavailable, err)
	}
	first, _ := strconv.ParseUint(string(e.Value()), 10, 64)
	if first != seq || seq == 0 {
		return fmt.Errorf("%w: signature first accepted (by a replica of pool %s) at stream sequence %d, again at %d", ErrReplayed, s.pool, first, seq)
	}
	return nil
}
