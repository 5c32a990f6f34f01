package cassette

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKeyIgnoresVolatileFieldsAndKeyOrder(t *testing.T) {
	a := map[string]any{"goal": "g", "run_id": "R1", "history": map[string]any{"steps": []any{map[string]any{"attempt": 1, "finished_at": "t1", "output": 3}}}}
	b := map[string]any{"history": map[string]any{"steps": []any{map[string]any{"output": 3, "attempt": 2, "finished_at": "t2"}}}, "run_id": "R2", "goal": "g"}
	ka, _, err := Key(KindPlan, "g", a, "run_id", "attempt")
	if err != nil {
		t.Fatal(err)
	}
	kb, _, _ := Key(KindPlan, "g", b, "run_id", "attempt")
	if ka != kb {
		t.Fatal("keys differ in volatile fields only, yet differ")
	}
	b["goal"] = "h"
	if kc, _, _ := Key(KindPlan, "g", b, "run_id", "attempt"); kc == ka {
		t.Fatal("a different goal has the same key")
	}
	if kd, _, _ := Key(KindTool, "g", a, "run_id", "attempt"); kd == ka {
		t.Fatal("a tool call and a plan request share a key")
	}
}

func TestRecordRedactsRequestsAndReplays(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	req := map[string]any{"tool": "email.draft", "args": map[string]any{"to": "ops@example.com", "note": "password=Hunter2xyz9"}}
	key, canon, err := Key(KindTool, "email.draft", req)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put(Entry{Kind: KindTool, Name: "email.draft", Key: key, Request: canon, Response: []byte(`{"draft_id":"d-1"}`)}); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "tool-email.draft-*.json"))
	if len(files) != 1 {
		t.Fatalf("files %v", files)
	}
	data, _ := os.ReadFile(files[0])
	if strings.Contains(string(data), "ops@example.com") || strings.Contains(string(data), "Hunter2") {
		t.Fatalf("recorded request not redacted:\n%s", data)
	}
	again, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := again.Get(KindTool, "email.draft", key, canon)
	if err != nil || string(e.Response) != `{"draft_id":"d-1"}` {
		t.Fatalf("replayed %s, %v", e.Response, err)
	}
	other, ocanon, _ := Key(KindTool, "email.draft", map[string]any{"tool": "email.draft", "args": map[string]any{"to": "x@example.com"}})
	_, err = again.Get(KindTool, "email.draft", other, ocanon)
	var miss *MissError
	if !errors.As(err, &miss) || !errors.Is(err, ErrMiss) || !strings.Contains(err.Error(), `no recorded answer for tool "email.draft"`) ||
		!strings.Contains(err.Error(), "--replay-miss=live") || strings.Contains(err.Error(), "x@example.com") {
		t.Fatalf("miss: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tool-bad-1.json"), []byte(`{"kind":"other"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, nil); err == nil || !strings.Contains(err.Error(), "tool-bad-1.json") {
		t.Fatalf("a broken entry: %v", err)
	}
}

// TestCritiqueVerdictsAreKeptAcrossOpens checks that a critic verdict is
// written as its own kind and read back by the next Open (a cassette that
// dropped them would turn a replayed model critic into a miss).
func TestCritiqueVerdictsAreKeptAcrossOpens(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	req := map[string]any{"step_id": "first", "tool": map[string]any{"name": "sql.query"}, "output": map[string]any{"n": 1}}
	key, canon, err := Key(KindCritique, "sql.query", req)
	if err != nil {
		t.Fatal(err)
	}
	if pk, _, _ := Key(KindTool, "sql.query", req); pk == key {
		t.Fatal("a critique and a tool call share a key")
	}
	if err := c.Put(Entry{Kind: KindCritique, Name: "sql.query", Key: key, Request: canon, Response: []byte(`{"reason":"one is not enough"}`)}); err != nil {
		t.Fatal(err)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "critique-sql.query-*.json")); len(files) != 1 {
		t.Fatalf("files %v", files)
	}
	again, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := again.Get(KindCritique, "sql.query", key, canon); err != nil || string(e.Response) != `{"reason":"one is not enough"}` {
		t.Fatalf("replayed %s, %v", e.Response, err)
	}
}
