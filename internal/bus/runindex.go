package bus

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// RunIndexBucket creates (or, with Options.Update, updates) the
// planex-run-index object store (ObjectRunIndex) with the options Setup
// was given and returns it. It holds one object, the supervisors' latest
// checkpoint of their run index (a compact copy of every run's summary and
// the planex-runs revision it is complete up to), which a restarted
// supervisor loads instead of decoding every snapshot. A cache: losing it
// costs a slower start, nothing else. Like SupervisorsBucket it is not
// part of Setup, because only the supervisor identity may create, read
// and write it.
func (r *Resources) RunIndexBucket(ctx context.Context) (jetstream.ObjectStore, error) {
	opts := r.opts.withDefaults()
	return openObjectStore(ctx, r.JS, jetstream.ObjectStoreConfig{
		Bucket:      ObjectRunIndex,
		Description: "checkpoint of the supervisors' run index (a cache of planex-runs' summaries)",
		Storage:     opts.storage(),
		Replicas:    opts.Replicas,
		MaxBytes:    maxBytesFor(opts.MaxBytes, ObjectRunIndex),
	}, opts.Update)
}
