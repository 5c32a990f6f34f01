package runner

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// The planex-effects protocol. A side-effecting attempt owns the key
// bus.EffectKey(run, step, attempt). Its value is a proto-encoded
// StepResult: with status UNSPECIFIED it records "started" (the tool may be
// acting right now, or its replica died while it did); with any other status
// it is the attempt's final result. The record is created with KV Create, so
// of two deliveries of one attempt only one can start it, and it is written
// before the tool acts: whatever happens afterwards, a later delivery finds
// it and never acts again.

// effectState is what a later delivery finds in planex-effects.
type effectState int

const (
	effectNone     effectState = iota // no record: the attempt may start
	effectStarted                     // started, outcome not recorded
	effectFinished                    // final result recorded
)

// peekEffect reads the record of key and its revision.
func (r *Runner) peekEffect(ctx context.Context, key string) (effectState, *planexv1.StepResult, uint64, error) {
	e, err := r.res.Effects.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return effectNone, nil, 0, nil
	}
	if err != nil {
		return 0, nil, 0, fmt.Errorf("read effect record %s: %w", key, err)
	}
	var rec planexv1.StepResult
	if err := proto.Unmarshal(e.Value(), &rec); err != nil {
		// Not transient: retry stops on it (see permanent).
		return 0, nil, 0, fmt.Errorf("decode effect record %s: %w: %w", key, err, errCorruptRecord)
	}
	if rec.GetStatus() == planexv1.StepResultStatus_STEP_RESULT_STATUS_UNSPECIFIED {
		return effectStarted, &rec, e.Revision(), nil
	}
	return effectFinished, &rec, e.Revision(), nil
}

// errCorruptRecord marks an effect record that does not decode.
var errCorruptRecord = errors.New("corrupt effect record")

// startEffect creates the "started" record of key. It reports false when
// another delivery created it first.
func (r *Runner) startEffect(ctx context.Context, key string, started *planexv1.StepResult) (rev uint64, ok bool, err error) {
	data, err := proto.Marshal(started)
	if err != nil {
		return 0, false, fmt.Errorf("encode effect record %s: %w", key, err)
	}
	rev, err = r.res.Effects.Create(ctx, key, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("create effect record %s: %w", key, err)
	}
	return rev, true, nil
}

// finishEffect records the final result of key.
func (r *Runner) finishEffect(ctx context.Context, key string, rev uint64, res *planexv1.StepResult) error {
	data, err := proto.Marshal(res)
	if err != nil {
		return fmt.Errorf("encode effect record %s: %w", key, err)
	}
	if _, err := r.res.Effects.Update(ctx, key, data, rev); err != nil {
		return fmt.Errorf("record result in %s: %w", key, err)
	}
	return nil
}

// abandonEffect removes the "started" record of an attempt that had no
// effect (the tool failed with a retryable error before acting), so a
// redelivery may start it again.
func (r *Runner) abandonEffect(ctx context.Context, key string, rev uint64) error {
	if err := r.res.Effects.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
		return fmt.Errorf("remove effect record %s: %w", key, err)
	}
	return nil
}
