package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/bus"
)

// toolSet is the immutable set of tools a replica serves; SetTools
// replaces it whole, so a step always sees one consistent set.
type toolSet struct {
	byName map[string]Tool
	specs  []*planexv1.ToolSpec // sorted by name
}

// newToolSet checks that every tool is named "<pool>.<verb>", belongs to
// pool and is unique.
func newToolSet(pool string, tools []Tool, wrap func(Tool) Tool) (*toolSet, error) {
	ts := &toolSet{byName: make(map[string]Tool, len(tools))}
	for _, t := range tools {
		if wrap != nil {
			t = wrap(t)
		}
		spec := t.Spec()
		name := spec.GetName()
		if _, err := bus.StepSubject(name); err != nil {
			return nil, err
		}
		if bus.PoolOf(name) != pool || spec.GetPool() != pool {
			return nil, fmt.Errorf("tool %q (pool %q) does not belong to pool %q", name, spec.GetPool(), pool)
		}
		if _, dup := ts.byName[name]; dup {
			return nil, fmt.Errorf("tool %q registered twice", name)
		}
		ts.byName[name] = t
		ts.specs = append(ts.specs, spec)
	}
	slices.SortFunc(ts.specs, func(a, b *planexv1.ToolSpec) int { return strings.Compare(a.GetName(), b.GetName()) })
	return ts, nil
}

// SetTools replaces the replica's tools while it runs (an MCP server
// added or removed tools): new and changed tools are registered in
// planex-tools at once, removed ones are deregistered, and steps fetched
// from now on run against the new set. Steps already running finish with
// the tool they started with. The pool's consumer filters on the whole
// pool (planex.steps.<pool>.>), so it needs no change. On error nothing
// changes.
func (r *Runner) SetTools(ctx context.Context, tools []Tool) error {
	ts, err := newToolSet(r.opts.Pool, tools, r.opts.WrapTool)
	if err != nil {
		return err
	}
	r.regMu.Lock()
	defer r.regMu.Unlock()
	old := r.tools.Swap(ts)
	if !r.registered {
		return nil // Start registers the new set
	}
	var errs []error
	if err := r.putSpecsLocked(ctx); err != nil {
		errs = append(errs, err)
	}
	for name := range old.byName {
		if _, kept := ts.byName[name]; kept {
			continue
		}
		key := bus.ToolKey(name, r.opts.ReplicaID)
		if err := r.res.Tools.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			errs = append(errs, fmt.Errorf("deregister tool %s: %w", key, err))
		}
	}
	r.logger.InfoContext(ctx, "tools changed", "tools", len(ts.specs))
	return errors.Join(errs...)
}

// register puts the replica's tool specs into planex-tools and returns how
// often they must be renewed: a third of the bucket's TTL, so two
// heartbeats may be lost before the catalog forgets the replica.
func (r *Runner) register(ctx context.Context) (time.Duration, error) {
	interval := 10 * time.Second
	st, err := r.res.Tools.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("read %s status: %w", bus.BucketTools, err)
	}
	if ttl := st.TTL(); ttl > 0 {
		interval = max(ttl/3, 50*time.Millisecond)
	}
	r.regMu.Lock()
	defer r.regMu.Unlock()
	r.registered = true
	return interval, r.putSpecsLocked(ctx)
}

func (r *Runner) putSpecs(ctx context.Context) error {
	r.regMu.Lock()
	defer r.regMu.Unlock()
	return r.putSpecsLocked(ctx)
}

// putSpecsLocked writes the current specs; the caller holds regMu, so a
// renewal never re-registers a tool SetTools just removed.
func (r *Runner) putSpecsLocked(ctx context.Context) error {
	for _, spec := range r.tools.Load().specs {
		data, err := proto.Marshal(spec)
		if err != nil {
			return fmt.Errorf("encode tool spec %s: %w", spec.GetName(), err)
		}
		key := bus.ToolKey(spec.GetName(), r.opts.ReplicaID)
		if _, err := r.res.Tools.Put(ctx, key, data); err != nil {
			return fmt.Errorf("register tool %s: %w", key, err)
		}
	}
	return nil
}

// registrationLoop renews the registrations until ctx ends.
func (r *Runner) registrationLoop(ctx context.Context, interval time.Duration) {
	defer close(r.hbDone)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pctx, cancel := context.WithTimeout(ctx, interval)
			err := r.putSpecs(pctx)
			if err == nil {
				err = r.scaleAckPending(pctx)
			}
			cancel()
			if err != nil && ctx.Err() == nil {
				r.logger.Warn("renew tool registrations", "err", err)
			}
		}
	}
}

// deregister removes the replica's registrations (clean shutdown).
func (r *Runner) deregister(ctx context.Context) error {
	r.regMu.Lock()
	defer r.regMu.Unlock()
	r.registered = false
	var errs []error
	for _, spec := range r.tools.Load().specs {
		key := bus.ToolKey(spec.GetName(), r.opts.ReplicaID)
		if err := r.res.Tools.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			errs = append(errs, fmt.Errorf("deregister tool %s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}
