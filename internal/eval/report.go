package eval

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Report is a suite's scores: what `planex eval` writes as JSON and reads
// back as a baseline.
type Report struct {
	// Suite is the suite's name.
	Suite string `json:"suite"`
	// Mode is how the runs were made: live or replay.
	Mode string `json:"mode,omitempty"`
	// Metrics are the suite's metrics.
	Metrics Metrics `json:"metrics"`
	// Tasks are the per-task scores, in suite order.
	Tasks []TaskResult `json:"tasks"`
	// Baseline is the comparison with a previous report (--baseline), when
	// one was made: a regression there fails the report as a failed task
	// does, in every output.
	Baseline *BaselineCheck `json:"baseline,omitempty"`
}

// BaselineCheck is the outcome of comparing a report with its baseline.
type BaselineCheck struct {
	// Path is the baseline report's file.
	Path string `json:"path"`
	// Compared are the metrics gated, in gate order.
	Compared []string `json:"compared"`
	// Skipped are the metrics not gated, with why ("latency_p50_ms: not
	// compared in replay").
	Skipped []string `json:"skipped,omitempty"`
	// Regressions are the compared metrics that moved beyond their
	// tolerance.
	Regressions []Regression `json:"regressions,omitempty"`
}

// LatencyMetrics are the wall-clock metrics: in a replay they measure the
// machine, not the agent, so `planex eval --replay` does not gate them
// unless asked to.
var LatencyMetrics = []string{"latency_p50_ms", "latency_p95_ms"}

// CheckBaseline compares cur with base (read from path) on every gated
// metric except those in skip (each with why it is skipped), and records
// the outcome in cur.Baseline.
func (r *Report) CheckBaseline(path string, base Report, tol map[string]Tolerance, skip map[string]string) {
	c := &BaselineCheck{Path: path}
	for _, g := range gates {
		if why, ok := skip[g.name]; ok {
			c.Skipped = append(c.Skipped, g.name+": "+why)
			continue
		}
		c.Compared = append(c.Compared, g.name)
	}
	for _, reg := range Compare(base, *r, tol) {
		if _, ok := skip[reg.Metric]; !ok {
			c.Regressions = append(c.Regressions, reg)
		}
	}
	r.Baseline = c
}

// Regressed reports whether a baseline comparison found a regression.
func (r Report) Regressed() bool { return r.Baseline != nil && len(r.Baseline.Regressions) > 0 }

// Metrics summarise a suite's runs.
type Metrics struct {
	// Tasks and Passed count the tasks and those that passed.
	Tasks  int `json:"tasks"`
	Passed int `json:"passed"`
	// SuccessRate is Passed / Tasks.
	SuccessRate float64 `json:"success_rate"`
	// StepsPerTask is the mean step attempts per task.
	StepsPerTask float64 `json:"steps_per_task"`
	// ReplansPerTask is the mean replans per task.
	ReplansPerTask float64 `json:"replans_per_task"`
	// ToolSuccessRate is the share of tool calls that succeeded (1 with none).
	ToolSuccessRate float64 `json:"tool_success_rate"`
	// EscalationRate is the share of runs that escalated.
	EscalationRate float64 `json:"escalation_rate"`
	// TokensPerTask is the mean planner tokens per task.
	TokensPerTask float64 `json:"tokens_per_task"`
	// LatencyP50MS and LatencyP95MS are run latency percentiles.
	LatencyP50MS float64 `json:"latency_p50_ms"`
	LatencyP95MS float64 `json:"latency_p95_ms"`
}

// Summarize computes a suite's metrics from its task results.
func Summarize(suite string, results []TaskResult) Report {
	m := Metrics{Tasks: len(results), ToolSuccessRate: 1}
	if len(results) == 0 {
		return Report{Suite: suite, Metrics: m, Tasks: results}
	}
	var steps, replans, calls, failures, escalated int
	var tokens int64
	lat := make([]float64, 0, len(results))
	for _, r := range results {
		if r.Passed {
			m.Passed++
		}
		steps += r.Steps
		replans += r.Replans
		calls += r.ToolCalls
		failures += r.ToolFailures
		tokens += r.Tokens
		if r.Escalated {
			escalated++
		}
		lat = append(lat, r.LatencyMS)
	}
	n := float64(len(results))
	m.SuccessRate = round(float64(m.Passed) / n)
	m.StepsPerTask = round(float64(steps) / n)
	m.ReplansPerTask = round(float64(replans) / n)
	if calls > 0 {
		m.ToolSuccessRate = round(float64(calls-failures) / float64(calls))
	}
	m.EscalationRate = round(float64(escalated) / n)
	m.TokensPerTask = round(float64(tokens) / n)
	slices.Sort(lat)
	m.LatencyP50MS, m.LatencyP95MS = round(percentile(lat, 0.50)), round(percentile(lat, 0.95))
	return Report{Suite: suite, Metrics: m, Tasks: results}
}

func round(v float64) float64 { return math.Round(v*1000) / 1000 }

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Failed reports whether any task failed.
func (r Report) Failed() bool { return r.Metrics.Passed < r.Metrics.Tasks }

// WriteTable prints the report for a terminal: one line per task, the
// failures of failed tasks, then the metrics.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tRESULT\tSTATUS\tSTEPS\tREPLANS\tTOOLS OK\tTOKENS\tLATENCY\tRUN")
	for _, t := range r.Tasks {
		res := "PASS"
		if !t.Passed {
			res = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d/%d\t%d\t%s\t%s\n", t.Name, res, t.Status, t.Steps, t.Replans,
			t.ToolCalls-t.ToolFailures, t.ToolCalls, t.Tokens, ms(t.LatencyMS), t.RunID)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range r.Tasks {
		if t.Passed {
			continue
		}
		fmt.Fprintf(w, "\n%s failed:\n", t.Name)
		for _, f := range t.Failures {
			fmt.Fprintf(w, "  %s\n", strings.ReplaceAll(f, "\n", "\n  "))
		}
	}
	if b := r.Baseline; b != nil {
		fmt.Fprintf(w, "\nbaseline %s: %d metrics compared, %d regressed\n", b.Path, len(b.Compared), len(b.Regressions))
		for _, reg := range b.Regressions {
			fmt.Fprintf(w, "  %s\n", reg)
		}
		for _, s := range b.Skipped {
			fmt.Fprintf(w, "  skipped %s\n", s)
		}
	}
	m := r.Metrics
	fmt.Fprintf(w, "\nsuite %s: %d/%d passed (success %.3f), steps/task %.2f, replans/task %.2f, tool success %.3f, escalation %.3f, tokens/task %.0f, latency p50 %s p95 %s\n",
		r.Suite, m.Passed, m.Tasks, m.SuccessRate, m.StepsPerTask, m.ReplansPerTask, m.ToolSuccessRate, m.EscalationRate, m.TokensPerTask, ms(m.LatencyP50MS), ms(m.LatencyP95MS))
	return nil
}

func ms(v float64) string {
	if v >= 1000 {
		return strconv.FormatFloat(v/1000, 'f', 2, 64) + "s"
	}
	return strconv.FormatFloat(v, 'f', 0, 64) + "ms"
}

// WriteJSON writes the report as indented JSON.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// ReadReport reads a report written by WriteJSON (a baseline).
func ReadReport(path string) (Report, error) {
	var r Report
	data, err := os.ReadFile(path)
	if err != nil {
		return r, fmt.Errorf("read report: %w", err)
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("report %s: %w", path, err)
	}
	if r.Metrics.Tasks == 0 {
		return r, fmt.Errorf("report %s: metrics.tasks: no tasks (not a planex eval report?)", path)
	}
	return r, nil
}

type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitFailure `xml:"failure,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// WriteJUnit writes the report as JUnit XML: one testsuite, one testcase
// per task, a failure element with every failed expectation.
func (r Report) WriteJUnit(w io.Writer) error {
	s := junitSuite{Name: r.Suite, Tests: r.Metrics.Tasks, Failures: r.Metrics.Tasks - r.Metrics.Passed}
	var total float64
	for _, t := range r.Tasks {
		total += t.LatencyMS
		c := junitCase{Name: t.Name, Classname: "planex.eval." + r.Suite, Time: secs(t.LatencyMS),
			SystemOut: fmt.Sprintf("run %s: %s %s, %d steps, %d replans, %d tokens", t.RunID, t.Status, t.StopReason, t.Steps, t.Replans, t.Tokens)}
		if !t.Passed {
			c.Failure = &junitFailure{Message: firstLine(t.Failures[0]), Text: strings.Join(t.Failures, "\n")}
		}
		s.Cases = append(s.Cases, c)
	}
	s.Time = secs(total)
	if b := r.Baseline; b != nil {
		regressed := map[string]Regression{}
		for _, reg := range b.Regressions {
			regressed[reg.Metric] = reg
		}
		for _, name := range b.Compared {
			c := junitCase{Name: "baseline " + name, Classname: "planex.eval." + r.Suite + ".baseline", Time: secs(0)}
			if reg, ok := regressed[name]; ok {
				c.Failure = &junitFailure{Message: reg.String(), Text: fmt.Sprintf("%s\nbaseline: %s", reg, b.Path)}
				s.Failures++
			}
			s.Cases = append(s.Cases, c)
			s.Tests++
		}
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(junitSuites{Suites: []junitSuite{s}}); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

func secs(msv float64) string { return strconv.FormatFloat(msv/1000, 'f', 3, 64) }

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// Tolerance is how far a metric may move the wrong way from its baseline
// before the gate fails: Abs in the metric's unit, or Rel as a fraction of
// the baseline value (the larger band wins when both are set).
type Tolerance struct {
	Abs float64 `json:"abs,omitempty"`
	Rel float64 `json:"rel,omitempty"`
}

func (t Tolerance) String() string {
	switch {
	case t.Rel > 0 && t.Abs > 0:
		return fmt.Sprintf("±%g or %g%%", t.Abs, t.Rel*100)
	case t.Rel > 0:
		return fmt.Sprintf("%g%%", t.Rel*100)
	default:
		return fmt.Sprintf("%g", t.Abs)
	}
}

// gate is a metric the baseline gate checks.
type gate struct {
	name         string
	higherBetter bool
	get          func(Metrics) float64
	def          Tolerance
}

var gates = []gate{
	{"success_rate", true, func(m Metrics) float64 { return m.SuccessRate }, Tolerance{}},
	{"steps_per_task", false, func(m Metrics) float64 { return m.StepsPerTask }, Tolerance{Rel: 0.10}},
	{"replans_per_task", false, func(m Metrics) float64 { return m.ReplansPerTask }, Tolerance{Abs: 0.25}},
	{"tool_success_rate", true, func(m Metrics) float64 { return m.ToolSuccessRate }, Tolerance{Abs: 0.05}},
	{"escalation_rate", false, func(m Metrics) float64 { return m.EscalationRate }, Tolerance{}},
	{"tokens_per_task", false, func(m Metrics) float64 { return m.TokensPerTask }, Tolerance{Rel: 0.10}},
	{"latency_p50_ms", false, func(m Metrics) float64 { return m.LatencyP50MS }, Tolerance{Rel: 0.50, Abs: 250}},
	{"latency_p95_ms", false, func(m Metrics) float64 { return m.LatencyP95MS }, Tolerance{Rel: 0.50, Abs: 500}},
}

// GateNames lists the metrics the baseline gate checks.
func GateNames() []string {
	out := make([]string, len(gates))
	for i, g := range gates {
		out[i] = g.name
	}
	return out
}

// DefaultTolerances are the bands used unless overridden.
func DefaultTolerances() map[string]Tolerance {
	out := map[string]Tolerance{}
	for _, g := range gates {
		out[g.name] = g.def
	}
	return out
}

// ParseTolerance reads "metric=0.05" (absolute) or "metric=10%"
// (relative) into tol.
func ParseTolerance(tol map[string]Tolerance, s string) error {
	name, v, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("tolerance %q: want metric=value or metric=percent%%", s)
	}
	if _, known := tol[name]; !known {
		return fmt.Errorf("tolerance %q: unknown metric %q (want one of %s)", s, name, strings.Join(GateNames(), ", "))
	}
	rel := strings.HasSuffix(v, "%")
	f, err := strconv.ParseFloat(strings.TrimSuffix(v, "%"), 64)
	if err != nil || f < 0 {
		return fmt.Errorf("tolerance %q: %q is not a non-negative number", s, v)
	}
	if rel {
		tol[name] = Tolerance{Rel: f / 100}
	} else {
		tol[name] = Tolerance{Abs: f}
	}
	return nil
}

// Regression is a metric that moved beyond its tolerance.
type Regression struct {
	// Metric is the metric's name.
	Metric string `json:"metric"`
	// Old and New are the baseline's and this run's values.
	Old float64 `json:"old"`
	New float64 `json:"new"`
	// Tolerance is the band it left.
	Tolerance Tolerance `json:"tolerance"`
}

func (r Regression) String() string {
	return fmt.Sprintf("%s regressed: old %g, new %g, tolerance %s", r.Metric, r.Old, r.New, r.Tolerance)
}

// ErrRegressed is matched by the error Compare's caller builds.
var ErrRegressed = errors.New("metrics regressed beyond tolerance")

// Compare returns the metrics of cur that are worse than base by more than
// their tolerance (tol; missing metrics use DefaultTolerances).
func Compare(base, cur Report, tol map[string]Tolerance) []Regression {
	var out []Regression
	for _, g := range gates {
		t, ok := tol[g.name]
		if !ok {
			t = g.def
		}
		old, now := g.get(base.Metrics), g.get(cur.Metrics)
		worse := now - old
		if g.higherBetter {
			worse = old - now
		}
		band := max(t.Abs, t.Rel*math.Abs(old))
		if worse > band+1e-9 {
			out = append(out, Regression{Metric: g.name, Old: old, New: now, Tolerance: t})
		}
	}
	return out
}
