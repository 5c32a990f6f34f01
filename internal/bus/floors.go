package bus

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// toolFloorsHistory is how many values of each tool's floor the bucket
// keeps: enough for an operator to see how a floor rose (`nats kv history`).
const toolFloorsHistory = 8

// ToolFloorsBucket creates (or, with Options.Update, updates) the
// planex-tool-floors bucket (BucketToolFloors) with the options Setup was
// given and returns it. Floors never expire: a tool's floor outlives its
// registrations, so a registration that lowers it is refused even after
// every executor of the tool has gone. Like SupervisorsBucket it is not
// part of Setup, because only the supervisor identity may create, read and
// write it.
func (r *Resources) ToolFloorsBucket(ctx context.Context) (jetstream.KeyValue, error) {
	opts := r.opts.withDefaults()
	return openKV(ctx, r.JS, jetstream.KeyValueConfig{
		Bucket:      BucketToolFloors,
		Description: "per tool, the most restrictive registration supervisors accepted; only supervisors write it",
		History:     toolFloorsHistory, Storage: opts.storage(), Replicas: opts.Replicas,
		MaxBytes: maxBytesFor(opts.MaxBytes, BucketToolFloors),
	}, opts.Update)
}
