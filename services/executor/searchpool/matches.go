package searchpool

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/blevesearch/bleve/v2"
)

// maxRecordedRuns is how many runs' matches the pool remembers; the
// oldest run is forgotten first.
const maxRecordedRuns = 10000

// Keys of the match log in the index's internal storage (bleve's own keys
// start with "_").
const (
	matchKeyPrefix = "planex.search.matches/" // + run id: the run's runMatches
	ringKeyPrefix  = "planex.search.ring/"    // + slot: the run id recorded in it
	ringNextKey    = "planex.search.ring.next"
)

// matchLog records, per run, which documents search.query returned as
// grounded hits and which only as weak matches (in below, or among the
// hits of a browsing query with grounded false), so that search.get can
// refuse to hand a weak match to the rest of the run. It lives in the
// index's internal storage, so a restart of the pool keeps it; it holds
// the last maxRuns runs, in a ring of slots.
type matchLog struct {
	idx     bleve.Index
	maxRuns int
	mu      sync.Mutex
}

// runMatches is what a run's queries found.
type runMatches struct {
	// Grounded are the documents some query of the run returned as
	// grounded hits.
	Grounded []string `json:"grounded,omitempty"`
	// Weak are the other documents the run's queries returned, by id.
	Weak map[string]weakMatch `json:"weak,omitempty"`
}

// weakMatch is the first query that found a document only weakly.
type weakMatch struct {
	// Query is the query's text.
	Query string `json:"query"`
	// Reason says why the document was not a grounded hit.
	Reason string `json:"reason"`
}

// record adds what out, the answer to query in run, found.
func (l *matchLog) record(run, query string, out *QueryOutput) error {
	if run == "" {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m, known, err := l.load(run)
	if err != nil {
		return err
	}
	changed := false
	weak := func(h Hit) {
		if slices.Contains(m.Grounded, h.ID) {
			return
		}
		if _, ok := m.Weak[h.ID]; ok {
			return
		}
		if m.Weak == nil {
			m.Weak = map[string]weakMatch{}
		}
		m.Weak[h.ID] = weakMatch{Query: query, Reason: weakReason(h)}
		changed = true
	}
	for _, h := range out.Hits {
		if !h.Grounded {
			weak(h)
			continue
		}
		if !slices.Contains(m.Grounded, h.ID) {
			m.Grounded = append(m.Grounded, h.ID)
			delete(m.Weak, h.ID)
			changed = true
		}
	}
	for _, h := range out.Below {
		weak(h)
	}
	if !changed {
		return nil
	}
	data, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode matches of run %s: %w", run, err)
	}
	b := l.idx.NewBatch()
	b.SetInternal([]byte(matchKeyPrefix+run), data)
	if !known {
		if err := l.claimSlot(b, run); err != nil {
			return err
		}
	}
	if err := l.idx.Batch(b); err != nil {
		return fmt.Errorf("store matches of run %s: %w", run, err)
	}
	return nil
}

// claimSlot adds to b the writes that give run the next slot of the ring,
// forgetting the run that held it.
func (l *matchLog) claimSlot(b *bleve.Batch, run string) error {
	next := uint64(0)
	v, err := l.idx.GetInternal([]byte(ringNextKey))
	if err != nil {
		return fmt.Errorf("read match ring: %w", err)
	}
	if len(v) > 0 {
		if next, err = strconv.ParseUint(string(v), 10, 64); err != nil {
			return fmt.Errorf("read match ring: next slot %q: %w", v, err)
		}
	}
	slot := []byte(ringKeyPrefix + strconv.FormatUint(next%uint64(l.maxRuns), 10))
	old, err := l.idx.GetInternal(slot)
	if err != nil {
		return fmt.Errorf("read match ring slot %s: %w", slot, err)
	}
	if len(old) > 0 && string(old) != run {
		b.DeleteInternal([]byte(matchKeyPrefix + string(old)))
	}
	b.SetInternal(slot, []byte(run))
	b.SetInternal([]byte(ringNextKey), []byte(strconv.FormatUint(next+1, 10)))
	return nil
}

// load reads run's matches; known is false when none are recorded.
func (l *matchLog) load(run string) (m runMatches, known bool, err error) {
	data, err := l.idx.GetInternal([]byte(matchKeyPrefix + run))
	if err != nil {
		return m, false, fmt.Errorf("read matches of run %s: %w", run, err)
	}
	if len(data) == 0 {
		return m, false, nil
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, false, fmt.Errorf("decode matches of run %s: %w", run, err)
	}
	return m, true, nil
}

// weakOnly returns how run's queries found document id when they found
// it only as a weak match, never as a grounded hit.
func (l *matchLog) weakOnly(run, id string) (weakMatch, bool, error) {
	if run == "" {
		return weakMatch{}, false, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m, _, err := l.load(run)
	if err != nil {
		return weakMatch{}, false, err
	}
	w, ok := m.Weak[id]
	return w, ok, nil
}

// weakReason says why h is not a grounded hit.
func weakReason(h Hit) string {
	switch {
	case h.Grounded:
		return "below the query's min_score or min_coverage"
	case len(h.Missing) == 0:
		return "none of the query's words is in its title"
	case len(h.Missing) == 1:
		return fmt.Sprintf("its title and tags lack %q", h.Missing[0])
	}
	q := make([]string, len(h.Missing))
	for i, m := range h.Missing {
		q[i] = strconv.Quote(m)
	}
	return "its title and tags lack " + strings.Join(q, ", ")
}
