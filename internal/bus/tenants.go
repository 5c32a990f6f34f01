package bus

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// TenantsBucket creates (or, with Options.Update, updates) the
// planex-tenants bucket (BucketTenants) and returns it. Like
// ToolFloorsBucket it is not part of Setup: only the supervisor of the
// default tenant's account creates, reads and writes it. Entries never
// expire; five revisions of each tenant are kept for `nats kv history`.
func (r *Resources) TenantsBucket(ctx context.Context) (jetstream.KeyValue, error) {
	opts := r.opts.withDefaults()
	return openKV(ctx, r.JS, jetstream.KeyValueConfig{
		Bucket:      BucketTenants,
		Description: "planex tenant registry: one key per tenant, its spec as protobuf JSON; only supervisors write it",
		History:     5, Storage: opts.storage(), Replicas: opts.Replicas,
		MaxBytes: maxBytesFor(opts.MaxBytes, BucketTenants),
	}, opts.Update)
}

// UsageBucket creates (or updates) the planex-usage bucket (BucketUsage)
// of the account r is connected to: a tenant's usage counters, one key per
// UTC day. Only the supervisor writes it; entries are kept for the events'
// retention (or forever).
func (r *Resources) UsageBucket(ctx context.Context) (jetstream.KeyValue, error) {
	opts := r.opts.withDefaults()
	return openKV(ctx, r.JS, jetstream.KeyValueConfig{
		Bucket:      BucketUsage,
		Description: "planex usage per UTC day (runs, steps, model tokens, cost); only supervisors write it",
		History:     1, Storage: opts.storage(), Replicas: opts.Replicas,
		MaxBytes: maxBytesFor(opts.MaxBytes, BucketUsage),
	}, opts.Update)
}
