package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime/quotedprintable"
	"net/http"
	"net/mail"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nkeys"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/mcpserver"
	"github.com/planex-dev/planex/internal/telemetry"
)

// secretCase is one format of the corpus: value is how it is written,
// marker the part that must never be shown (the whole value, or the
// secret of a "key: secret" pair), column the SQL column it is returned
// in (its name gives key/value formats their key).
type secretCase struct {
	name, value, marker, column string
}

// secretCorpus is issue 11's formats and issue 26's: each assembled here
// so that no scanner mistakes this file for a leak.
func secretCorpus(t *testing.T) []secretCase {
	t.Helper()
	apiKey, _, err := authn.GenerateAPIKey("leaked", authn.RoleRunner)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	basic := base64.StdEncoding.EncodeToString([]byte("admin:" + "s3cr3t-pw"))
	whole := func(name, v string) secretCase { return secretCase{name: name, value: v, marker: v} }
	cases := []secretCase{
		whole("openai", "sk-"+"proj-ABCDEFGHIJKLMNOPQRST"),
		whole("openai split by a zero-width space", "sk-"+"\u200b"+"proj-ZWSPABCDEFGHIJKLMNO"),
		whole("aws", "AKIA"+"IOSFODNN7EXAMPLE"),
		whole("github", "ghp_"+strings.Repeat("a1B2", 9)),
		whole("slack", "xoxb-"+"123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"),
		whole("jwt", "eyJhbGciOiJIUzI1NiJ9."+"eyJzdWIiOiIxMjM0NTY3ODkwIn0."+"dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"),
		{name: "pem", value: "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIEowIBAAKCAQEAx1y2z3w4v5\n-----END RSA PRIVATE KEY-----", marker: "MIIEowIBAAKCAQEAx1y2z3w4v5"},
		{name: "password", value: "password: " + "hunter22", marker: "hunter22", column: "password"},
		{name: "bearer", value: "Bearer " + "abcDEF123456789xyz", marker: "abcDEF123456789xyz"},
		{name: "card", value: "4111 1111 " + "1111 1111", marker: "4111 1111 1111 1111", column: "card"},
		whole("planex api key", apiKey),
		whole("nkey seed", string(seed)),
		whole("stripe live", "sk_"+"live_"+"4eC39HqLyjWDarjtT1zdp7dc"),
		whole("stripe restricted", "rk_"+"live_"+"51H8xYzAbCdEfGhIjKlMnOp"),
		whole("google", "AIza"+"SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"),
		{name: "http basic", value: "Authorization: Basic " + basic, marker: basic},
		{name: "url password", value: "postgres://app:" + "Tr0ub4dor3x@db.internal/prod", marker: "Tr0ub4dor3x"},
	}
	for i := range cases {
		if cases[i].column == "" {
			cases[i].column = fmt.Sprintf("c%d", i)
		}
	}
	return cases
}

// sqlText writes s as an SQLite expression of two concatenated halves
// (split inside marker, so that the plan never holds the whole secret),
// newlines and non-ASCII characters as char(n).
func sqlText(s, marker string) string {
	mid := strings.Index(s, marker) + len(marker)/2
	var parts []string
	for _, half := range []string{s[:mid], s[mid:]} {
		var lit strings.Builder
		flush := func() {
			if lit.Len() > 0 {
				parts = append(parts, "'"+strings.ReplaceAll(lit.String(), "'", "''")+"'")
				lit.Reset()
			}
		}
		for _, c := range half {
			if c == '\n' || c > 126 {
				flush()
				parts = append(parts, fmt.Sprintf("char(%d)", c))
				continue
			}
			lit.WriteRune(c)
		}
		flush()
	}
	return strings.Join(parts, " || ")
}

// lockedBuffer collects the stack's log lines from every goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSecretCorpusIsNeverShown is issue 26's acceptance for secrets: every
// format of the corpus is refused in a goal, inputs, labels and an
// idempotency key without being echoed; returned by a tool (an SQL query
// against SQLite that assembles them, mailed on) and echoed in a step
// error (an SQLite error quoting a computed value), it appears in no log
// line (DEBUG), exported span, stored run log event, GetRun or WatchRun
// answer, console or MCP answer, redacted export or outbox mail.
func TestSecretCorpusIsNeverShown(t *testing.T) {
	corpus := secretCorpus(t)
	dir := t.TempDir()
	books := filepath.Join(dir, "playbooks")
	if err := os.Mkdir(books, 0o755); err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, c := range corpus {
		cols = append(cols, sqlText(c.value, c.marker)+" AS "+c.column)
	}
	errSecret := "sk-" + "proj-ERRabcdefghijklmnop1234"
	playbooks := []map[string]any{{
		"name": "leak-report", "description": "Mail the rows of a query holding credentials",
		"examples": []string{"Mail the leak report"}, "match": []string{`(?i)^mail the leak report$`},
		"steps": []map[string]any{
			{"id": "q", "tool": "sql.query", "args": map[string]any{"sql": "SELECT " + strings.Join(cols, ", ")}},
			{"id": "draft", "tool": "email.draft", "depends_on": []string{"q"}, "args": map[string]any{
				"to": []string{"oncall@example.com"}, "subject": "Leak report",
				"body": "${{ steps.q.output.rows.map(r, r.map(c, string(c)).join('\\n')).join('\\n') }}",
			}},
			{"id": "send", "tool": "email.send", "depends_on": []string{"draft"}, "args": map[string]any{"draft_id": "${{ steps.draft.output.draft_id }}"}},
		},
		"answer": "steps.q.output.rows[0].map(c, string(c)).join(' | ')",
	}, {
		"name": "bad-path", "description": "Run a query whose error quotes a computed value",
		"examples": []string{"Break the json path"}, "match": []string{`(?i)^break the json path$`},
		"steps": []map[string]any{
			{"id": "q", "tool": "sql.query", "args": map[string]any{"sql": "SELECT json_extract('{}', " + sqlText(errSecret, errSecret) + ") AS v"}},
		},
		"answer": "string(steps.q.output.row_count)",
	}}
	for _, pb := range playbooks {
		data, err := json.Marshal(pb) // JSON is YAML
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(books, pb["name"].(string)+".yaml"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	f := parseDevFlags(t, "--data-dir="+filepath.Join(dir, "data"), "--playbooks="+books)
	f.services.MCPAddr = devMCPAddr(defaultDevMCPAddr, false, "127.0.0.1:0")
	f.services.ConsoleAddr = "127.0.0.1:0"
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	// Spans go through the same redacting exporter as in production, into
	// memory; the globals are restored when the test ends.
	r, err := f.redactor()
	if err != nil {
		t.Fatal(err)
	}
	prevTP, prevMP, prevProp := otel.GetTracerProvider(), otel.GetMeterProvider(), otel.GetTextMapPropagator()
	spans := tracetest.NewInMemoryExporter()
	tel, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "corpus", Exporter: spans, Redactor: r})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = tel.Shutdown(context.Background())
		otel.SetTracerProvider(prevTP)
		otel.SetMeterProvider(prevMP)
		otel.SetTextMapPropagator(prevProp)
	})
	var logs lockedBuffer
	stack, err := startDevStack(ctx, f, "dev", "127.0.0.1:0", &logs, slog.LevelDebug)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stack.Stop() })
	client, closeConn, err := dial(stack.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeConn() })

	// 1. Refused in every request field (a label's key too), never echoed.
	for _, c := range corpus {
		for field, req := range map[string]*planexv1.StartRunRequest{
			"goal":            {Goal: "Look into " + c.value},
			"inputs":          {Goal: "g", Inputs: &structpb.Struct{Fields: map[string]*structpb.Value{"note": structpb.NewStringValue(c.value)}}},
			"labels":          {Goal: "g", Labels: map[string]string{"note": c.value}},
			"a label's key":   {Goal: "g", Labels: map[string]string{c.value: "x"}},
			"idempotency_key": {Goal: "g", IdempotencyKey: c.value},
		} {
			_, err := client.StartRun(ctx, req)
			msg := status.Convert(err).Message()
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(msg, "looks like a secret") {
				t.Errorf("%s in %s: StartRun = %v, want InvalidArgument (secret)", c.name, field, err)
			}
			if strings.Contains(msg, c.marker) {
				t.Errorf("%s in %s: the error echoes the secret: %q", c.name, field, msg)
			}
		}
	}
	if list, err := client.ListRuns(ctx, &planexv1.ListRunsRequest{}); err != nil || len(list.GetRuns()) != 0 {
		t.Fatalf("refused requests left runs: %v %v", list.GetRuns(), err)
	}

	// 2. Returned by a tool, mailed on, and echoed in a step error.
	runTo := func(goal string) *planexv1.Run {
		t.Helper()
		started, err := client.StartRun(ctx, &planexv1.StartRunRequest{Goal: goal})
		if err != nil {
			t.Fatal(err)
		}
		for {
			got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: started.GetRun().GetId()})
			if err != nil {
				t.Fatal(err)
			}
			if mcpserver.RunEnded(got.GetRun().GetStatus()) {
				return got.GetRun()
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s: run did not end", goal)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	leak := runTo("Mail the leak report")
	if leak.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("leak report: %v %v %q", leak.GetStatus(), leak.GetStopReason(), leak.GetStopMessage())
	}
	if !strings.Contains(leak.GetResult().GetStringValue(), "[REDACTED]") || !strings.Contains(leak.GetResult().GetStringValue(), "[CARD]") {
		t.Errorf("result %v, want the masked values", leak.GetResult())
	}
	bad := runTo("Break the json path")
	if bad.GetStatus() == planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
		t.Fatalf("bad path: %v, want the step to fail", bad.GetStatus())
	}
	var sawErr bool
	for _, st := range bad.GetSteps() {
		if msg := st.GetError().GetMessage(); strings.Contains(msg, "bad JSON path") {
			sawErr = true
			if !strings.Contains(msg, "[REDACTED]") {
				t.Errorf("step error %q, want the value masked", msg)
			}
		}
	}
	if !sawErr {
		t.Errorf("no step error quoting the path: %v", bad.GetSteps())
	}

	// Where the values could show.
	places := map[string]string{}
	markers := []string{errSecret}
	for _, c := range corpus {
		markers = append(markers, c.marker)
	}
	for _, run := range []*planexv1.Run{leak, bad} {
		id := run.GetId()
		got, err := client.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
		if err != nil {
			t.Fatal(err)
		}
		places["GetRun "+id] = protojson.Format(got)
		places["WatchRun "+id] = watchText(ctx, t, client, id)
		seed := stack.Credentials.NATSSeedFiles["supervisor"]
		for _, mode := range []string{"redacted", "stored"} {
			file := filepath.Join(dir, id+"."+mode+".jsonl")
			args := []string{"runs", "export", id, "--nats-url", stack.NATSURL, "--nats-nkey-file", seed, "-o", file}
			if mode == "stored" {
				args = append(args, "--no-redact")
			}
			if out, err := planexIn(t, args...); err != nil {
				t.Fatalf("runs export %s: %v\n%s", mode, err, out)
			}
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			places["export ("+mode+") "+id] = string(data)
		}
		places["console GetRun "+id] = consoleGetRun(ctx, t, stack.ConsoleURL, stack.Credentials.CLITokenFile, id)
		places["MCP get_run "+id] = mcpGetRun(ctx, t, stack.MCPURL, stack.Credentials.CAFile, stack.Credentials.CLITokenFile, id)
	}
	mails, err := filepath.Glob(filepath.Join(stack.OutboxDir, "*.eml"))
	if err != nil || len(mails) != 1 {
		t.Fatalf("outbox %s: %v %v, want the one mail", stack.OutboxDir, mails, err)
	}
	mailText := decodedMail(t, mails[0])
	if !strings.Contains(mailText, "[REDACTED]") {
		t.Errorf("mail body without masks:\n%s", mailText)
	}
	places["mail"] = mailText
	if err := tel.TracerProvider.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	places["spans"] = spanText(spans.GetSpans())
	places["logs"] = logs.String()

	for where, text := range places {
		if text == "" {
			t.Errorf("%s: nothing captured", where)
		}
		for _, m := range markers {
			if strings.Contains(text, m) {
				i := strings.Index(text, m)
				t.Errorf("%s shows %q: …%s…", where, m, text[max(0, i-300):min(len(text), i+100)])
			}
		}
	}
}

// watchText is a run's WatchRun events as text.
func watchText(ctx context.Context, t *testing.T, client planexv1.SupervisorServiceClient, id string) string {
	t.Helper()
	stream, err := client.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: id})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return b.String()
		}
		if err != nil {
			t.Fatalf("WatchRun %s: %v", id, err)
		}
		b.WriteString(protojson.Format(resp) + "\n")
		if resp.GetEvent().GetFinished() != nil {
			return b.String()
		}
	}
}

// consoleGetRun asks the console's Connect API for a run, as its page does.
func consoleGetRun(ctx context.Context, t *testing.T, consoleURL, tokenFile, id string) string {
	t.Helper()
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, consoleURL+"planex.v1.SupervisorService/GetRun", strings.NewReader(`{"runId":"`+id+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Origin", strings.TrimSuffix(consoleURL, "/"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(body), id) {
		t.Fatalf("console GetRun: %d %v %s", resp.StatusCode, err, body)
	}
	return string(body)
}

// mcpGetRun calls the stack's MCP get_run tool (TLS, the CLI's key).
func mcpGetRun(ctx context.Context, t *testing.T, url, caFile, tokenFile, id string) string {
	t.Helper()
	ca, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "corpus", Version: "v1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: url, HTTPClient: &http.Client{Transport: bearer{strings.TrimSpace(string(token)), tr}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_run", Arguments: map[string]any{"run_id": id}})
	if err != nil || res.IsError || len(res.Content) == 0 {
		t.Fatalf("MCP get_run: %v %+v", err, res)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	if sc, err := json.Marshal(res.StructuredContent); err == nil {
		b.Write(sc)
	}
	return b.String()
}

// decodedMail is an outbox message's headers and decoded body.
func decodedMail(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(msg.Body)
	if err != nil {
		t.Fatal(err)
	}
	switch strings.ToLower(msg.Header.Get("Content-Transfer-Encoding")) {
	case "quoted-printable":
		if body, err = io.ReadAll(quotedprintable.NewReader(bytes.NewReader(body))); err != nil {
			t.Fatal(err)
		}
	case "base64":
		if body, err = base64.StdEncoding.DecodeString(strings.Join(strings.Fields(string(body)), "")); err != nil {
			t.Fatal(err)
		}
	}
	return string(raw) + "\n" + string(body)
}

// spanText renders the exported spans' names, statuses, attributes, events
// and links as text.
func spanText(spans tracetest.SpanStubs) string {
	var b strings.Builder
	for _, s := range spans {
		b.WriteString(s.Name + "\n" + s.Status.Description + "\n")
		for _, kv := range s.Attributes {
			b.WriteString(kv.Value.Emit() + "\n")
		}
		for _, ev := range s.Events {
			b.WriteString(ev.Name + "\n")
			for _, kv := range ev.Attributes {
				b.WriteString(kv.Value.Emit() + "\n")
			}
		}
		for _, l := range s.Links {
			for _, kv := range l.Attributes {
				b.WriteString(kv.Value.Emit() + "\n")
			}
		}
	}
	return b.String()
}
