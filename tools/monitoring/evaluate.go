package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
)

// GrafanaDashboard is what the renderer reads of a dashboard's Grafana
// JSON: the same file Grafana loads.
type GrafanaDashboard struct {
	// UID and Title as Grafana shows them.
	UID   string `json:"uid"`
	Title string `json:"title"`
	// Panels in their JSON order (which is their grid order).
	Panels []GrafanaPanel `json:"panels"`
}

// GrafanaPanel is one panel of a GrafanaDashboard.
type GrafanaPanel struct {
	// Title and Type (timeseries, stat) as in the JSON.
	Title string `json:"title"`
	Type  string `json:"type"`
	// FieldConfig carries the panel's unit.
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	// Targets are the panel's PromQL queries.
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
		Hide         bool   `json:"hide"`
	} `json:"targets"`
}

// ReadGrafanaDashboard reads a dashboard's Grafana JSON file.
func ReadGrafanaDashboard(path string) (GrafanaDashboard, error) {
	var d GrafanaDashboard
	b, err := os.ReadFile(path)
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("%s: %w", path, err)
	}
	if d.UID == "" || len(d.Panels) == 0 {
		return d, fmt.Errorf("%s: no uid or no panels", path)
	}
	return d, nil
}

// Window is the time range and resolution the panels are evaluated
// over, and what Grafana's interval variables stand for.
type Window struct {
	// Start and End bound the range queries; Step is their resolution.
	Start, End time.Time
	Step       time.Duration
	// RateInterval replaces $__rate_interval (Grafana computes it from
	// the scrape interval and the step; a fixed value reads the same).
	RateInterval time.Duration
}

// PanelData is one panel's queries evaluated over a Window.
type PanelData struct {
	// Title and Unit of the panel.
	Title, Unit string
	// Series are the result series, in the panel's target order and, per
	// target, sorted by legend.
	Series []SeriesData
	// NoData says why a panel without series is empty, when the metrics
	// it reads are documented as not emitted by the dev stack.
	NoData string
}

// SeriesData is one result series with its legend.
type SeriesData struct {
	// Legend is the target's legend format applied to the series labels.
	Legend string
	// Points are the samples; NaN and ±Inf are left out (gaps).
	Points []promql.FPoint
}

var grafanaVar = regexp.MustCompile(`\$(\{[A-Za-z0-9_]+\}|[A-Za-z0-9_]+)`)

// expandVars replaces Grafana's interval variables in expr; any other
// variable is an error naming it, as the renderer cannot know its value.
func expandVars(expr string, w Window) (string, error) {
	var bad []string
	out := grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		switch strings.Trim(v, "${}") {
		case "__rate_interval":
			return promDuration(w.RateInterval)
		case "__interval":
			return promDuration(w.Step)
		case "__range":
			return promDuration(w.End.Sub(w.Start))
		}
		bad = append(bad, v)
		return v
	})
	if len(bad) > 0 {
		return "", fmt.Errorf("expression %q: Grafana variable %s has no value here", expr, strings.Join(bad, ", "))
	}
	return out, nil
}

func promDuration(d time.Duration) string {
	return fmt.Sprintf("%ds", int64(d/time.Second))
}

var legendVar = regexp.MustCompile(`\{\{\s*([^{}\s]+)\s*\}\}`)

// Legend applies a Grafana legend format ({{label}}) to a series' labels;
// an empty format shows the labels as PromQL prints them.
func Legend(format string, ls labels.Labels) string {
	if format == "" {
		return ls.String()
	}
	return legendVar.ReplaceAllStringFunc(format, func(m string) string {
		return ls.Get(legendVar.FindStringSubmatch(m)[1])
	})
}

// NewEngine is a PromQL engine for Evaluate.
func NewEngine() *promql.Engine {
	return promql.NewEngine(promql.EngineOpts{MaxSamples: 50_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
}

// Evaluate runs every query of every panel of d as a range query over w,
// as Grafana would, against q.
func Evaluate(ctx context.Context, eng *promql.Engine, q storage.Queryable, d GrafanaDashboard, w Window) ([]PanelData, error) {
	if !w.End.After(w.Start) || w.Step <= 0 || w.RateInterval < time.Second {
		return nil, fmt.Errorf("window %s..%s step %s rate interval %s: want End after Start, a positive step and a rate interval of at least 1s",
			w.Start.Format(time.RFC3339), w.End.Format(time.RFC3339), w.Step, w.RateInterval)
	}
	out := make([]PanelData, 0, len(d.Panels))
	for _, p := range d.Panels {
		pd := PanelData{Title: p.Title, Unit: p.FieldConfig.Defaults.Unit}
		var metrics []string
		for _, t := range p.Targets {
			if t.Hide || t.Expr == "" {
				continue
			}
			expr, err := expandVars(t.Expr, w)
			if err != nil {
				return nil, fmt.Errorf("dashboard %s panel %q: %w", d.UID, p.Title, err)
			}
			sels, err := Selectors(expr)
			if err != nil {
				return nil, fmt.Errorf("dashboard %s panel %q: %w", d.UID, p.Title, err)
			}
			for _, s := range sels {
				metrics = append(metrics, s.Metric)
			}
			series, err := rangeQuery(ctx, eng, q, expr, w)
			if err != nil {
				return nil, fmt.Errorf("dashboard %s panel %q: %w", d.UID, p.Title, err)
			}
			var sd []SeriesData
			for _, s := range series {
				var pts []promql.FPoint
				for _, pt := range s.Floats {
					if !math.IsNaN(pt.F) && !math.IsInf(pt.F, 0) {
						pts = append(pts, pt)
					}
				}
				if len(pts) > 0 {
					sd = append(sd, SeriesData{Legend: Legend(t.LegendFormat, s.Metric), Points: pts})
				}
			}
			sort.SliceStable(sd, func(i, j int) bool { return sd[i].Legend < sd[j].Legend })
			pd.Series = append(pd.Series, sd...)
		}
		if len(pd.Series) == 0 {
			pd.NoData = noDataReason(metrics)
		}
		out = append(out, pd)
	}
	return out, nil
}

func rangeQuery(ctx context.Context, eng *promql.Engine, q storage.Queryable, expr string, w Window) (promql.Matrix, error) {
	qry, err := eng.NewRangeQuery(ctx, q, nil, expr, w.Start, w.End, w.Step)
	if err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	defer qry.Close()
	res := qry.Exec(ctx)
	if res.Err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, res.Err)
	}
	m, err := res.Matrix()
	if err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	return m, nil
}

// noDataReason names the metrics of an empty panel that the dev stack
// cannot show (external.go), or says the workload showed none.
func noDataReason(metrics []string) string {
	seen := map[string]bool{}
	var why []string
	for _, m := range metrics {
		if seen[m] {
			continue
		}
		seen[m] = true
		if s, ok := External[m]; ok {
			from, _, _ := strings.Cut(s.From, " (")
			why = append(why, m+": "+from)
		} else if _, ok := EventOnly[m]; ok {
			why = append(why, m+": event-only, none in this workload")
		}
	}
	if len(why) == 0 {
		return "no data in this workload"
	}
	return "not in the dev stack — " + strings.Join(why, "; ")
}
