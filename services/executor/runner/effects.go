package runner

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
)

// The planex-effects protocol. A side-effecting attempt owns the key
// bus.PoolEffectKey(pool, bus.EffectKey(run, step, attempt)): the pool's
// own keys, the only ones its NATS identity may write. Its value is a
// proto-encoded StepResult: with status UNSPECIFIED it records "started"
// (the tool may be acting right now, or its replica died while it did);
// with any other status it is the attempt's final result. The record is
// created with KV Create, so of two deliveries of one attempt only one can
// start it, and it is written before the tool acts: whatever happens
// afterwards, a later delivery finds it and never acts again.
//
// Records written before the per-pool layout live under the attempt key
// alone (bus.EffectKey). They are still read — a record found there
// counts as the attempt's, so an upgrade never repeats a side effect —
// and never written: the functions below take the attempt key and map it
// to the stored keys themselves.

// effectState is what a later delivery finds in planex-effects.
type effectState int

const (
	effectNone     effectState = iota // no record: the attempt may start
	effectStarted                     // started, outcome not recorded
	effectFinished                    // final result recorded
)

// storedKey is the planex-effects key of attempt key in this pool.
func (r *Runner) storedKey(key string) string { return bus.PoolEffectKey(r.opts.Pool, key) }

// peekEffect reads the record of attempt key and its revision: the
// pool's record, or else one written before the per-pool layout (whose
// revision is reported as 0: it is never updated).
func (r *Runner) peekEffect(ctx context.Context, key string) (effectState, *planexv1.StepResult, uint64, error) {
	state, rec, rev, err := r.readEffect(ctx, r.storedKey(key))
	if err != nil || state != effectNone {
		return state, rec, rev, err
	}
	state, rec, _, err = r.readEffect(ctx, key)
	return state, rec, 0, err
}

// readEffect reads the record stored under the planex-effects key stored.
func (r *Runner) readEffect(ctx context.Context, stored string) (effectState, *planexv1.StepResult, uint64, error) {
	e, err := r.res.Effects.Get(ctx, stored)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return effectNone, nil, 0, nil
	}
	if err != nil {
		return 0, nil, 0, fmt.Errorf("read effect record %s: %w", stored, err)
	}
	var rec planexv1.StepResult
	if err := proto.Unmarshal(e.Value(), &rec); err != nil {
		// Not transient: retry stops on it (see permanent).
		return 0, nil, 0, fmt.Errorf("decode effect record %s: %w: %w", stored, err, errCorruptRecord)
	}
	if rec.GetStatus() == planexv1.StepResultStatus_STEP_RESULT_STATUS_UNSPECIFIED {
		return effectStarted, &rec, e.Revision(), nil
	}
	return effectFinished, &rec, e.Revision(), nil
}

// errCorruptRecord marks an effect record that does not decode.
var errCorruptRecord = errors.New("corrupt effect record")

// startEffect creates the "started" record of attempt key. It reports
// false when another delivery created it first — or when a replica of
// the previous layout (during an upgrade) recorded the attempt under the
// attempt key meanwhile: the new record is then withdrawn, and the caller
// finds the old one.
func (r *Runner) startEffect(ctx context.Context, key string, started *planexv1.StepResult) (rev uint64, ok bool, err error) {
	data, err := proto.Marshal(started)
	if err != nil {
		return 0, false, fmt.Errorf("encode effect record %s: %w", key, err)
	}
	stored := r.storedKey(key)
	rev, err = r.res.Effects.Create(ctx, stored, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("create effect record %s: %w", stored, err)
	}
	state, _, _, err := r.readEffect(ctx, key)
	if err != nil {
		// Unknown: withdraw the record, so that the retry creates it and
		// checks again.
		return 0, false, errors.Join(fmt.Errorf("check the previous layout's record %s: %w", key, err), r.abandonEffect(ctx, key, rev))
	}
	if state != effectNone {
		if err := r.abandonEffect(ctx, key, rev); err != nil {
			return 0, false, err
		}
		return 0, false, nil
	}
	return rev, true, nil
}

// finishEffect records the final result of attempt key.
func (r *Runner) finishEffect(ctx context.Context, key string, rev uint64, res *planexv1.StepResult) error {
	data, err := proto.Marshal(res)
	if err != nil {
		return fmt.Errorf("encode effect record %s: %w", key, err)
	}
	stored := r.storedKey(key)
	if _, err := r.res.Effects.Update(ctx, stored, data, rev); err != nil {
		return fmt.Errorf("record result in %s: %w", stored, err)
	}
	return nil
}

// abandonEffect removes the "started" record of an attempt that had no
// effect (the tool failed with a retryable error before acting), so a
// redelivery may start it again.
func (r *Runner) abandonEffect(ctx context.Context, key string, rev uint64) error {
	stored := r.storedKey(key)
	if err := r.res.Effects.Delete(ctx, stored, jetstream.LastRevision(rev)); err != nil {
		return fmt.Errorf("remove effect record %s: %w", stored, err)
	}
	return nil
}
