package bus

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketSchedules holds a tenant's schedules (internal/schedule): one key
// per schedule id, the schedule and its firing state as protobuf JSON, in
// the tenant's own NATS account; only the supervisor reads and writes it.
const BucketSchedules = "planex-schedules"

// SchedulesBucket creates (or, with Options.Update, updates) the
// planex-schedules bucket (BucketSchedules) of the account r is connected
// to and returns it. Like TenantsBucket it is not part of Setup: only the
// supervisor uses it. Entries never expire; every write is a
// compare-and-set, and five revisions are kept for `nats kv history`.
func (r *Resources) SchedulesBucket(ctx context.Context) (jetstream.KeyValue, error) {
	opts := r.opts.withDefaults()
	return openKV(ctx, r.JS, jetstream.KeyValueConfig{
		Bucket:      BucketSchedules,
		Description: "planex schedules: one key per schedule, its spec and firing state as protobuf JSON; only supervisors write it",
		History:     5, Storage: opts.storage(), Replicas: opts.Replicas,
		MaxBytes: maxBytesFor(opts.MaxBytes, BucketSchedules),
	}, opts.Update)
}
