package monitoring

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"image/png"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
)

var updateImages = flag.Bool("update-images", false, "run a planex dev workload and render docs/img/dashboards/*.png from the dashboards' queries")

// imagesDir is where the dashboard pictures go, from the repository root.
const imagesDir = "docs/img/dashboards"

// imageWindow is how the pictures evaluate the panels.
func imageWindow(start, end time.Time) Window {
	return Window{Start: start, End: end, Step: 2 * time.Second, RateInterval: time.Minute}
}

// TestDashboardImages runs planex dev with a workload spread over about
// 80 s, scrapes its /metrics every second into an in-process Prometheus
// TSDB, evaluates every panel's queries over the recording with
// Prometheus' engine and renders each dashboard to
// docs/img/dashboards/<uid>.png. Only with -update-images.
func TestDashboardImages(t *testing.T) {
	if !*updateImages {
		t.Skip("renders docs/img/dashboards/*.png from a two-minute planex dev workload: go test -run TestDashboardImages -update-images")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	s := startDev(t, ctx)
	rec, err := OpenRecorder(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()

	start := time.Now()
	stop := scrapeEvery(ctx, t, rec, s.metricsURL, time.Second)
	longWorkload(t, ctx, s, 80*time.Second)
	// The tail: consumer lag is observed every 10 s, and the rates fall
	// back once the workload stops.
	select {
	case <-time.After(20 * time.Second):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	scrapes := stop()
	end := time.Now()
	if scrapes < 60 {
		t.Fatalf("%d scrapes of %s in %s: want about one a second", scrapes, s.metricsURL, end.Sub(start).Round(time.Second))
	}

	win := imageWindow(start, end)
	eng := NewEngine()
	if err := os.MkdirAll(filepath.Join(root, imagesDir), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range Dashboards {
		g, err := ReadGrafanaDashboard(filepath.Join(root, dashboardsDir, d.File))
		if err != nil {
			t.Fatal(err)
		}
		panels, err := Evaluate(ctx, eng, rec.Queryable(), g, win)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range panels {
			// An empty panel is fine only when its metrics are
			// documented as not emitted by the dev stack, or the
			// workload cannot cause what it counts.
			if len(p.Series) > 0 || strings.HasPrefix(p.NoData, "not in the dev stack") {
				continue
			}
			if why, ok := quietInDev[p.Title]; ok {
				panels[i].NoData = why
				continue
			}
			t.Errorf("dashboard %s panel %q: no data from the workload", g.UID, p.Title)
		}
		var b bytes.Buffer
		sub := fmt.Sprintf("Rendered by tools/monitoring (not Grafana) from this dashboard's queries over a planex dev workload recorded into an in-process Prometheus TSDB, %s–%s UTC; step %s, $__rate_interval = %s.",
			start.UTC().Format("2006-01-02 15:04:05"), end.UTC().Format("15:04:05"), win.Step, promDuration(win.RateInterval))
		if err := RenderPNG(&b, g.Title, sub, panels, win); err != nil {
			t.Fatalf("dashboard %s: %v", g.UID, err)
		}
		out := filepath.Join(root, imagesDir, g.UID+".png")
		if err := os.WriteFile(out, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d panels, %d KiB)", out, len(panels), b.Len()/1024)
	}
}

// quietInDev are the panels that stay empty over the dev workload
// although their metrics are emitted, and why.
var quietInDev = map[string]string{
	"Escalated share of finished runs": "no escalated run: the dev playbooks neither escalate nor leave a gate past its SLA",
}

// scrapeEvery scrapes url into rec every interval until the returned
// stop is called, which returns the number of scrapes stored. A failed
// scrape fails the test.
func scrapeEvery(ctx context.Context, t *testing.T, rec *Recorder, url string, interval time.Duration) (stop func() int) {
	t.Helper()
	target := labels.FromStrings("job", "planex", "instance", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/metrics"))
	done := make(chan struct{})
	var wg sync.WaitGroup
	n := 0
	var serr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			if err := scrapeOnce(ctx, rec, url, target); err != nil {
				serr = err
				return
			}
			n++
			select {
			case <-done:
				return
			case <-ctx.Done():
				serr = ctx.Err()
				return
			case <-tick.C:
			}
		}
	}()
	return func() int {
		close(done)
		wg.Wait()
		if serr != nil {
			t.Fatalf("scrape %s: %v", url, serr)
		}
		return n
	}
}

func scrapeOnce(ctx context.Context, rec *Recorder, url string, target labels.Labels) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	at := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	_, err = rec.Append(ctx, resp.Body, at, target)
	return err
}

// longWorkload repeats the workload of TestEmittedMetrics for about d:
// runs that succeed, fail on data and fail to plan, runs that wait at a
// gate decided a few seconds later (approved, rejected back to the
// planner, rejected with --stop), forged step requests the executors
// refuse and one undecodable engine message. The pauses space the
// events out so that the charts show their shape; nothing waits on them.
func longWorkload(t *testing.T, ctx context.Context, s *devStack, d time.Duration) {
	deadline := time.Now().Add(d)
	decisions := [][]string{{"approve"}, {"reject", "--comment", "not now"}, {"reject", "--stop", "--comment", "no"}}
	for i := 0; time.Now().Before(deadline); i++ {
		s.run(t, ctx, "How many open support tickets does Acme Corp have?", 0)
		if i%2 == 1 {
			s.run(t, ctx, "How many open support tickets does Acme Inc have?", 3) // NO_DATA after a replan
		}
		if i%3 == 2 {
			s.run(t, ctx, "Tell me a joke about llamas", 3) // PLANNER_ERROR
		}
		id := s.run(t, ctx, "Close support ticket 400", 4) // waits at the sql.exec gate
		pause(t, ctx, time.Duration(1+i%4)*time.Second)
		decide := decisions[i%len(decisions)]
		if out, code := s.planex(t, ctx, append([]string{"runs", decide[0], id}, decide[1:]...)...); code != 0 {
			t.Fatalf("planex runs %s %s: exit %d\n%s", decide[0], id, code, out)
		}
		if i%3 == 0 {
			s.forgeStep(t, ctx)
		}
		if i == 2 || i == 6 {
			// Twice: rate() sees no increase in a series' first sample.
			s.dropMessage(t, ctx)
		}
		pause(t, ctx, time.Second)
	}
}

func pause(t *testing.T, ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
}

// syntheticScrape is a /metrics body of a planex process at a moment:
// started and finished counters at n and a histogram.
func syntheticScrape(n int) string {
	return fmt.Sprintf(`# TYPE planex_runs_started_total counter
planex_runs_started_total %d
# TYPE planex_runs_finished_total counter
planex_runs_finished_total{status="RUN_STATUS_SUCCEEDED",stop_reason="STOP_REASON_DONE"} %d
planex_runs_finished_total{status="RUN_STATUS_FAILED",stop_reason="STOP_REASON_NO_DATA"} %d
# TYPE planex_executor_step_duration_seconds histogram
planex_executor_step_duration_seconds_bucket{tool="sql.query",le="0.1"} %d
planex_executor_step_duration_seconds_bucket{tool="sql.query",le="1"} %d
planex_executor_step_duration_seconds_bucket{tool="sql.query",le="+Inf"} %d
planex_executor_step_duration_seconds_sum{tool="sql.query"} %d
planex_executor_step_duration_seconds_count{tool="sql.query"} %d
`, 2*n, n, n, n, 2*n, 2*n, n, 2*n)
}

// TestRenderDashboard records synthetic scrapes (one a second, two runs
// started a second), evaluates the Overview dashboard's JSON over them
// and renders it: the rates, the legend formats, the histogram quantile
// and the reason of an empty panel come out as Prometheus and Grafana
// would show them, and the PNG decodes.
func TestRenderDashboard(t *testing.T) {
	rec, err := OpenRecorder(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	t0 := time.Unix(1_700_000_000, 0)
	target := labels.FromStrings("job", "planex", "instance", "test")
	for i := 0; i <= 120; i++ {
		if _, err := rec.Append(t.Context(), strings.NewReader(syntheticScrape(i)), t0.Add(time.Duration(i)*time.Second), target); err != nil {
			t.Fatal(err)
		}
	}
	g, err := ReadGrafanaDashboard(filepath.Join(root, dashboardsDir, "planex-overview.json"))
	if err != nil {
		t.Fatal(err)
	}
	win := imageWindow(t0.Add(60*time.Second), t0.Add(120*time.Second))
	panels, err := Evaluate(t.Context(), NewEngine(), rec.Queryable(), g, win)
	if err != nil {
		t.Fatal(err)
	}
	byTitle := map[string]PanelData{}
	for _, p := range panels {
		byTitle[p.Title] = p
	}
	last := func(panel, legend string) float64 {
		t.Helper()
		for _, s := range byTitle[panel].Series {
			if s.Legend == legend {
				return s.Points[len(s.Points)-1].F
			}
		}
		t.Fatalf("panel %q: no series %q in %+v", panel, legend, byTitle[panel].Series)
		return 0
	}
	for _, c := range []struct {
		panel, legend string
		want          float64
	}{
		{"Runs started and finished", "started", 2},
		{"Runs started and finished", "RUN_STATUS_FAILED", 1},
		{"Run success ratio (refusals and cancellations excluded)", "success ratio", 0.5},
		// Half the observations under 0.1 s, all under 1 s: p95 is
		// interpolated in the (0.1, 1] bucket at 0.1 + 0.9*0.9.
		{"Step latency p95 by tool", "sql.query", 0.91},
	} {
		if got := last(c.panel, c.legend); math.Abs(got-c.want) > 1e-6 {
			t.Errorf("panel %q series %q: %g, want %g", c.panel, c.legend, got, c.want)
		}
	}
	if p := byTitle["Queue lag (pending messages)"]; len(p.Series) != 0 || p.NoData != "no data in this workload" {
		t.Errorf("empty panel: %d series, NoData %q", len(p.Series), p.NoData)
	}

	var b bytes.Buffer
	if err := RenderPNG(&b, g.Title, "synthetic", panels, win); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	if w, h := img.Bounds().Dx(), img.Bounds().Dy(); w != 1800 || h < 3*300 {
		t.Errorf("picture %dx%d, want 1800 wide and three rows of panels", w, h)
	}
}

// TestEvaluateRefusesUnknownVariables: a Grafana variable the renderer
// cannot fill is an error naming it, not a query that silently fails.
func TestEvaluateRefusesUnknownVariables(t *testing.T) {
	w := imageWindow(time.Unix(0, 0), time.Unix(60, 0))
	if got, err := expandVars(`rate(x[$__rate_interval]) + rate(x[${__interval}])`, w); err != nil || got != `rate(x[60s]) + rate(x[2s])` {
		t.Errorf("expandVars: %q, %v", got, err)
	}
	if _, err := expandVars(`x{pod=~"$pod"}`, w); err == nil || !strings.Contains(err.Error(), "$pod") {
		t.Errorf("expandVars with $pod: %v", err)
	}
	if got := Legend("{{stream}}/{{ consumer }}", labels.FromStrings("stream", "S", "consumer", "c")); got != "S/c" {
		t.Errorf("Legend: %q", got)
	}
	for _, c := range []struct {
		unit string
		v    float64
		want string
	}{{"percentunit", 0.5, "50%"}, {"s", 0.25, "250 ms"}, {"s", 2, "2 s"}, {"ops", 1500, "1.5k/s"}, {"bytes", 2048, "2 KiB"}, {"short", 3, "3"}} {
		if got := FormatUnit(c.unit, c.v); got != c.want {
			t.Errorf("FormatUnit(%q, %g) = %q, want %q", c.unit, c.v, got, c.want)
		}
	}
}
