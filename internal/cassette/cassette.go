// Package cassette records planner answers, tool results and model critic
// verdicts to files and serves them back, so an evaluation suite runs
// offline, deterministically
// and without a model or tool backends. An interaction is keyed by a
// stable hash of its canonical input: the JSON of the request with sorted
// keys, without what changes from run to run (run ids, times, attempt
// numbers). Requests are stored redacted, like logs; responses as
// returned, because replaying them must give the same run.
package cassette

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/planex-dev/planex/internal/redact"
)

// Kinds of interactions.
const (
	KindPlan = "plan"
	KindTool = "tool"
	// KindCritique is a model critic's verdict on a step result
	// (PlannerService.Critique).
	KindCritique = "critique"
)

// kinds are the interaction kinds a cassette holds.
var kinds = []string{KindPlan, KindTool, KindCritique}

// ErrMiss is matched by errors.Is when a replayed request has no recording.
var ErrMiss = errors.New("no recorded answer")

// MissError names the request a cassette has no answer for.
type MissError struct {
	// Kind and Name say what was asked (plan/the goal, tool/the tool,
	// critique/the judged step's tool).
	Kind, Name string
	// Key is the request's hash.
	Key string
	// Request is the request, redacted, as it would have been recorded.
	Request string
}

func (e *MissError) Error() string {
	req := e.Request
	if len(req) > 300 {
		req = req[:300] + "…"
	}
	return fmt.Sprintf("cassette: no recorded answer for %s %q (key %s): %s; record it with --record, or let misses go live with --replay-miss=live", e.Kind, e.Name, e.Key[:16], req)
}

// Unwrap makes the error match ErrMiss.
func (e *MissError) Unwrap() error { return ErrMiss }

// Entry is one recorded interaction.
type Entry struct {
	// Kind is plan, tool or critique.
	Kind string `json:"kind"`
	// Name is the tool (of a tool call, or of the step a critique judged),
	// or the goal of a plan request.
	Name string `json:"name"`
	// Key is the hash of the canonical request.
	Key string `json:"key"`
	// Request is the canonical request, redacted (for people and diffs).
	Request json.RawMessage `json:"request"`
	// Response is the answer (protojson or JSON), when there was one.
	Response json.RawMessage `json:"response,omitempty"`
	// Error is the failure, when the call failed.
	Error *Failure `json:"error,omitempty"`
}

// Failure is a recorded error: a code (gRPC or planex ErrorCode name) and
// a message.
type Failure struct {
	// Code names the error class.
	Code string `json:"code"`
	// Message is the error message.
	Message string `json:"message"`
	// Field is the argument at fault, if any.
	Field string `json:"field,omitempty"`
}

// Cassette is a directory of recorded interactions. It is safe for
// concurrent use.
type Cassette struct {
	dir     string
	redact  *redact.Redactor
	mu      sync.Mutex
	entries map[string]Entry // kind/key → entry
}

// Open reads the cassette in dir (creating dir when missing, for
// recording). Patterns redact recorded requests (default: credentials and
// e-mail addresses, as logs).
func Open(dir string, r *redact.Redactor) (*Cassette, error) {
	if r == nil {
		r = redact.New(redact.DefaultPatterns()...)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cassette %s: %w", dir, err)
	}
	c := &Cassette{dir: dir, redact: r, entries: map[string]Entry{}}
	var files []string
	for _, kind := range kinds {
		fs, err := filepath.Glob(filepath.Join(dir, kind+"-*.json"))
		if err != nil {
			return nil, fmt.Errorf("cassette %s: %w", dir, err)
		}
		files = append(files, fs...)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("cassette: %w", err)
		}
		var e Entry
		if err := json.Unmarshal(data, &e); err != nil {
			return nil, fmt.Errorf("cassette %s: %w", f, err)
		}
		if !slices.Contains(kinds, e.Kind) || e.Key == "" {
			return nil, fmt.Errorf("cassette %s: kind %q, key %q: not a recorded interaction", f, e.Kind, e.Key)
		}
		if len(e.Response) > 0 {
			var buf bytes.Buffer
			if err := json.Compact(&buf, e.Response); err != nil {
				return nil, fmt.Errorf("cassette %s: response: %w", f, err)
			}
			e.Response = buf.Bytes()
		}
		c.entries[e.Kind+"/"+e.Key] = e
	}
	return c, nil
}

// Dir is the cassette's directory.
func (c *Cassette) Dir() string { return c.dir }

// Len is the number of recorded interactions.
func (c *Cassette) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Key returns the hash of a request's canonical form and the canonical
// JSON itself. request is any JSON-encodable value (a map from protojson);
// keys in volatile are removed at any depth first.
func Key(kind, name string, request any, volatile ...string) (string, []byte, error) {
	canon, err := Canonical(request, volatile...)
	if err != nil {
		return "", nil, err
	}
	h := sha256.New()
	h.Write([]byte(kind + "\x00" + name + "\x00"))
	h.Write(canon)
	return hex.EncodeToString(h.Sum(nil)), canon, nil
}

// Canonical encodes v as JSON with sorted keys, without the volatile keys
// (at any depth) and without keys ending in "_at".
func Canonical(v any, volatile ...string) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("canonical request: %w", err)
	}
	var generic any
	if err := json.Unmarshal(b, &generic); err != nil {
		return nil, fmt.Errorf("canonical request: %w", err)
	}
	return json.Marshal(scrub(generic, volatile))
}

func scrub(v any, volatile []string) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			if slices.Contains(volatile, k) || strings.HasSuffix(k, "_at") {
				continue
			}
			out[k] = scrub(x, volatile)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = scrub(x, volatile)
		}
		return out
	}
	return v
}

// Get returns the recorded interaction for a key, or a *MissError.
func (c *Cassette) Get(kind, name, key string, canon []byte) (Entry, error) {
	c.mu.Lock()
	e, ok := c.entries[kind+"/"+key]
	c.mu.Unlock()
	if !ok {
		return Entry{}, &MissError{Kind: kind, Name: name, Key: key, Request: c.redact.String(string(canon))}
	}
	return e, nil
}

// Put records an interaction (the request is redacted before it is
// written) and writes it to its own file, <kind>-<name>-<key>.json
// (plan-planner-…, tool-<tool>-…, critique-<tool>-…).
func (c *Cassette) Put(e Entry) error {
	var req any
	if err := json.Unmarshal(e.Request, &req); err != nil {
		return fmt.Errorf("cassette: record %s %s: %w", e.Kind, e.Name, err)
	}
	red, err := json.Marshal(c.redact.Value(req))
	if err != nil {
		return fmt.Errorf("cassette: record %s %s: %w", e.Kind, e.Name, err)
	}
	e.Request = red
	data, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		return fmt.Errorf("cassette: record %s %s: %w", e.Kind, e.Name, err)
	}
	name := e.Name
	if e.Kind == KindPlan {
		name = "planner"
	}
	file := filepath.Join(c.dir, fmt.Sprintf("%s-%s-%s.json", e.Kind, safe(name), e.Key[:16]))
	if err := os.WriteFile(file, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("cassette: %w", err)
	}
	c.mu.Lock()
	c.entries[e.Kind+"/"+e.Key] = e
	c.mu.Unlock()
	return nil
}

func safe(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}
