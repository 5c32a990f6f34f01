package bus

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// OutputRef is what ReadOutput needs of a stored output's reference
// (planexv1.OutputRef).
type OutputRef interface {
	GetBucket() string
	GetName() string
	GetSize() int64
	GetSha256() string
}

// ErrOutputMismatch is returned by ReadOutput when the stored object is
// not the one the reference describes (size or SHA-256).
var ErrOutputMismatch = errors.New("stored output does not match its reference")

// ReadOutput reads the object an output reference names, from the bucket
// it names: ObjectOutputs or a pool's OutputBucket (CheckOutputBucket; any
// other bucket is refused). When the reference carries a size and a
// SHA-256, the object must match them.
func (r *Resources) ReadOutput(ctx context.Context, ref OutputRef) ([]byte, error) {
	store, err := r.OutputStore(ctx, ref.GetBucket())
	if err != nil {
		return nil, err
	}
	data, err := store.GetBytes(ctx, ref.GetName())
	if err != nil {
		return nil, fmt.Errorf("read output %s/%s: %w", ref.GetBucket(), ref.GetName(), err)
	}
	if ref.GetSize() > 0 && int64(len(data)) != ref.GetSize() {
		return nil, fmt.Errorf("read output %s/%s: %w: %d bytes, the reference says %d", ref.GetBucket(), ref.GetName(), ErrOutputMismatch, len(data), ref.GetSize())
	}
	if want := ref.GetSha256(); want != "" {
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != want {
			return nil, fmt.Errorf("read output %s/%s: %w: SHA-256 differs", ref.GetBucket(), ref.GetName(), ErrOutputMismatch)
		}
	}
	return data, nil
}

// OutputStore returns the output bucket named bucket (checked with
// CheckOutputBucket), bound once and kept. Resources not made by Setup
// (no OutputsBucket, e.g. an offline replay's) read every bucket from
// Outputs.
func (r *Resources) OutputStore(ctx context.Context, bucket string) (jetstream.ObjectStore, error) {
	if err := CheckOutputBucket(bucket); err != nil {
		return nil, err
	}
	if r.Outputs != nil && (bucket == r.OutputsBucket || r.OutputsBucket == "") {
		return r.Outputs, nil
	}
	readers := r.readers
	if readers == nil {
		// Resources built by hand (an offline replay's) cache nothing.
		readers = &outputReaders{}
	}
	readers.mu.Lock()
	store, ok := readers.m[bucket]
	readers.mu.Unlock()
	if ok {
		return store, nil
	}
	store, err := r.JS.ObjectStore(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("open output bucket %s: %w", bucket, err)
	}
	readers.mu.Lock()
	if readers.m == nil {
		readers.m = map[string]jetstream.ObjectStore{}
	}
	readers.m[bucket] = store
	readers.mu.Unlock()
	return store, nil
}

// PutOutputOnce stores data as name in store without ever replacing an
// object: nats.go's Put purges the chunks of the object it replaces, a
// right executors do not have (they may never purge). When name holds the
// same bytes already (a redelivered attempt) it is reused; when it holds
// other bytes (an attempt that ran again after its answer was lost) data
// is stored under name plus "/" and a unique suffix. It returns the name
// data is stored under.
func PutOutputOnce(ctx context.Context, store jetstream.ObjectStore, name string, data []byte) (string, error) {
	sum := sha256.Sum256(data)
	digest := "SHA-256=" + base64.URLEncoding.EncodeToString(sum[:])
	for i, n := 0, name; ; i, n = i+1, name+"/"+rand.Text() {
		info, err := store.GetInfo(ctx, n, jetstream.GetObjectInfoShowDeleted())
		switch {
		case errors.Is(err, jetstream.ErrObjectNotFound):
			if _, err := store.PutBytes(ctx, n, data); err != nil {
				return "", fmt.Errorf("store output %s: %w", n, err)
			}
			return n, nil
		case err != nil:
			return "", fmt.Errorf("look up output %s: %w", n, err)
		case !info.Deleted && info.Digest == digest && info.Size == uint64(len(data)):
			return n, nil
		case i >= 3:
			return "", fmt.Errorf("store output %s: every name tried is taken", name)
		}
	}
}

// CheckStepOutputRef checks the output reference in a step's result
// before the supervisor accepts it: an executor of pool may name only its
// pool's OutputBucket (or ObjectOutputs, where executors of earlier
// versions stored outputs) and only the object of this attempt
// (OutputName, or that name with the suffix PutOutputOnce adds). A
// reference to another pool's bucket, another run's or step's object, or
// the supervisor's stored results is refused, so that no executor can have
// the supervisor read for it what its own identity may not.
func CheckStepOutputRef(ref OutputRef, pool, runID, stepID string, attempt int32) error {
	if b := ref.GetBucket(); b != OutputBucket(pool) && b != ObjectOutputs {
		return fmt.Errorf("output reference of a %s step: bucket %q: %w: want %s", pool, b, ErrOutputBucket, OutputBucket(pool))
	}
	name := OutputName(runID, stepID, attempt)
	if n := ref.GetName(); n != name && (!strings.HasPrefix(n, name+"/") || strings.Contains(n[len(name)+1:], "/")) {
		return fmt.Errorf("output reference of step %s attempt %d: object %q: %w: want %s", stepID, attempt, n, ErrOutputForeign, name)
	}
	return nil
}

// ErrOutputForeign is returned by CheckStepOutputRef for a reference to an
// object that is not the attempt's own.
var ErrOutputForeign = errors.New("not this attempt's output")
