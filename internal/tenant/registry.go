package tenant

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
)

// Errors of the registry, which the API translates to gRPC codes.
var (
	// ErrNotFound: no tenant of that name.
	ErrNotFound = errors.New("no such tenant")
	// ErrExists: CreateTenant of a name taken.
	ErrExists = errors.New("tenant already exists")
	// ErrConflict: UpdateTenant with a revision that is not the stored one.
	ErrConflict = errors.New("tenant changed since it was read (revision)")
)

// Registry is the tenant registry: the planex-tenants bucket
// (bus.Resources.TenantsBucket) and a cache of it that a watch keeps
// current, so resolving a caller's tenant reads no KV.
type Registry struct {
	kv  jetstream.KeyValue
	now func() time.Time

	mu      sync.RWMutex
	tenants map[string]*planexv1.Tenant // by name, with revision set
	ready   chan struct{}               // closed once the watch listed the bucket
	subs    []chan struct{}             // notified (non-blocking) on every change
}

// NewRegistry returns a registry over kv; Run keeps its cache current.
func NewRegistry(kv jetstream.KeyValue) *Registry {
	return &Registry{kv: kv, now: time.Now, tenants: map[string]*planexv1.Tenant{}, ready: make(chan struct{})}
}

// Run watches the bucket until ctx ends, keeping the cache current and
// notifying Changes' subscribers. The watch is made again after an error.
func (r *Registry) Run(ctx context.Context) error {
	first := true
	for ctx.Err() == nil {
		err := r.watch(ctx, &first)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

func (r *Registry) watch(ctx context.Context, first *bool) error {
	w, err := r.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", r.kv.Bucket(), err)
	}
	defer func() { _ = w.Stop() }()
	seen := map[string]*planexv1.Tenant{}
	initial := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("tenant registry watch ended")
			}
			if e == nil { // end of the initial values
				initial = false
				r.mu.Lock()
				r.tenants = seen
				r.mu.Unlock()
				if *first {
					*first = false
					close(r.ready)
				}
				r.notify()
				continue
			}
			t, err := decode(e)
			target := seen
			if !initial {
				r.mu.Lock()
				target = maps(r.tenants)
			}
			if err != nil || e.Operation() != jetstream.KeyValuePut {
				delete(target, e.Key())
			} else {
				target[e.Key()] = t
			}
			if !initial {
				r.tenants = target
				r.mu.Unlock()
				r.notify()
			}
		}
	}
}

func maps(m map[string]*planexv1.Tenant) map[string]*planexv1.Tenant {
	out := make(map[string]*planexv1.Tenant, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (r *Registry) notify() {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, c := range r.subs {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// Changes returns a channel that receives (coalesced) after every change
// the watch sees, and once after the first listing.
func (r *Registry) Changes() <-chan struct{} {
	c := make(chan struct{}, 1)
	r.mu.Lock()
	r.subs = append(r.subs, c)
	r.mu.Unlock()
	return c
}

// Ready returns a channel closed once the cache holds the bucket's
// contents (the first listing of the watch).
func (r *Registry) Ready() <-chan struct{} { return r.ready }

// List returns the cached tenants by name (copies; the default tenant is
// not among them).
func (r *Registry) List() []*planexv1.Tenant {
	r.mu.RLock()
	out := make([]*planexv1.Tenant, 0, len(r.tenants))
	for _, t := range r.tenants {
		out = append(out, proto.Clone(t).(*planexv1.Tenant))
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b *planexv1.Tenant) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}

// Cached returns the cached tenant of that name (a copy), or nil.
func (r *Registry) Cached(name string) *planexv1.Tenant {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if t, ok := r.tenants[name]; ok {
		return proto.Clone(t).(*planexv1.Tenant)
	}
	return nil
}

// Resolve returns the tenant of an authenticated caller from the cache
// (see the package-level Resolve).
func (r *Registry) Resolve(id authn.Identity) (string, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if id.Tenant == "" && len(r.tenants) == 0 {
		return Default, nil
	}
	list := make([]*planexv1.Tenant, 0, len(r.tenants))
	for _, t := range r.tenants {
		list = append(list, t)
	}
	slices.SortFunc(list, func(a, b *planexv1.Tenant) int { return strings.Compare(a.GetName(), b.GetName()) })
	return Resolve(id, list)
}

// Get reads a tenant from the bucket (not the cache).
func (r *Registry) Get(ctx context.Context, name string) (*planexv1.Tenant, error) {
	if err := ValidName(name); err != nil {
		return nil, fmt.Errorf("name: %w", err)
	}
	e, err := r.kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("read tenant %q: %w", name, err)
	}
	return decode(e)
}

// Create stores a new tenant (validated); the name must be free.
func (r *Registry) Create(ctx context.Context, t *planexv1.Tenant) (*planexv1.Tenant, error) {
	if err := Validate(t); err != nil {
		return nil, err
	}
	t = spec(t)
	now := timestamppb.New(r.now())
	t.CreateTime, t.UpdateTime = now, now
	data, err := protojson.Marshal(t)
	if err != nil {
		return nil, err
	}
	rev, err := r.kv.Create(ctx, t.GetName(), data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return nil, fmt.Errorf("%w: %q", ErrExists, t.GetName())
	}
	if err != nil {
		return nil, fmt.Errorf("store tenant %q: %w", t.GetName(), err)
	}
	t.Revision = rev
	return t, nil
}

// Update replaces a tenant's spec; t.Revision, when not 0, must be the
// stored revision.
func (r *Registry) Update(ctx context.Context, t *planexv1.Tenant) (*planexv1.Tenant, error) {
	if err := Validate(t); err != nil {
		return nil, err
	}
	cur, err := r.Get(ctx, t.GetName())
	if err != nil {
		return nil, err
	}
	if t.GetRevision() != 0 && t.GetRevision() != cur.GetRevision() {
		return nil, fmt.Errorf("%w: stored revision %d, request %d: read it again", ErrConflict, cur.GetRevision(), t.GetRevision())
	}
	n := spec(t)
	n.CreateTime, n.UpdateTime = cur.GetCreateTime(), timestamppb.New(r.now())
	data, err := protojson.Marshal(n)
	if err != nil {
		return nil, err
	}
	rev, err := r.kv.Update(ctx, n.GetName(), data, cur.GetRevision())
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("%w: read it again", ErrConflict)
		}
		return nil, fmt.Errorf("store tenant %q: %w", n.GetName(), err)
	}
	n.Revision = rev
	return n, nil
}

// Delete removes a tenant from the registry.
func (r *Registry) Delete(ctx context.Context, name string) error {
	cur, err := r.Get(ctx, name)
	if err != nil {
		return err
	}
	if err := r.kv.Delete(ctx, name, jetstream.LastRevision(cur.GetRevision())); err != nil {
		return fmt.Errorf("delete tenant %q: %w", name, err)
	}
	return nil
}

// spec is t without its output-only fields.
func spec(t *planexv1.Tenant) *planexv1.Tenant {
	t = proto.Clone(t).(*planexv1.Tenant)
	t.CreateTime, t.UpdateTime, t.Revision, t.Ready, t.NotReadyReason, t.NatsAccount = nil, nil, 0, false, "", ""
	return t
}

func decode(e jetstream.KeyValueEntry) (*planexv1.Tenant, error) {
	t := &planexv1.Tenant{}
	if err := protojson.Unmarshal(e.Value(), t); err != nil {
		return nil, fmt.Errorf("tenant %q in the registry: %w", e.Key(), err)
	}
	t.Revision = e.Revision()
	return t, nil
}
