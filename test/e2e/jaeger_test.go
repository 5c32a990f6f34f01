package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/planex-dev/planex/internal/freeport"
)

// jaegerBuildFlags are the go build flags of the test's Jaeger, part of
// its cache key; .ci/build-jaeger uses the same. Without optimization,
// inlining and the symbol table: the tests send it a few hundred spans,
// and its cold build (about 2,600 packages) costs 28% less CPU (325 s
// against 451 s on this machine kind; docs/ci.md).
var jaegerBuildFlags = []string{"-gcflags=all=-N -l", "-ldflags=-s -w"}

// jaegerBinary builds Jaeger v2 from the pinned tools/jaeger module into
// the user cache (keyed by the module's go.sum and jaegerBuildFlags), once
// per machine. The first build takes minutes on 2 cores; later runs reuse
// it. It
// holds an flock on <binary>.lock while it looks and builds, as
// .ci/build-jaeger does (CI starts that at the beginning of the run): a
// build already under way is waited for, never done twice at once.
func jaegerBinary(t testing.TB) string {
	t.Helper()
	root := repoRoot(t)
	sum, err := os.ReadFile(filepath.Join(root, "tools", "jaeger", "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(append(sum, strings.Join(jaegerBuildFlags, "\n")...))
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "planex-test")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "jaeger-"+hex.EncodeToString(h[:8]))
	lock, err := os.OpenFile(bin+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	waited := time.Now()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("lock %s: %v", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if d := time.Since(waited); d > time.Second {
		t.Logf("waited %s for another build of Jaeger (.ci/build-jaeger)", d.Round(time.Second))
	}
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	t.Logf("building Jaeger v2 from tools/jaeger into %s (first time: ~10 min)", bin)
	args := append([]string{"build"}, jaegerBuildFlags...)
	cmd := exec.Command("go", append(args, "-o", bin+".tmp", "github.com/jaegertracing/jaeger/cmd/jaeger")...)
	cmd.Dir = filepath.Join(root, "tools", "jaeger")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build jaeger: %v\n%s", err, out)
	}
	if err := os.Rename(bin+".tmp", bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// jaeger is a running Jaeger v2 with in-memory storage, every listener on
// loopback.
type jaeger struct {
	otlp  string // OTLP/gRPC host:port
	query string // query HTTP base URL
}

const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: none
    logs:
      level: warn
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: %q
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: %q
    grpc:
      endpoint: %q
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %q
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`

func startJaeger(t testing.TB) *jaeger {
	t.Helper()
	bin := jaegerBinary(t)
	health, queryHTTP, queryGRPC, otlp := freeport.Addr(t), freeport.Addr(t), freeport.Addr(t), freeport.Addr(t)
	cfg := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, jaegerConfig, health, queryHTTP, queryGRPC, otlp), 0o600); err != nil {
		t.Fatal(err)
	}
	startProc(t, "jaeger", bin, []string{"OTEL_SDK_DISABLED=true", "OTEL_TRACES_EXPORTER=none"}, "--config", cfg)
	j := &jaeger{otlp: otlp, query: "http://" + queryHTTP}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + health + "/status")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return j
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("jaeger not healthy within 60s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// jTrace is the subset of Jaeger's /api/traces/{id} answer the tests read.
type jTrace struct {
	TraceID   string              `json:"traceID"`
	Spans     []jSpan             `json:"spans"`
	Processes map[string]jProcess `json:"processes"`
}

type jSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	Tags      []jTag `json:"tags"`
	ProcessID string `json:"processID"`
	// StartTime (µs since the epoch) and Duration (µs).
	StartTime int64 `json:"startTime"`
	Duration  int64 `json:"duration"`
	Logs      []struct {
		Fields []jTag `json:"fields"`
	} `json:"logs"`
}

type jTag struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

type jProcess struct {
	ServiceName string `json:"serviceName"`
}

// trace fetches a trace by id; ok is false while Jaeger has not seen it.
func (j *jaeger) trace(t testing.TB, id string) (jTrace, bool) {
	t.Helper()
	resp, err := http.Get(j.query + "/api/traces/" + id)
	if err != nil {
		t.Fatalf("query jaeger: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return jTrace{}, false
	}
	var body struct {
		Data []jTrace `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("decode jaeger answer: %v", err)
	}
	if len(body.Data) == 0 {
		return jTrace{}, false
	}
	return body.Data[0], true
}

func (s jSpan) tag(key string) (any, bool) {
	for _, tg := range s.Tags {
		if tg.Key == key {
			return tg.Value, true
		}
	}
	return nil, false
}

func (s jSpan) parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}
