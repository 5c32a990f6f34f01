package runlog

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// The search index: a compact summary of every run with a snapshot in
// planex-runs, kept in memory from a watch of the bucket's values, so that
// ListRuns and RunBatch filter in memory and read from the bucket only the
// runs they return.
//
// Why the values and not keys only: a summary needs the status, labels,
// goal, tools, owner, stop reason, gates and fork origin, all in the
// snapshot; reading each snapshot after a keys-only update would cost a
// round trip per update and race with the next write, whereas the watch
// delivers every snapshot write in revision order. A snapshot is written
// at every status change (before the change is settled) and every so many
// events, so a summary is as fresh as the snapshot ListRuns used to read.
// This replica's own writes are applied at once (Log.writeSnapshot), the
// watch's later delivery of the same revision being ignored.
//
// Memory: per run one runSummary in a slice sorted by id, plus its
// lowercased goal; owners, fork origins, label sets and tool sets are
// interned with reference counts, so runs that share them (a scheduled
// goal, one team's labels) share one copy and a deleted run's copy is
// freed with its last user.

// runSummary is what the index keeps of one run (120 bytes, plus the
// goal's bytes and, for a goal with capitals, a bit per byte): what
// filters match and what ListRuns' basic view shows.
type runSummary struct {
	id         runKey
	rev        uint64 // planex-runs revision it was read from
	created    int64  // Run.created_at, Unix nanoseconds (0: unset)
	updated    int64  // Run.updated_at, Unix nanoseconds (0: unset)
	goal       string // lowercased, then what restores it (caps); rarely shared, so not interned
	startedBy  *istr  // nil: none
	forkedFrom *istr  // nil: not a fork
	parent     *istr  // nil: not a child run
	labels     *tagSet
	tools      *tagSet
	steps      uint16 // step states (saturating)
	done       uint16 // of those, succeeded (saturating)
	glen       uint16 // length of the lowercased goal in goal (capsNone: all of it)
	status     uint8  // planexv1.RunStatus
	stop       uint8  // planexv1.StopReason
	waiting    bool   // WAITING at an open gate
	caps       uint8  // how goal restores the goal as written
}

// How a summary's goal field restores the goal as written after its
// lowercased form.
const (
	capsNone  = iota // the goal has no capitals: goal is all of it
	capsASCII        // only ASCII capitals: a bitmap follows (bit i of byte i/8: byte i was a capital)
	capsRaw          // other capitals: the goal as written follows
)

// packGoal is what a summary keeps of goal: its lowercased form, followed
// by what restores the goal as written (caps), and that form's length.
func packGoal(goal string) (packed string, glen uint16, caps uint8) {
	lower := strings.ToLower(goal)
	switch {
	case lower == goal:
		return strings.Clone(goal), uint16(min(len(goal), 1<<16-1)), capsNone
	case len(lower) >= 1<<16:
		// Longer than any goal the API takes: listed lowercased.
		return lower, 1<<16 - 1, capsNone
	case len(lower) == len(goal) && asciiCaseOnly(goal, lower):
		bits := make([]byte, (len(goal)+7)/8)
		for i := range len(goal) {
			if goal[i] != lower[i] {
				bits[i/8] |= 1 << (i % 8)
			}
		}
		return lower + string(bits), uint16(len(lower)), capsASCII
	default:
		return lower + goal, uint16(len(lower)), capsRaw
	}
}

// asciiCaseOnly reports whether goal and lower (its lowercased form, of
// the same length) differ only in ASCII capitals.
func asciiCaseOnly(goal, lower string) bool {
	for i := range len(goal) {
		if c := goal[i]; c != lower[i] && (c < 'A' || c > 'Z' || lower[i] != c+'a'-'A') {
			return false
		}
	}
	return true
}

// lowerGoal is the run's goal lowercased, what goal words match.
func (s *runSummary) lowerGoal() string {
	if s.caps == capsNone {
		return s.goal
	}
	return s.goal[:s.glen]
}

// text is the run's goal as written.
func (s *runSummary) text() string {
	switch s.caps {
	case capsASCII:
		b := []byte(s.goal[:s.glen])
		bits := s.goal[s.glen:]
		for i := range b {
			if bits[i/8]&(1<<(i%8)) != 0 {
				b[i] -= 'a' - 'A'
			}
		}
		return string(b)
	case capsRaw:
		return s.goal[s.glen:]
	}
	return s.goal
}

// stepCounts are a run's step states and how many of them succeeded.
type stepCounts struct{ total, succeeded int }

// countSteps counts run's step states.
func countSteps(run *planexv1.Run) stepCounts {
	c := stepCounts{total: len(run.GetSteps())}
	for _, st := range run.GetSteps() {
		if st.GetStatus() == planexv1.StepStatus_STEP_STATUS_SUCCEEDED {
			c.succeeded++
		}
	}
	return c
}

func sat16(n int) uint16 { return uint16(min(max(n, 0), 1<<16-1)) }

// runKey is a run id: a ULID in its 16 bytes (every run id planex makes;
// no allocation of its own), or any other id as text in ext.
type runKey struct {
	u   ulid.ULID
	ext *string
}

func makeKey(id string) runKey {
	if u, err := ulid.ParseStrict(id); err == nil && u.String() == id {
		return runKey{u: u}
	}
	id = strings.Clone(id)
	return runKey{ext: &id}
}

func (k runKey) String() string {
	if k.ext != nil {
		return *k.ext
	}
	return k.u.String()
}

// compare orders keys as their ids' text (a ULID's bytes sort as its
// text).
func (k runKey) compare(o runKey) int {
	if k.ext == nil && o.ext == nil {
		return k.u.Compare(o.u)
	}
	return strings.Compare(k.String(), o.String())
}

// istr is an interned string with its reference count.
type istr struct {
	s    string
	refs int32
}

// tagSet is an interned set of labels (sorted key, value pairs) or tools
// (sorted names, values empty).
type tagSet struct {
	key   string   // canonical encoding, the interning key
	pairs []string // k0, v0, k1, v1, ... sorted by key
	refs  int32
}

// get returns the value of label k.
func (t *tagSet) get(k string) (string, bool) {
	if t == nil {
		return "", false
	}
	n := len(t.pairs) / 2
	lo, hi := 0, n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if t.pairs[2*m] < k {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < n && t.pairs[2*lo] == k {
		return t.pairs[2*lo+1], true
	}
	return "", false
}

// interner holds the interned strings and sets of an index; a nil
// interner makes fresh, unshared ones (for a run matched on its own).
type interner struct {
	strs map[string]*istr
	sets map[string]*tagSet
}

func (in *interner) str(s string) *istr {
	if s == "" {
		return nil
	}
	if in == nil {
		return &istr{s: s}
	}
	if p := in.strs[s]; p != nil {
		p.refs++
		return p
	}
	p := &istr{s: strings.Clone(s), refs: 1}
	in.strs[p.s] = p
	return p
}

func (in *interner) dropStr(p *istr) {
	if in == nil || p == nil {
		return
	}
	if p.refs--; p.refs <= 0 {
		delete(in.strs, p.s)
	}
}

// set interns the set of pairs (k0, v0, k1, v1, ..., sorted by key).
func (in *interner) set(pairs []string) *tagSet {
	if len(pairs) == 0 {
		return nil
	}
	var b []byte
	for _, p := range pairs {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	if in == nil {
		return &tagSet{pairs: pairs}
	}
	if t := in.sets[string(b)]; t != nil {
		t.refs++
		return t
	}
	t := &tagSet{key: string(b), pairs: slices.Clip(pairs), refs: 1}
	in.sets[t.key] = t
	return t
}

func (in *interner) dropSet(t *tagSet) {
	if in == nil || t == nil {
		return
	}
	if t.refs--; t.refs <= 0 {
		delete(in.sets, t.key)
	}
}

// summarize builds the summary of run, interning through in (nil: not
// shared).
func summarize(run *planexv1.Run, rev uint64, in *interner) runSummary {
	return summarizeTools(run, wireFacts{tools: planTools(run), steps: countSteps(run)}, rev, in)
}

// planTools lists the tools the run's plans call.
func planTools(run *planexv1.Run) []string {
	var tools []string
	for _, p := range run.GetPlans() {
		for _, st := range p.GetSteps() {
			if t := st.GetTool(); t != "" && !slices.Contains(tools, t) {
				tools = append(tools, t)
			}
		}
	}
	return tools
}

// wireFacts are what the index reads of a snapshot in place, without
// decoding: the tools its plans call and its step counts.
type wireFacts struct {
	tools []string
	steps stepCounts
}

// summarizeTools is summarize with the run's tools and step counts given.
func summarizeTools(run *planexv1.Run, facts wireFacts, rev uint64, in *interner) runSummary {
	tools := facts.tools
	goal, glen, caps := packGoal(run.GetGoal()) // a copy, not the snapshot's memory
	s := runSummary{
		id:         makeKey(run.GetId()),
		rev:        rev,
		goal:       goal,
		glen:       glen,
		caps:       caps,
		steps:      sat16(facts.steps.total),
		done:       sat16(facts.steps.succeeded),
		startedBy:  in.str(run.GetStartedBy()),
		forkedFrom: in.str(run.GetForkedFrom().GetRunId()),
		parent:     in.str(run.GetParentRunId()),
		status:     uint8(min(max(run.GetStatus(), 0), 255)),
		stop:       uint8(min(max(run.GetStopReason(), 0), 255)),
	}
	if t := run.GetCreatedAt(); t != nil {
		s.created = t.AsTime().UnixNano()
	}
	if t := run.GetUpdatedAt(); t != nil {
		s.updated = t.AsTime().UnixNano()
	}
	if len(run.GetLabels()) > 0 {
		keys := make([]string, 0, len(run.GetLabels()))
		for k := range run.GetLabels() {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		pairs := make([]string, 0, 2*len(keys))
		for _, k := range keys {
			pairs = append(pairs, k, run.GetLabels()[k])
		}
		s.labels = in.set(pairs)
	}
	if len(tools) > 0 {
		slices.Sort(tools)
		pairs := make([]string, 0, 2*len(tools))
		for _, t := range tools {
			pairs = append(pairs, t, "")
		}
		s.tools = in.set(pairs)
	}
	if run.GetStatus() == planexv1.RunStatus_RUN_STATUS_WAITING {
		for _, g := range run.GetGates() {
			if GateOpen(run, g) {
				s.waiting = true
				break
			}
		}
	}
	return s
}

// release drops s's references to interned values.
func (in *interner) release(s *runSummary) {
	in.dropStr(s.startedBy)
	in.dropStr(s.forkedFrom)
	in.dropStr(s.parent)
	in.dropSet(s.labels)
	in.dropSet(s.tools)
}

// Query selects runs: every condition set must hold (the API's RunFilter,
// validated and compiled).
type Query struct {
	// Statuses: only runs in one of these (empty: any).
	Statuses []planexv1.RunStatus
	// StopReasons: only runs with one of these (empty: any).
	StopReasons []planexv1.StopReason
	// Labels, when set, reports whether a run's labels match; get returns
	// the value of a label.
	Labels func(get func(key string) (string, bool)) bool
	// GoalWords must all appear in the goal; they are lowercased and the
	// goal is compared lowercased.
	GoalWords []string
	// Tools: only runs whose plans call one of these (empty: any).
	Tools []string
	// StartedBy: only runs started by this identity ("" : any).
	StartedBy string
	// CreatedAfter and CreatedBefore bound Run.created_at (at or after,
	// before; zero: unbounded).
	CreatedAfter, CreatedBefore time.Time
	// Waiting: only runs waiting at an open gate.
	Waiting bool
	// RunIDs: only these runs (nil: any).
	RunIDs map[string]bool
	// ForkedFrom: only forks of this run ("": any).
	ForkedFrom string
	// ParentRunID: only child runs of this run ("": any).
	ParentRunID string
	// Roots: only runs that are no run's child (started by StartRun, a
	// fork, a schedule or a trigger).
	Roots bool
}

// matcher is a Query prepared for matching many summaries.
type matcher struct {
	q             *Query
	statuses      uint64 // bit per RunStatus; 0: any
	stops         uint64 // bit per StopReason; 0: any
	after, before int64
	words         []string
	ulids         map[ulid.ULID]bool // q.RunIDs that are ULIDs
}

func bit(n int32) uint64 {
	if n < 0 || n >= 64 {
		return 1 << 63 // never a real value: matches nothing else
	}
	return 1 << uint(n)
}

func (q *Query) matcher() *matcher {
	m := &matcher{q: q, after: -1 << 63, before: 1<<63 - 1}
	for _, s := range q.Statuses {
		m.statuses |= bit(int32(s))
	}
	for _, s := range q.StopReasons {
		m.stops |= bit(int32(s))
	}
	if !q.CreatedAfter.IsZero() {
		m.after = q.CreatedAfter.UnixNano()
	}
	if !q.CreatedBefore.IsZero() {
		m.before = q.CreatedBefore.UnixNano()
	}
	for _, w := range q.GoalWords {
		m.words = append(m.words, strings.ToLower(w))
	}
	if q.RunIDs != nil {
		m.ulids = map[ulid.ULID]bool{}
		for id, ok := range q.RunIDs {
			if k := makeKey(id); ok && k.ext == nil {
				m.ulids[k.u] = true
			}
		}
	}
	return m
}

func (m *matcher) match(s *runSummary) bool {
	q := m.q
	switch {
	case m.statuses != 0 && m.statuses&bit(int32(s.status)) == 0,
		m.stops != 0 && m.stops&bit(int32(s.stop)) == 0,
		q.Waiting && !s.waiting,
		s.created < m.after || s.created >= m.before,
		q.StartedBy != "" && (s.startedBy == nil || s.startedBy.s != q.StartedBy),
		q.ForkedFrom != "" && (s.forkedFrom == nil || s.forkedFrom.s != q.ForkedFrom),
		q.ParentRunID != "" && (s.parent == nil || s.parent.s != q.ParentRunID),
		q.Roots && s.parent != nil,
		q.RunIDs != nil && !m.hasID(s.id):
		return false
	}
	if q.Labels != nil && !q.Labels(s.labels.get) {
		return false
	}
	if len(q.Tools) > 0 {
		found := false
		for _, t := range q.Tools {
			if _, ok := s.tools.get(t); ok {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	for _, w := range m.words {
		if !strings.Contains(s.lowerGoal(), w) {
			return false
		}
	}
	return true
}

func (m *matcher) hasID(k runKey) bool {
	if k.ext != nil {
		return m.q.RunIDs[*k.ext]
	}
	return m.ulids[k.u]
}

// MatchRun reports whether run matches q (the same test the index applies
// to its summaries).
func (q *Query) MatchRun(run *planexv1.Run) bool {
	s := summarize(run, 0, nil)
	return q.matcher().match(&s)
}

// searchIndex is the index: summaries sorted by run id (ULIDs: oldest
// first), loaded from a watch of planex-runs and kept up to date by it.
type searchIndex struct {
	mu    sync.RWMutex
	ready bool
	runs  []runSummary
	// loading maps an id to its position in runs while the watch delivers
	// the bucket's current values (in revision order, not id order): runs
	// is sorted once they are all in.
	loading map[string]int
	in      interner
	// loaded is closed once the index was first complete; loadTime is how
	// long that took from the start of the watch.
	loaded   chan struct{}
	loadOnce sync.Once
	loadTime time.Duration
	// rewatches counts watches started again because the first reported
	// no snapshot in a bucket that holds some (only the watch goroutine,
	// one at a time, reads and writes it).
	rewatches int

	// cp configures checkpoints (checkpoint.go); cp.Store nil: none.
	// cpMu serializes writing them.
	cp   IndexCheckpoints
	cpMu sync.Mutex
	// applied is the revision up to which every write of the bucket is
	// in the index (the watch's last entry once its initial values are
	// in); changes counts the watch's entries since the last checkpoint,
	// whose revision is checkpointRev. Under mu.
	applied, checkpointRev uint64
	changes                int
	// restoreTime is how long loading the checkpoint took, and restored
	// how many runs it held (0: none was used).
	restoreTime time.Duration
	restored    int
	// settled is set once the index was first loaded (sorted, not
	// loading): what a checkpoint may copy, even after the watch ended.
	settled bool
}

// maxRewatches bounds those: a bucket holding only deletion markers looks
// the same, and is indexed as empty after them.
const maxRewatches = 20

func (x *searchIndex) init() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.loaded == nil {
		x.loaded = make(chan struct{})
		x.loading = map[string]int{}
		x.in = interner{strs: map[string]*istr{}, sets: map[string]*tagSet{}}
	}
}

// watch loads the index from a watch of kv's values and follows it until
// ctx ends (or the watch fails, which leaves the index unused: listing
// then reads the bucket). With checkpoints it loads the last one and
// watches the bucket from the revision after it, and it writes them.
func (x *searchIndex) watch(ctx context.Context, kv jetstream.KeyValue, logger *slog.Logger) {
	x.init()
	began := time.Now()
	if x.cp.Store == nil || x.rewatches > 0 {
		x.follow(ctx, kv, logger, began, false, nil)
		return
	}
	// The checkpoint is read in the background, as the bucket is without
	// one: a replica's start never waits on it.
	go func() {
		rctx, cancel := context.WithTimeout(ctx, checkpointReadTimeout)
		rev, n, err := x.restore(rctx, kv, x.cp.Store)
		cancel()
		switch {
		case err != nil:
			logger.WarnContext(ctx, "run index checkpoint unusable; loading the index from planex-runs", "err", err)
		case rev > 0:
			x.mu.Lock()
			x.restoreTime, x.restored = time.Since(began), n
			x.mu.Unlock()
			logger.DebugContext(ctx, "run index checkpoint loaded", "runs", n, "revision", rev, "took", time.Since(began))
			x.follow(ctx, kv, logger, began, true, []jetstream.WatchOpt{jetstream.ResumeFromRevision(rev + 1)})
			return
		}
		x.follow(ctx, kv, logger, began, false, nil)
	}()
}

// follow watches kv with opts (resumed: after a checkpoint's revision,
// else from the bucket's current values) and keeps the index up to date
// from the watch in the background.
func (x *searchIndex) follow(ctx context.Context, kv jetstream.KeyValue, logger *slog.Logger, began time.Time, resumed bool, opts []jetstream.WatchOpt) {
	w, err := kv.WatchAll(ctx, opts...)
	if err != nil {
		logger.WarnContext(ctx, "watch run snapshots; listing runs reads the bucket", "err", err)
		return
	}
	if !resumed {
		if st, err := kv.Status(ctx); err == nil {
			x.reserve(int(min(st.Values(), 1<<26)))
		}
	}
	go func() {
		defer func() { _ = w.Stop() }()
		var load *indexLoader
		if !resumed {
			load = newIndexLoader(ctx, x, logger)
		}
		var loadedRev uint64 // the highest revision the loader was given
		loadedN := 0
		for e := range w.Updates() {
			if e != nil && load != nil {
				loadedRev = max(loadedRev, e.Revision())
				loadedN++
				load.add(e)
				continue
			}
			if e == nil && load != nil {
				load.wait()
				load = nil
				x.advance(loadedRev, loadedN) // all new to a checkpoint
			}
			if e == nil {
				if !resumed && x.len() == 0 && x.rewatches < maxRewatches && bucketHolds(ctx, kv) {
					x.rewatches++
					// The watch's "initial values done" marker came with
					// none while the bucket holds snapshots (its consumer
					// was created as a just-restored or just-elected
					// stream reported nothing pending): an empty index
					// would list no run. Watch again; listing reads the
					// bucket meanwhile.
					logger.DebugContext(ctx, "run index: the watch saw no snapshot in a bucket that holds some; watching again")
					_ = w.Stop()
					select {
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond):
						x.watch(ctx, kv, logger)
					}
					return
				}
				if resumed {
					x.dropExpired(ctx, kv, logger)
				}
				first := x.complete(time.Since(began))
				logger.DebugContext(ctx, "run index loaded", "runs", x.len(), "took", time.Since(began))
				if first && x.cp.Store != nil {
					go x.checkpoints(ctx, kv, logger)
				}
				continue
			}
			x.apply(ctx, e, logger)
			x.advance(e.Revision(), 1)
		}
		if load != nil {
			load.wait()
		}
		x.mu.Lock()
		x.ready = false // the watch ended: read the bucket again
		x.mu.Unlock()
	}()
}

// advance records that the watch applied every write up to rev, n
// changes since the last checkpoint.
func (x *searchIndex) advance(rev uint64, n int) {
	x.mu.Lock()
	x.applied = max(x.applied, rev)
	x.changes += n
	x.mu.Unlock()
}

// dropExpired removes, after a checkpoint's replay, the runs whose last
// write is older than the bucket's first remaining message: they expired
// (planex-runs keeps runs for --events-max-age) after the checkpoint, and
// an expiry leaves nothing for the replay to see.
func (x *searchIndex) dropExpired(ctx context.Context, kv jetstream.KeyValue, logger *slog.Logger) {
	bs, err := bucketStateOf(ctx, kv)
	if err != nil {
		logger.WarnContext(ctx, "run index: bucket state unavailable; runs expired since the checkpoint stay listed until a restart", "err", err)
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	kept := x.runs[:0]
	for i := range x.runs {
		if s := &x.runs[i]; s.rev != 0 && s.rev < bs.firstSeq {
			x.in.release(s)
			continue
		}
		kept = append(kept, x.runs[i])
	}
	clear(x.runs[len(kept):])
	x.runs = kept
}

// apply records one update of the watch.
func (x *searchIndex) apply(ctx context.Context, e jetstream.KeyValueEntry, logger *slog.Logger) {
	switch e.Operation() {
	case jetstream.KeyValuePut:
		run, facts, err := indexedRun(e.Value())
		if err != nil || run.GetId() != e.Key() {
			logger.DebugContext(ctx, "run index: unreadable snapshot", "run_id", e.Key(), "err", err)
			x.putID(e.Key(), e.Revision())
			return
		}
		x.putFacts(run, facts, e.Revision())
	case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
		x.remove(e.Key())
	}
}

// indexLoader applies the watch's initial values (up to its "initial
// values done" marker) on a few goroutines, decoding snapshots in
// parallel: a restart with a million runs waits on their decoding. Each
// run's updates go to one goroutine, in order (a value delivered while
// the initial ones are may update or delete a run delivered before it).
type indexLoader struct {
	lanes []chan jetstream.KeyValueEntry
	wg    sync.WaitGroup
}

// indexLoadLanes bounds the goroutines of an indexLoader (at most one per
// CPU): decoding is most of loading, storing is serialized by the index's
// lock.
const indexLoadLanes = 4

func newIndexLoader(ctx context.Context, x *searchIndex, logger *slog.Logger) *indexLoader {
	l := &indexLoader{lanes: make([]chan jetstream.KeyValueEntry, max(1, min(indexLoadLanes, runtime.GOMAXPROCS(0))))}
	for i := range l.lanes {
		ch := make(chan jetstream.KeyValueEntry, 256)
		l.lanes[i] = ch
		l.wg.Go(func() {
			for e := range ch {
				x.apply(ctx, e, logger)
			}
		})
	}
	return l
}

// add queues e on its run's goroutine (by the FNV-1a hash of its key,
// computed in place: no allocation per value).
func (l *indexLoader) add(e jetstream.KeyValueEntry) {
	h, key := uint32(2166136261), e.Key()
	for i := range len(key) {
		h = (h ^ uint32(key[i])) * 16777619
	}
	l.lanes[h%uint32(len(l.lanes))] <- e
}

// wait returns once every value added was applied; l is then spent.
func (l *indexLoader) wait() {
	for _, ch := range l.lanes {
		close(ch)
	}
	l.wg.Wait()
}

// reserve sizes a loading index for n runs (the bucket's values), so that
// loading a million does not grow and copy them again and again.
func (x *searchIndex) reserve(n int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.loading != nil && len(x.runs) == 0 && n > cap(x.runs) {
		x.runs = make([]runSummary, 0, n)
		x.loading = make(map[string]int, n)
	}
}

// bucketHolds reports whether kv holds at least one value (a failed
// check says no: the index then trusts its watch).
func bucketHolds(ctx context.Context, kv jetstream.KeyValue) bool {
	st, err := kv.Status(ctx)
	if err != nil {
		return false
	}
	if s, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		return s.StreamInfo().State.Msgs > 0
	}
	return st.Values() > 0
}

// complete sorts the summaries loaded so far and makes the index ready;
// it reports whether the index was ready for the first time.
func (x *searchIndex) complete(took time.Duration) (first bool) {
	x.mu.Lock()
	if x.loading != nil {
		slices.SortFunc(x.runs, func(a, b runSummary) int { return a.id.compare(b.id) })
		if spare := cap(x.runs) - len(x.runs); spare > len(x.runs)/8 {
			x.runs = slices.Clip(append([]runSummary(nil), x.runs...)) // no spare capacity from loading
		}
		x.loading = nil
	}
	x.ready, x.settled = true, true
	x.mu.Unlock()
	x.loadOnce.Do(func() {
		x.loadTime = took
		close(x.loaded)
		first = true
	})
	return first
}

func (x *searchIndex) len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.runs)
}

// find returns the position of id in runs, or where it would go.
func (x *searchIndex) find(id string) (int, bool) {
	if x.loading != nil {
		i, ok := x.loading[id]
		return i, ok
	}
	k := makeKey(id)
	return slices.BinarySearchFunc(x.runs, k, func(s runSummary, k runKey) int { return s.id.compare(k) })
}

// put records run as of revision rev (an older revision than the one
// recorded is ignored), once the index was started.
func (x *searchIndex) put(run *planexv1.Run, rev uint64) {
	x.putFacts(run, wireFacts{tools: planTools(run), steps: countSteps(run)}, rev)
}

// putFacts is put with what was read of the run's snapshot in place.
func (x *searchIndex) putFacts(run *planexv1.Run, facts wireFacts, rev uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.loaded == nil {
		return // no index (IndexRuns was not called): the watch will load the run
	}
	i, found := x.find(run.GetId())
	if found && x.runs[i].rev >= rev && rev != 0 {
		return
	}
	s := summarizeTools(run, facts, rev, &x.in)
	x.store(i, found, s)
}

// Top-level fields of a Run the index reads without decoding the rest
// (protowire numbers of run.proto), and those of Plan and Step it reads
// the tools from.
const (
	runFieldStatus = 4
	runFieldPlans  = 8
	planFieldSteps = 2
	stepFieldTool  = 3
)

// indexKeeps are the top-level Run fields a summary reads (besides plans,
// whose tools are read in place, and steps, counted in place): id, goal,
// status, stop_reason, labels, created_at, updated_at, started_by,
// forked_from, parent_run_id.
var indexKeeps = map[protowire.Number]bool{1: true, 2: true, runFieldStatus: true, 5: true, 12: true, 15: true, 16: true, 60: true, 26: true, 330: true}

// indexedRun decodes what the index needs of a snapshot: the run without
// its inputs, steps, results and plans (a snapshot's bulk, and most of
// the cost of decoding it), and the tools its plans call and its step
// counts, read from the wire. Of a waiting run it also decodes what tells
// whether a gate is open (appendGateFields).
func indexedRun(data []byte) (*planexv1.Run, wireFacts, error) {
	var facts wireFacts
	if !bytes.HasPrefix(data, snapMagic) || len(data) < len(snapMagic)+4 {
		return nil, facts, errors.New("decode snapshot: bad magic")
	}
	data = data[len(snapMagic):]
	n := binary.BigEndian.Uint32(data)
	if uint64(n) > uint64(len(data)-4) {
		return nil, facts, errors.New("decode snapshot: truncated header")
	}
	raw := data[4+n:]
	kept := make([]byte, 0, 256)
	status := planexv1.RunStatus_RUN_STATUS_UNSPECIFIED
	for b := raw; len(b) > 0; {
		num, typ, tn := protowire.ConsumeTag(b)
		if tn < 0 {
			return nil, facts, fmt.Errorf("decode snapshot run: %w", protowire.ParseError(tn))
		}
		vn := protowire.ConsumeFieldValue(num, typ, b[tn:])
		if vn < 0 {
			return nil, facts, fmt.Errorf("decode snapshot run: %w", protowire.ParseError(vn))
		}
		field := b[:tn+vn]
		switch {
		case num == runFieldStatus && typ == protowire.VarintType:
			v, _ := protowire.ConsumeVarint(b[tn:])
			status = planexv1.RunStatus(v)
		case num == runFieldPlans && typ == protowire.BytesType:
			plan, _ := protowire.ConsumeBytes(b[tn:])
			facts.tools = appendTools(facts.tools, plan)
		case num == runFieldSteps && typ == protowire.BytesType:
			st, _ := protowire.ConsumeBytes(b[tn:])
			facts.steps.total++
			if stepSucceeded(st) {
				facts.steps.succeeded++
			}
		}
		if indexKeeps[num] {
			kept = append(kept, field...)
		}
		b = b[tn+vn:]
	}
	run := &planexv1.Run{}
	if status == planexv1.RunStatus_RUN_STATUS_WAITING {
		var err error
		if kept, err = appendGateFields(kept, raw); err != nil {
			return nil, facts, err
		}
	}
	if err := proto.Unmarshal(kept, run); err != nil {
		return nil, facts, fmt.Errorf("decode snapshot run: %w", err)
	}
	return run, facts, nil
}

// stepSucceeded reports whether the encoded StepState st says SUCCEEDED
// (its last status field, as proto decoding keeps the last).
func stepSucceeded(st []byte) bool {
	ok := false
	eachWireField(st, func(num protowire.Number, typ protowire.Type, val []byte) {
		if num == stepStateFieldStatus && typ == protowire.VarintType {
			v, _ := protowire.ConsumeVarint(val)
			ok = planexv1.StepStatus(v) == planexv1.StepStatus_STEP_STATUS_SUCCEEDED
		}
	})
	return ok
}

// eachWireField calls fn with the number, type and value (the bytes after
// the tag) of each field of the encoded message msg, up to the first
// malformed one (the decode that follows, if any, rejects it).
func eachWireField(msg []byte, fn func(num protowire.Number, typ protowire.Type, val []byte)) {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return
		}
		vn := protowire.ConsumeFieldValue(num, typ, msg[n:])
		if vn < 0 {
			return
		}
		fn(num, typ, msg[n:n+vn])
		msg = msg[n+vn:]
	}
}

// Fields GateOpen reads besides the run's status: its gates whole, of each
// plan its revision, of each step state its id, status and plan revision
// (protowire numbers of run.proto).
const (
	runFieldSteps          = 9
	runFieldGates          = 21
	planFieldRevision      = 1
	stepStateFieldID       = 1
	stepStateFieldStatus   = 3
	stepStateFieldRevision = 5
)

// appendGateFields appends to kept what of the encoded run raw tells
// whether a gate is open (GateOpen): the gates, the plans' revisions and
// the step states' ids, statuses and plan revisions — not the steps'
// arguments, outputs and errors, nor the plans' steps, which are most of
// a waiting run's snapshot and of the cost of decoding it.
func appendGateFields(kept, raw []byte) ([]byte, error) {
	for b := raw; len(b) > 0; {
		num, typ, tn := protowire.ConsumeTag(b)
		if tn < 0 {
			return nil, fmt.Errorf("decode snapshot run: %w", protowire.ParseError(tn))
		}
		vn := protowire.ConsumeFieldValue(num, typ, b[tn:])
		if vn < 0 {
			return nil, fmt.Errorf("decode snapshot run: %w", protowire.ParseError(vn))
		}
		switch {
		case num == runFieldGates:
			kept = append(kept, b[:tn+vn]...)
		case num == runFieldPlans && typ == protowire.BytesType:
			v, _ := protowire.ConsumeBytes(b[tn:])
			kept = appendSubset(kept, runFieldPlans, v, planFieldRevision)
		case num == runFieldSteps && typ == protowire.BytesType:
			v, _ := protowire.ConsumeBytes(b[tn:])
			kept = appendSubset(kept, runFieldSteps, v, stepStateFieldID, stepStateFieldStatus, stepStateFieldRevision)
		}
		b = b[tn+vn:]
	}
	return kept, nil
}

// appendSubset appends field num holding the message msg with only the
// fields keep (a malformed msg is appended as it is: the decode that
// follows rejects it).
func appendSubset(kept []byte, num protowire.Number, msg []byte, keep ...protowire.Number) []byte {
	var sub []byte
	for b := msg; len(b) > 0; {
		n, typ, tn := protowire.ConsumeTag(b)
		if tn < 0 {
			sub = msg
			break
		}
		vn := protowire.ConsumeFieldValue(n, typ, b[tn:])
		if vn < 0 {
			sub = msg
			break
		}
		if slices.Contains(keep, n) {
			sub = append(sub, b[:tn+vn]...)
		}
		b = b[tn+vn:]
	}
	kept = protowire.AppendTag(kept, num, protowire.BytesType)
	return protowire.AppendBytes(kept, sub)
}

// appendTools adds the tools of an encoded Plan's steps to tools.
func appendTools(tools []string, plan []byte) []string {
	eachWireField(plan, func(num protowire.Number, typ protowire.Type, val []byte) {
		if num != planFieldSteps || typ != protowire.BytesType {
			return
		}
		step, _ := protowire.ConsumeBytes(val)
		eachWireField(step, func(num protowire.Number, typ protowire.Type, val []byte) {
			if num == stepFieldTool && typ == protowire.BytesType {
				if t, _ := protowire.ConsumeString(val); t != "" && !slices.Contains(tools, t) {
					tools = append(tools, t)
				}
			}
		})
	})
	return tools
}

// putID records a run whose snapshot is unreadable: listed (as ListRuns
// always did, which then reads and skips it) but matching only filters
// that need nothing of it.
func (x *searchIndex) putID(id string, rev uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	i, found := x.find(id)
	if found {
		return
	}
	x.store(i, false, runSummary{id: makeKey(id), rev: rev})
}

// store puts s at i (found: replacing the summary there); x.mu is held.
func (x *searchIndex) store(i int, found bool, s runSummary) {
	switch {
	case found:
		x.in.release(&x.runs[i])
		x.runs[i] = s
	case x.loading != nil:
		x.loading[s.id.String()] = len(x.runs)
		x.runs = append(x.runs, s)
	default:
		// New runs (ULIDs) sort last: the common case appends.
		x.runs = slices.Insert(x.runs, i, s)
	}
}

func (x *searchIndex) remove(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	i, found := x.find(id)
	if !found {
		return
	}
	x.in.release(&x.runs[i])
	if x.loading != nil {
		last := len(x.runs) - 1
		x.runs[i] = x.runs[last]
		x.loading[x.runs[i].id.String()] = i
		delete(x.loading, id)
		x.runs = x.runs[:last]
		return
	}
	x.runs = slices.Delete(x.runs, i, i+1)
}

// ids returns the sorted run ids, or false while the index is not ready.
func (x *searchIndex) ids() ([]string, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if !x.ready {
		return nil, false
	}
	out := make([]string, len(x.runs))
	for i := range x.runs {
		out[i] = x.runs[i].id.String()
	}
	return out, true
}

// search returns up to limit (<= 0: all) ids of runs matching q, newest
// first, among the runs whose id sorts before before ("": all), or false
// while the index is not ready.
func (x *searchIndex) search(q *Query, before string, limit int) ([]string, bool) {
	var out []string
	ok := x.scan(q, before, func(s *runSummary) bool {
		out = append(out, s.id.String())
		return limit <= 0 || len(out) < limit
	})
	return out, ok
}

// searchBasic is search answering the runs' basic views (BasicRun) built
// from their summaries; a run whose snapshot was unreadable (no status)
// is left out, as a read of it would be.
func (x *searchIndex) searchBasic(q *Query, before string, limit int) ([]*planexv1.Run, bool) {
	var out []*planexv1.Run
	ok := x.scan(q, before, func(s *runSummary) bool {
		if s.status != 0 {
			out = append(out, s.basic())
		}
		return limit <= 0 || len(out) < limit
	})
	return out, ok
}

// scan calls take, under the read lock, with the summaries matching q,
// newest first, among the runs whose id sorts before before ("": all),
// until take returns false; false while the index is not ready.
func (x *searchIndex) scan(q *Query, before string, take func(*runSummary) bool) bool {
	m := q.matcher()
	x.mu.RLock()
	defer x.mu.RUnlock()
	if !x.ready {
		return false
	}
	end := len(x.runs)
	if before != "" {
		end, _ = x.find(before)
	}
	for i := end - 1; i >= 0; i-- {
		if m.match(&x.runs[i]) && !take(&x.runs[i]) {
			break
		}
	}
	return true
}

// basic is the run's basic view (BasicRun) as the summary holds it.
func (s *runSummary) basic() *planexv1.Run {
	run := &planexv1.Run{
		Id:         s.id.String(),
		Goal:       s.text(),
		Status:     planexv1.RunStatus(s.status),
		StopReason: planexv1.StopReason(s.stop),
		StepCounts: &planexv1.StepCounts{Total: int32(s.steps), Succeeded: int32(s.done)},
	}
	if s.created != 0 {
		run.CreatedAt = timestamppb.New(time.Unix(0, s.created))
	}
	if s.updated != 0 {
		run.UpdatedAt = timestamppb.New(time.Unix(0, s.updated))
	}
	if s.startedBy != nil {
		run.StartedBy = s.startedBy.s
	}
	if s.forkedFrom != nil {
		run.ForkedFrom = &planexv1.ForkOrigin{RunId: s.forkedFrom.s}
	}
	if s.parent != nil {
		run.ParentRunId = s.parent.s
	}
	if s.labels != nil {
		run.Labels = make(map[string]string, len(s.labels.pairs)/2)
		for i := 0; i+1 < len(s.labels.pairs); i += 2 {
			run.Labels[s.labels.pairs[i]] = s.labels.pairs[i+1]
		}
	}
	return run
}

// BasicRun is run's basic view (ListRuns' RUN_VIEW_BASIC): id, goal,
// status, stop reason, labels, started_by, created_at, updated_at, the
// run it was forked from, its parent and its step counts — what a list
// shows, and what the run index keeps of every run.
func BasicRun(run *planexv1.Run) *planexv1.Run {
	s := summarize(run, 0, nil)
	return s.basic()
}

// SearchBasic is SearchRuns answering the runs' basic views (BasicRun)
// from the index, without reading any run: a page of a list costs no
// storage read, however cold the runs' snapshots are. The views are the
// runs' snapshots as last indexed (a running run may be a few events
// ahead). It returns ErrIndexNotReady while the index is loading.
func (l *Log) SearchBasic(q *Query, before string, limit int) ([]*planexv1.Run, error) {
	l.IndexRuns()
	runs, ok := l.index.searchBasic(q, before, limit)
	if !ok {
		return nil, ErrIndexNotReady
	}
	return runs, nil
}

// ErrIndexNotReady is returned by SearchRuns while the index is loading
// (or after its watch failed): the caller reads the bucket instead.
var ErrIndexNotReady = errors.New("run index not loaded")

// SearchRuns returns up to limit (<= 0: all) ids of the runs matching q,
// newest first, among those whose id sorts before before ("": all). It
// reads the in-memory index only (the runs' snapshots as last written,
// which never lag a status change made by a live supervisor); a caller
// returning runs reads them and may check them again with Query.MatchRun.
// It returns ErrIndexNotReady while the index is loading.
func (l *Log) SearchRuns(q *Query, before string, limit int) ([]string, error) {
	l.IndexRuns()
	ids, ok := l.index.search(q, before, limit)
	if !ok {
		return nil, ErrIndexNotReady
	}
	return ids, nil
}

// NotFinished returns the ids, in order, of the runs this process has not
// seen finish: a run's last snapshot (what feeds the index) is written
// concurrently with its last decision, so for a moment after GetRun says
// the run finished (from the cached state) the index may still list it as
// not finished. Callers that count runs in flight from the index filter
// its ids through this. A terminal status is final, so a cached one is
// never stale.
func (l *Log) NotFinished(ids []string) []string {
	out := ids[:0:0]
	for _, id := range ids {
		if st := l.Cached(id); st == nil || !Terminal(st.Run.GetStatus()) {
			out = append(out, id)
		}
	}
	return out
}

// CountNotFinished counts the runs the index lists as pending, planning,
// running or waiting, less those this process has seen finish (see
// NotFinished); roots counts only runs that are no run's child (run
// trees), limit > 0 stops counting at limit. ErrIndexNotReady until the
// index loaded (WaitIndexed).
func (l *Log) CountNotFinished(roots bool, limit int) (int, error) {
	q := unfinishedQuery(roots)
	ids, err := l.SearchRuns(q, "", limit)
	if err != nil {
		return 0, err
	}
	n := len(l.NotFinished(ids))
	if limit > 0 && len(ids) == limit && n < limit {
		// Some of the first limit were finished: count them all.
		if ids, err = l.SearchRuns(q, "", 0); err != nil {
			return 0, err
		}
		n = min(len(l.NotFinished(ids)), limit)
	}
	return n, nil
}

// unfinishedQuery lists the runs the index shows pending, planning,
// running or waiting (roots: only runs that are no run's child).
func unfinishedQuery(roots bool) *Query {
	return &Query{Statuses: []planexv1.RunStatus{
		planexv1.RunStatus_RUN_STATUS_PENDING, planexv1.RunStatus_RUN_STATUS_PLANNING,
		planexv1.RunStatus_RUN_STATUS_RUNNING, planexv1.RunStatus_RUN_STATUS_WAITING,
	}, Roots: roots}
}

// CountUnfinished counts the runs that have not finished, for a decision
// that must not act on an index lagging behind the logs (deleting a
// tenant): the runs CountNotFinished counts, each read from its log
// (Current) when there are at most confirm of them, so that a run whose
// terminal snapshot has not reached the index yet — written while its
// finish is already visible to GetRun — is not counted. Above confirm the
// index's count is returned unconfirmed (so many runs are not a lag).
func (l *Log) CountUnfinished(ctx context.Context, confirm int) (int, error) {
	ids, err := l.SearchRuns(unfinishedQuery(false), "", 0)
	if err != nil {
		return 0, err
	}
	ids = l.NotFinished(ids)
	if len(ids) > confirm {
		return len(ids), nil
	}
	n := 0
	for _, id := range ids {
		run, err := l.Current(ctx, id)
		switch {
		case errors.Is(err, ErrRunNotFound):
			// Expired from the log: nothing left to serve.
		case err != nil:
			return 0, fmt.Errorf("run %s: %w", id, err)
		case !Terminal(run.GetStatus()):
			n++
		}
	}
	return n, nil
}

// IndexedRuns is the number of runs the index holds (0 before it loaded).
func (l *Log) IndexedRuns() int { return l.index.len() }

// MovingRunIDs returns the ids of the runs the index lists as pending,
// planning or running: the runs that may be stranded (a run waiting at a
// gate waits for a person, a finished one for nothing). Until the index
// loaded it returns every run's id (RunIDs). The sweeper reads these
// instead of every snapshot, so that a million runs waiting at gates cost
// it nothing.
func (l *Log) MovingRunIDs(ctx context.Context) ([]string, error) {
	ids, err := l.SearchRuns(&Query{Statuses: []planexv1.RunStatus{
		planexv1.RunStatus_RUN_STATUS_PENDING, planexv1.RunStatus_RUN_STATUS_PLANNING,
		planexv1.RunStatus_RUN_STATUS_RUNNING,
	}}, "", 0)
	if errors.Is(err, ErrIndexNotReady) {
		return l.RunIDs(ctx)
	}
	return ids, err
}

// WaitIndexed starts the index (IndexRuns) and waits until it was loaded
// once, returning how long loading took.
func (l *Log) WaitIndexed(ctx context.Context) (time.Duration, error) {
	l.index.init()
	l.IndexRuns()
	select {
	case <-l.index.loaded:
		return l.index.loadTime, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("wait for the run index: %w", ctx.Err())
	}
}

// SnapshotValue encodes run as a planex-runs snapshot value (the state of
// a run whose log ends at its last_sequence), for tools and benchmarks
// that seed the bucket directly.
func SnapshotValue(run *planexv1.Run) ([]byte, error) {
	return encodeSnapshot(&State{Run: run})
}
