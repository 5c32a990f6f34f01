package runlog

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
)

// Checkpoints of the run index: a compact copy of every run's summary and
// the planex-runs revision it is complete up to, kept as one object in
// planex-run-index (bus.ObjectRunIndex). A restarted supervisor loads it
// and resumes the watch of planex-runs after that revision, instead of
// decoding every snapshot in the bucket: with a million runs waiting that
// was 7.7 to 14.8 seconds of a restart (docs/performance.md), which a
// checkpoint turns into reading tens of megabytes and the snapshots
// written since.
//
// Why it is right: the watch delivers planex-runs in revision order, so
// once it applied revision R every run's last write at or before R is in
// the index (a deletion removes it). A checkpoint records R and is
// written while the index keeps changing, but only with revisions after R
// (the watch's later entries, or this replica's own snapshot writes, whose
// revisions the index keeps); replaying from R+1 applies every change
// after R again, and a summary never goes back to an older revision. What
// a replay cannot show is a run whose last write expired (planex-runs
// keeps runs for --events-max-age, and an expired message leaves no
// marker): such a run is one whose revision is older than the bucket's
// first remaining one, and is dropped after the replay.
//
// What makes a checkpoint unusable, and then the index is loaded from the
// bucket as before: a bucket re-created since (its stream's creation time
// differs), a checkpoint naming a revision the bucket does not hold (a
// restore of an older backup), a damaged or unknown encoding (the object
// store checks its digest), or a read that fails half way. planex never
// deletes a run's snapshot, so the deletion markers a replay reads are an
// operator's; markers removed by `nats kv purge-deletes` (or a subject
// purge of the stream) before a restart are not seen, as a live watch does
// not see them either.

// checkpointReadTimeout bounds reading a checkpoint (a million runs take
// about half a second): past it the index loads from the bucket.
const checkpointReadTimeout = time.Minute

// checkpointName is the object holding the checkpoint.
const checkpointName = "runs"

// checkpointMagic starts an encoded checkpoint (after s2 decompression),
// followed by its format version.
var checkpointMagic = []byte("planex-run-index\n")

const checkpointVersion = 1

// Record kinds of an encoded checkpoint.
const (
	recEnd  = 0 // the trailer follows
	recULID = 1 // a summary whose id is a ULID (16 bytes follow)
	recText = 2 // a summary with any other id (its length and bytes follow)
)

// IndexCheckpoints configure the run index's checkpoints.
type IndexCheckpoints struct {
	// Store is the object store holding them (bus.Resources.RunIndexBucket);
	// nil: no checkpoints, the index is always loaded from planex-runs.
	Store jetstream.ObjectStore
	// MinRuns is the smallest index worth a checkpoint (default 10,000:
	// fewer snapshots load from the bucket in well under a second).
	MinRuns int
	// MinChanges is how many updates of the watch, at least, make a new
	// checkpoint worth writing (default 10,000, and at least a sixteenth
	// of the index, so that a restart replays a bounded part of it).
	MinChanges int
	// Every is how often the need is checked (default one minute).
	Every time.Duration

	// js is the JetStream context of the store's stream, for the sweep of
	// chunks no checkpoint names (set by New).
	js jetstream.JetStream
	// orphanAge is how old such chunks must be to be purged (default
	// orphanAfter; tests shorten it).
	orphanAge time.Duration
}

func (c IndexCheckpoints) withDefaults() IndexCheckpoints {
	if c.MinRuns <= 0 {
		c.MinRuns = 10_000
	}
	if c.MinChanges <= 0 {
		c.MinChanges = 10_000
	}
	if c.Every <= 0 {
		c.Every = time.Minute
	}
	if c.orphanAge <= 0 {
		c.orphanAge = orphanAfter
	}
	return c
}

// orphanAfter is how old chunks no checkpoint names must be before they
// are purged: far longer than writing one takes, so that a checkpoint
// another replica is writing keeps its chunks.
const orphanAfter = 10 * time.Minute

// checkpointHeader is what an encoded checkpoint starts with.
type checkpointHeader struct {
	rev     uint64 // every write up to it is in the checkpoint
	created int64  // planex-runs' stream creation time, Unix nanoseconds
	runs    uint64 // summaries when it began (a capacity hint)
}

// checkpointMeta is the object metadata key naming the checkpoint's
// revision, read before writing another.
const checkpointMeta = "revision"

// bucketState is what a checkpoint is checked against.
type bucketState struct {
	created           int64
	firstSeq, lastSeq uint64
}

func bucketStateOf(ctx context.Context, kv jetstream.KeyValue) (bucketState, error) {
	st, err := kv.Status(ctx)
	if err != nil {
		return bucketState{}, fmt.Errorf("status of %s: %w", kv.Bucket(), err)
	}
	s, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return bucketState{}, errors.New("bucket status without its stream's")
	}
	info := s.StreamInfo()
	return bucketState{created: info.Created.UnixNano(), firstSeq: info.State.FirstSeq, lastSeq: info.State.LastSeq}, nil
}

// errSkipped says a checkpoint was not written because it was not needed.
var errSkipped = errors.New("no checkpoint needed")

// checkpoint writes a checkpoint of the index to x.cp.Store when it holds
// at least MinRuns runs and changed by at least MinChanges updates since the
// last one (this replica's, or another's read from the store). force
// writes one whenever anything changed (a replica stopping).
func (x *searchIndex) checkpoint(ctx context.Context, kv jetstream.KeyValue, force bool) (int, error) {
	c, store := x.cp, x.cp.Store
	// One at a time in this process (the periodic one and a stopping
	// replica's).
	x.cpMu.Lock()
	defer x.cpMu.Unlock()
	x.mu.RLock()
	// Loaded once (the watch may have ended since, with a replica
	// stopping: what it applied is still consistent up to x.applied).
	ready, rev, n, changes, last := x.settled, x.applied, len(x.runs), x.changes, x.checkpointRev
	x.mu.RUnlock()
	need := max(c.MinChanges, n/16)
	if force {
		need = 1
	}
	if !ready || n < c.MinRuns || changes < need || rev <= last {
		return 0, errSkipped
	}
	if info, err := store.GetInfo(ctx, checkpointName); err == nil {
		if theirs, _ := strconv.ParseUint(info.Metadata[checkpointMeta], 10, 64); theirs >= rev || (!force && theirs+uint64(need) > rev) {
			// Another replica wrote one as recent: count from it.
			x.mu.Lock()
			x.checkpointRev, x.changes = theirs, int(rev-min(theirs, rev))
			x.mu.Unlock()
			return 0, errSkipped
		}
	} else if !errors.Is(err, jetstream.ErrObjectNotFound) {
		return 0, fmt.Errorf("read the run index checkpoint's info: %w", err)
	}
	bs, err := bucketStateOf(ctx, kv)
	if err != nil {
		return 0, err
	}
	pr, pw := io.Pipe()
	written := make(chan int, 1)
	go func() {
		zw := s2.NewWriter(pw, s2.WriterConcurrency(1))
		n, err := x.encodeCheckpoint(zw, checkpointHeader{rev: rev, created: bs.created, runs: uint64(n)})
		if err == nil {
			err = zw.Close()
		}
		written <- n
		_ = pw.CloseWithError(err)
	}()
	info, err := store.Put(ctx, jetstream.ObjectMeta{
		Name:        checkpointName,
		Description: "planex run index checkpoint",
		Metadata:    map[string]string{checkpointMeta: strconv.FormatUint(rev, 10)},
	}, fullReader{pr})
	_ = pr.CloseWithError(errors.New("checkpoint write ended")) // the encoder stops if Put returned early
	runs := <-written
	if err != nil {
		return 0, fmt.Errorf("write the run index checkpoint: %w", err)
	}
	x.mu.Lock()
	x.checkpointRev = rev
	x.changes -= min(x.changes, changes)
	x.mu.Unlock()
	if err := sweepOrphans(ctx, c, info); err != nil {
		return runs, fmt.Errorf("run index checkpoint written; its bucket's unused chunks not purged: %w", err)
	}
	return runs, nil
}

// sweepOrphans purges the chunks of the checkpoint store that no object
// names and that are older than c.orphanAge. Two replicas replacing the
// checkpoint at once each purge the chunks of the object they replaced,
// and the object store leaves the loser's chunks behind: without this
// sweep they would fill the bucket over time, and then refuse every
// checkpoint.
func sweepOrphans(ctx context.Context, c IndexCheckpoints, written *jetstream.ObjectInfo) error {
	if c.js == nil || written == nil {
		return nil
	}
	stream, err := c.js.Stream(ctx, "OBJ_"+written.Bucket)
	if err != nil {
		return err
	}
	prefix := "$O." + written.Bucket + ".C."
	si, err := stream.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return err
	}
	for subject := range si.State.Subjects {
		if subject == prefix+written.NUID {
			continue
		}
		m, err := stream.GetLastMsgForSubject(ctx, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if time.Since(m.Time) < c.orphanAge {
			continue // another replica's checkpoint being written
		}
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
			return err
		}
	}
	return nil
}

// encodeCheckpoint writes h and then every summary of the index, a few
// thousand at a time under the read lock (the index keeps changing
// meanwhile, only ever to revisions after h.rev), and a trailer: the
// summaries' count and the highest revision among them. It returns the
// count.
func (x *searchIndex) encodeCheckpoint(w io.Writer, h checkpointHeader) (int, error) {
	buf := append([]byte(nil), checkpointMagic...)
	buf = binary.AppendUvarint(buf, checkpointVersion)
	buf = binary.AppendUvarint(buf, h.rev)
	buf = binary.AppendVarint(buf, h.created)
	buf = binary.AppendUvarint(buf, h.runs)
	var (
		after  runKey
		count  int
		maxRev uint64
	)
	for first := true; ; first = false {
		x.mu.RLock()
		if !x.settled {
			x.mu.RUnlock()
			return count, errors.New("the run index was reset while it was checkpointed")
		}
		i := 0
		if !first {
			j, found := slices.BinarySearchFunc(x.runs, after, func(s runSummary, k runKey) int { return s.id.compare(k) })
			i = j
			if found {
				i++
			}
		}
		end := min(i+4096, len(x.runs))
		for k := i; k < end; k++ {
			s := &x.runs[k]
			buf = appendSummary(buf, s)
			maxRev = max(maxRev, s.rev)
		}
		count += end - i
		if end > i {
			after = x.runs[end-1].id
		}
		done := end >= len(x.runs)
		x.mu.RUnlock()
		if done {
			buf = append(buf, recEnd)
			buf = binary.AppendUvarint(buf, uint64(count))
			buf = binary.AppendUvarint(buf, maxRev)
		}
		if _, err := w.Write(buf); err != nil {
			return count, err
		}
		buf = buf[:0]
		if done {
			return count, nil
		}
	}
}

// appendSummary appends the record of s.
func appendSummary(b []byte, s *runSummary) []byte {
	if s.id.ext == nil {
		b = append(b, recULID)
		b = append(b, s.id.u[:]...)
	} else {
		b = append(b, recText)
		b = appendString(b, *s.id.ext)
	}
	b = binary.AppendUvarint(b, s.rev)
	b = binary.AppendVarint(b, s.created)
	b = binary.AppendVarint(b, s.updated)
	b = appendString(b, s.goal)
	b = binary.AppendUvarint(b, uint64(s.glen))
	b = append(b, s.caps, s.status, s.stop)
	if s.waiting {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(s.steps))
	b = binary.AppendUvarint(b, uint64(s.done))
	for _, p := range []*istr{s.startedBy, s.forkedFrom, s.parent} {
		if p == nil {
			b = appendString(b, "")
		} else {
			b = appendString(b, p.s)
		}
	}
	for _, t := range []*tagSet{s.labels, s.tools} {
		if t == nil {
			b = binary.AppendUvarint(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(t.pairs)))
		for _, p := range t.pairs {
			b = appendString(b, p)
		}
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// errStaleCheckpoint says a checkpoint does not belong to the bucket as
// it is now.
var errStaleCheckpoint = errors.New("stale run index checkpoint")

// restore loads the index from the checkpoint in store, checked against
// kv: it returns the revision to resume the watch after, or 0 (and the
// index untouched) when there is no usable checkpoint.
func (x *searchIndex) restore(ctx context.Context, kv jetstream.KeyValue, store jetstream.ObjectStore) (uint64, int, error) {
	bs, err := bucketStateOf(ctx, kv)
	if err != nil {
		return 0, 0, err
	}
	r, err := store.Get(ctx, checkpointName)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("read the run index checkpoint: %w", err)
	}
	defer func() { _ = r.Close() }()
	runs, in, rev, err := decodeCheckpoint(bufio.NewReaderSize(s2.NewReader(r), 64<<10), bs)
	if err != nil {
		return 0, 0, err
	}
	// The object store checks the digest at the end of the object.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return 0, 0, fmt.Errorf("read the run index checkpoint: %w", err)
	}
	x.mu.Lock()
	x.runs, x.in, x.loading = runs, in, nil
	x.applied, x.checkpointRev, x.changes = rev, rev, 0
	x.mu.Unlock()
	return rev, len(runs), nil
}

// decodeCheckpoint reads an encoded checkpoint and checks it against the
// bucket's state: the summaries (sorted), their interner and the revision
// to resume after.
func decodeCheckpoint(r *bufio.Reader, bs bucketState) ([]runSummary, interner, uint64, error) {
	in := interner{strs: map[string]*istr{}, sets: map[string]*tagSet{}}
	bad := func(what string, err error) ([]runSummary, interner, uint64, error) {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, interner{}, 0, fmt.Errorf("decode the run index checkpoint: %s: %w", what, err)
	}
	magic := make([]byte, len(checkpointMagic))
	if _, err := io.ReadFull(r, magic); err != nil || !bytes.Equal(magic, checkpointMagic) {
		return bad("bad magic", err)
	}
	var h checkpointHeader
	version, err := binary.ReadUvarint(r)
	if err != nil {
		return bad("version", err)
	}
	if version != checkpointVersion {
		return nil, interner{}, 0, fmt.Errorf("run index checkpoint of format %d, this release reads %d: %w", version, checkpointVersion, errStaleCheckpoint)
	}
	if h.rev, err = binary.ReadUvarint(r); err != nil {
		return bad("revision", err)
	}
	if h.created, err = binary.ReadVarint(r); err != nil {
		return bad("bucket creation", err)
	}
	if h.runs, err = binary.ReadUvarint(r); err != nil {
		return bad("runs", err)
	}
	switch {
	case h.created != bs.created:
		return nil, interner{}, 0, fmt.Errorf("%w: planex-runs was re-created since", errStaleCheckpoint)
	case h.rev > bs.lastSeq:
		return nil, interner{}, 0, fmt.Errorf("%w: it is at revision %d, the bucket at %d (restored from an older backup?)", errStaleCheckpoint, h.rev, bs.lastSeq)
	}
	runs := make([]runSummary, 0, min(h.runs+h.runs/8, 1<<26))
	d := checkpointDecoder{r: r, in: &in}
	for {
		kind, err := r.ReadByte()
		if err != nil {
			return bad("record", err)
		}
		if kind == recEnd {
			break
		}
		s, err := d.summary(kind)
		if err != nil {
			return bad("record", err)
		}
		if n := len(runs); n > 0 && runs[n-1].id.compare(s.id) >= 0 {
			return bad("records out of order", errors.New("not sorted by run id"))
		}
		runs = append(runs, s)
	}
	count, err := binary.ReadUvarint(r)
	if err != nil {
		return bad("trailer", err)
	}
	maxRev, err := binary.ReadUvarint(r)
	if err != nil {
		return bad("trailer", err)
	}
	if count != uint64(len(runs)) {
		return bad("trailer", fmt.Errorf("%d summaries, the trailer says %d", len(runs), count))
	}
	if maxRev > bs.lastSeq {
		return nil, interner{}, 0, fmt.Errorf("%w: it holds revision %d, the bucket ends at %d (restored from an older backup?)", errStaleCheckpoint, maxRev, bs.lastSeq)
	}
	return runs, in, h.rev, nil
}

// checkpointDecoder reads summary records, interning what summaries
// share.
type checkpointDecoder struct {
	r   *bufio.Reader
	in  *interner
	buf []byte
	tmp []string
}

// bytes reads a length-prefixed string into d.buf (valid until the next
// read).
func (d *checkpointDecoder) bytes() ([]byte, error) {
	n, err := binary.ReadUvarint(d.r)
	if err != nil {
		return nil, err
	}
	if n > 1<<24 {
		return nil, fmt.Errorf("a string of %d bytes", n)
	}
	if uint64(cap(d.buf)) < n {
		d.buf = make([]byte, n)
	}
	d.buf = d.buf[:n]
	_, err = io.ReadFull(d.r, d.buf)
	return d.buf, err
}

// istr reads an interned string (nil for "").
func (d *checkpointDecoder) istr() (*istr, error) {
	b, err := d.bytes()
	if err != nil || len(b) == 0 {
		return nil, err
	}
	if p := d.in.strs[string(b)]; p != nil {
		p.refs++
		return p, nil
	}
	return d.in.str(string(b)), nil
}

// set reads an interned label or tool set.
func (d *checkpointDecoder) set() (*tagSet, error) {
	n, err := binary.ReadUvarint(d.r)
	if err != nil || n == 0 {
		return nil, err
	}
	if n > 1<<16 {
		return nil, fmt.Errorf("a set of %d strings", n)
	}
	d.tmp = d.tmp[:0]
	for range n {
		b, err := d.bytes()
		if err != nil {
			return nil, err
		}
		d.tmp = append(d.tmp, string(b))
	}
	return d.in.set(slices.Clone(d.tmp)), nil
}

func (d *checkpointDecoder) summary(kind byte) (runSummary, error) {
	var s runSummary
	switch kind {
	case recULID:
		var u ulid.ULID
		if _, err := io.ReadFull(d.r, u[:]); err != nil {
			return s, err
		}
		s.id = runKey{u: u}
	case recText:
		b, err := d.bytes()
		if err != nil {
			return s, err
		}
		id := string(b)
		s.id = runKey{ext: &id}
	default:
		return s, fmt.Errorf("unknown record kind %d", kind)
	}
	var err error
	if s.rev, err = binary.ReadUvarint(d.r); err != nil {
		return s, err
	}
	if s.created, err = binary.ReadVarint(d.r); err != nil {
		return s, err
	}
	if s.updated, err = binary.ReadVarint(d.r); err != nil {
		return s, err
	}
	goal, err := d.bytes()
	if err != nil {
		return s, err
	}
	s.goal = string(goal)
	glen, err := binary.ReadUvarint(d.r)
	if err != nil {
		return s, err
	}
	s.glen = uint16(min(glen, 1<<16-1))
	var fixed [4]byte
	if _, err := io.ReadFull(d.r, fixed[:]); err != nil {
		return s, err
	}
	s.caps, s.status, s.stop, s.waiting = fixed[0], fixed[1], fixed[2], fixed[3] != 0
	if s.caps != capsNone && int(s.glen) > len(s.goal) {
		return s, fmt.Errorf("goal of %d bytes, %d lowercased", len(s.goal), s.glen)
	}
	steps, err := binary.ReadUvarint(d.r)
	if err != nil {
		return s, err
	}
	done, err := binary.ReadUvarint(d.r)
	if err != nil {
		return s, err
	}
	s.steps, s.done = sat16(int(min(steps, 1<<16))), sat16(int(min(done, 1<<16)))
	for _, p := range []**istr{&s.startedBy, &s.forkedFrom, &s.parent} {
		if *p, err = d.istr(); err != nil {
			return s, err
		}
	}
	if s.labels, err = d.set(); err != nil {
		return s, err
	}
	if s.tools, err = d.set(); err != nil {
		return s, err
	}
	return s, nil
}

// fullReader fills every buffer it is given (but the last): the object
// store makes a chunk of each Read, and a pipe returns what one write
// wrote.
type fullReader struct{ r io.Reader }

func (f fullReader) Read(p []byte) (int, error) {
	n, err := io.ReadFull(f.r, p)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = nil // the next Read returns io.EOF
	}
	return n, err
}

// checkpoints writes a checkpoint of the index when one is needed, every
// x.cp.Every, until ctx ends.
func (x *searchIndex) checkpoints(ctx context.Context, kv jetstream.KeyValue, logger *slog.Logger) {
	t := time.NewTicker(x.cp.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		began := time.Now()
		n, err := x.checkpoint(ctx, kv, false)
		switch {
		case errors.Is(err, errSkipped):
		case err != nil:
			logger.WarnContext(ctx, "run index checkpoint not written; a restart loads the index from planex-runs", "err", err)
		default:
			logger.DebugContext(ctx, "run index checkpoint written", "runs", n, "took", time.Since(began))
		}
	}
}
