package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
)

// fitOutput encodes out as JSON and, when it is larger than maxBytes, cuts
// a Truncatable output to the largest prefix of its items that fits.
func fitOutput(out any, maxBytes int) (data []byte, truncated bool, err error) {
	data, err = json.Marshal(out)
	if err != nil {
		return nil, false, fmt.Errorf("encode output: %w", err)
	}
	if len(data) <= maxBytes {
		return data, false, nil
	}
	t, ok := out.(Truncatable)
	if !ok {
		return nil, false, fmt.Errorf("output of %d bytes exceeds the %d byte cap", len(data), maxBytes)
	}
	var encErr error
	size := func(n int) []byte {
		b, err := json.Marshal(t.Cut(n))
		if err != nil {
			encErr = err
			return nil
		}
		return b
	}
	// The largest n whose encoding fits; encodings grow with n.
	n := sort.Search(t.Len()+1, func(n int) bool {
		b := size(n)
		return b == nil || len(b) > maxBytes
	}) - 1
	if encErr != nil {
		return nil, false, fmt.Errorf("encode output: %w", encErr)
	}
	if n < 0 {
		return nil, false, fmt.Errorf("output of %d bytes exceeds the %d byte cap even without items", len(data), maxBytes)
	}
	return size(n), true, nil
}

// jsonValue decodes JSON into a protobuf Value, as protojson would (numbers
// are float64), through encoding/json: a small output is the common case,
// and protojson costs several times more per call.
func jsonValue(data []byte) (*structpb.Value, error) {
	var x any
	if err := json.Unmarshal(data, &x); err != nil {
		return nil, fmt.Errorf("decode output JSON: %w", err)
	}
	v, err := structpb.NewValue(x)
	if err != nil {
		return nil, fmt.Errorf("decode output JSON: %w", err)
	}
	return v, nil
}

// storeOutput puts an output too large to inline into the runner's output
// bucket (its pool's bus.OutputBucket under its own NATS identity). It
// never replaces an object — that would purge its chunks, which executors
// may not — so a redelivered attempt reuses the object holding the same
// bytes, and one whose output differs is stored under a distinct name
// (bus.PutOutputOnce).
func (r *Runner) storeOutput(ctx context.Context, req *planexv1.StepRequest, data []byte) (*planexv1.OutputRef, error) {
	base, name := bus.OutputName(req.GetRunId(), req.GetStepId(), req.GetAttempt()), ""
	// An object of a few MB takes several calls; give it a few call
	// timeouts, and keep trying as the effect record does.
	err := r.retry(ctx, r.recordBy(time.Time{}), "store output "+base, func(ctx context.Context) (err error) {
		name, err = bus.PutOutputOnce(ctx, r.res.Outputs, base, data)
		return err
	})
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	return &planexv1.OutputRef{Bucket: r.res.OutputsBucket, Name: name, Size: int64(len(data)), Sha256: hex.EncodeToString(sum[:])}, nil
}
