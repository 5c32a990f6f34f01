package console

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// nodeModules copies the console's ES modules into a directory Node
// loads as modules and returns it; without node the test skips.
func nodeModules(t *testing.T) (node, dir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node on PATH: the console's JavaScript is checked with Node (.ci/run installs it with Chromium)")
	}
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"type": "module"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	files, err := fs.Glob(webFS, "web/assets/*.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := webFS.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return node, dir
}

// runModule runs an ES module script in dir and decodes what it prints
// as JSON into out.
func runModule(t *testing.T, node, dir, script string, out any) {
	t.Helper()
	main := filepath.Join(dir, "main.mjs")
	if err := os.WriteFile(main, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b, err := exec.CommandContext(ctx, node, main).CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("node printed %q: %v", b, err)
	}
}

// TestArgsSchemaValidator: the browser's check of edited step arguments
// against a tool's args_schema (schema.js) names the path and the rule of
// each problem, and passes what the schema allows.
func TestArgsSchemaValidator(t *testing.T) {
	node, dir := nodeModules(t)
	schema := `{"type": "object", "required": ["sql"], "additionalProperties": false, "properties": {
		"sql": {"type": "string", "minLength": 1},
		"params": {"type": "array", "maxItems": 2, "items": {"type": ["string", "number"]}},
		"limit": {"type": "integer", "minimum": 1, "maximum": 100},
		"mode": {"enum": ["read", "write"]}}}`
	cases := map[string]string{
		"ok":         `{"sql": "SELECT 1", "params": ["a", 2], "limit": 10, "mode": "read"}`,
		"wrong type": `{"sql": 5}`,
		"missing":    `{"limit": 3}`,
		"bounds":     `{"sql": "", "limit": 0, "params": [1, 2, 3]}`,
		"item":       `{"sql": "x", "params": [true], "limit": 1.5}`,
		"enum extra": `{"sql": "x", "mode": "delete", "table": "t"}`,
		"not object": `[1]`,
	}
	var in strings.Builder
	in.WriteString("{")
	first := true
	for name, v := range cases {
		if !first {
			in.WriteString(",")
		}
		first = false
		b, _ := json.Marshal(name)
		in.Write(b)
		in.WriteString(":" + v)
	}
	in.WriteString("}")
	var got map[string][]struct{ Path, Message string }
	runModule(t, node, dir, `import { validate } from './schema.js';
const schema = `+schema+`;
const cases = `+in.String()+`;
console.log(JSON.stringify(Object.fromEntries(Object.entries(cases).map(([k, v]) => [k, validate(schema, v)]))));
`, &got)
	want := map[string][]string{
		"ok":         nil,
		"wrong type": {"args.sql: want string, got integer"},
		"missing":    {"args.sql: required"},
		"bounds":     {"args.sql: want at least 1 characters", "args.limit: want at least 1", "args.params: want at most 2 items"},
		"item":       {"args.params[0]: want string or number, got boolean", "args.limit: want integer, got number"},
		"enum extra": {`args.mode: want one of "read", "write"`, "args.table: not an argument of this tool"},
		"not object": {"args: want object, got array"},
	}
	for name, w := range want {
		var g []string
		for _, p := range got[name] {
			g = append(g, p.Path+": "+p.Message)
		}
		if strings.Join(g, "\n") != strings.Join(w, "\n") {
			t.Errorf("%s: problems\n%s\nwant\n%s", name, strings.Join(g, "\n"), strings.Join(w, "\n"))
		}
	}
}

// TestSearchToFilter: the runs page's search, read from the URL, becomes
// ListRuns' request (status and label also in the request's own fields)
// and RunBatch's RunFilter, with "last hour" fixed at the page's time.
func TestSearchToFilter(t *testing.T) {
	node, dir := nodeModules(t)
	var got struct {
		List, Batch map[string]any
		Said        string
	}
	runModule(t, node, dir, `import { searchParams, listRequest, filterOf, describeSearch } from './search.js';
const sp = searchParams(new URLSearchParams('goal=globex%20tickets&status=FAILED,CANCELLED&label=team%3Dops&selector=env+in+(prod)&tool=sql.query,sql.exec&by=alice&since=1h&stop=STEP_FAILED&waiting=1'));
const now = Date.parse('2026-11-27T12:00:00Z');
console.log(JSON.stringify({ list: listRequest(sp, now), batch: filterOf(sp, now), said: describeSearch(sp) }));
`, &got)
	list, _ := json.Marshal(got.List)
	batch, _ := json.Marshal(got.Batch)
	wantList := `{"filter":{"createdAfter":"2026-11-27T11:00:00.000Z","goalContains":"globex tickets","labelSelector":"env in (prod)","startedBy":"alice","stopReasons":["STOP_REASON_STEP_FAILED"],"tools":["sql.query","sql.exec"],"waitingForDecision":true},"labels":{"team":"ops"},"statuses":["RUN_STATUS_WAITING"]}`
	wantBatch := `{"createdAfter":"2026-11-27T11:00:00.000Z","goalContains":"globex tickets","labelSelector":"env in (prod)","labels":{"team":"ops"},"startedBy":"alice","statuses":["RUN_STATUS_FAILED","RUN_STATUS_CANCELLED"],"stopReasons":["STOP_REASON_STEP_FAILED"],"tools":["sql.query","sql.exec"],"waitingForDecision":true}`
	if string(list) != wantList {
		t.Errorf("ListRuns request\n%s\nwant\n%s", list, wantList)
	}
	if string(batch) != wantBatch {
		t.Errorf("RunBatch filter\n%s\nwant\n%s", batch, wantBatch)
	}
	if !strings.Contains(got.Said, `goal contains "globex tickets"`) || !strings.Contains(got.Said, "labels env in (prod)") || !strings.Contains(got.Said, "created in the last hour") {
		t.Errorf("the search in words: %q", got.Said)
	}
}
