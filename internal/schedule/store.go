package schedule

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Errors of the store, which the API translates to gRPC codes.
var (
	// ErrNotFound: no schedule of that id.
	ErrNotFound = errors.New("no such schedule")
	// ErrExists: a schedule of that id exists.
	ErrExists = errors.New("schedule already exists")
	// ErrConflict: the schedule changed since the revision given.
	ErrConflict = errors.New("schedule changed since it was read (revision)")
)

// Store is the planex-schedules bucket of one tenant's account: one key
// per schedule id, a StoredSchedule as protobuf JSON (readable with
// `nats kv get`). Every write is a compare-and-set on the key's revision.
type Store struct {
	kv jetstream.KeyValue
}

// NewStore returns the store over kv (bus.Resources.SchedulesBucket).
func NewStore(kv jetstream.KeyValue) *Store { return &Store{kv: kv} }

// Entry is a stored schedule at a revision.
type Entry struct {
	// Stored is the schedule and its state.
	Stored *planexv1.StoredSchedule
	// Revision is the KV revision it was read at.
	Revision uint64
}

// Get reads a schedule.
func (s *Store) Get(ctx context.Context, id string) (*Entry, error) {
	if err := ValidID(id); err != nil {
		return nil, ErrNotFound
	}
	e, err := s.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read schedule %s: %w", id, err)
	}
	return decode(e)
}

func decode(e jetstream.KeyValueEntry) (*Entry, error) {
	st := &planexv1.StoredSchedule{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(e.Value(), st); err != nil {
		return nil, fmt.Errorf("decode schedule %s: %w", e.Key(), err)
	}
	if st.Schedule == nil {
		st.Schedule = &planexv1.Schedule{}
	}
	if st.State == nil {
		st.State = &planexv1.ScheduleState{}
	}
	st.Schedule.Revision = e.Revision()
	return &Entry{Stored: st, Revision: e.Revision()}, nil
}

func encode(st *planexv1.StoredSchedule) ([]byte, error) {
	c := proto.Clone(st).(*planexv1.StoredSchedule)
	c.GetSchedule().Revision = 0
	c.GetSchedule().NextFirings = nil
	return protojson.Marshal(c)
}

// Create stores a new schedule; ErrExists when the id is taken.
func (s *Store) Create(ctx context.Context, st *planexv1.StoredSchedule) (uint64, error) {
	b, err := encode(st)
	if err != nil {
		return 0, err
	}
	rev, err := s.kv.Create(ctx, st.GetSchedule().GetId(), b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, ErrExists
	}
	if err != nil {
		return 0, fmt.Errorf("create schedule %s: %w", st.GetSchedule().GetId(), err)
	}
	return rev, nil
}

// Update writes st if the schedule is still at revision rev;
// ErrConflict otherwise.
func (s *Store) Update(ctx context.Context, st *planexv1.StoredSchedule, rev uint64) (uint64, error) {
	b, err := encode(st)
	if err != nil {
		return 0, err
	}
	n, err := s.kv.Update(ctx, st.GetSchedule().GetId(), b, rev)
	if isConflict(err) {
		return 0, ErrConflict
	}
	if err != nil {
		return 0, fmt.Errorf("update schedule %s: %w", st.GetSchedule().GetId(), err)
	}
	return n, nil
}

// isConflict reports a compare-and-set that lost (wrong last sequence).
func isConflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || (errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence)
}

// Delete removes a schedule at revision rev (0: whatever is stored).
func (s *Store) Delete(ctx context.Context, id string, rev uint64) error {
	if _, err := s.Get(ctx, id); err != nil {
		return err
	}
	var opts []jetstream.KVDeleteOpt
	if rev != 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	err := s.kv.Delete(ctx, id, opts...)
	if isConflict(err) {
		return ErrConflict
	}
	if err != nil {
		return fmt.Errorf("delete schedule %s: %w", id, err)
	}
	return nil
}

// List reads every schedule, by id.
func (s *Store) List(ctx context.Context) ([]*Entry, error) {
	keys, err := s.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list schedules: %w", err)
	}
	var ids []string
	for k := range keys.Keys() {
		ids = append(ids, k)
	}
	slices.Sort(ids)
	var out []*Entry
	for _, id := range ids {
		e, err := s.Get(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue // deleted since listed
		}
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}
