package monitoring

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
)

// Recorder keeps scrapes of /metrics in a Prometheus TSDB, as a
// Prometheus server scraping planex would, so that the dashboards'
// queries can be evaluated over them with Prometheus' own engine.
type Recorder struct {
	db *tsdb.DB
}

// OpenRecorder opens an empty TSDB in dir (a temporary directory: the
// head block stays in memory for the short recordings this is for).
func OpenRecorder(dir string) (*Recorder, error) {
	db, err := tsdb.Open(dir, slog.New(slog.DiscardHandler), nil, tsdb.DefaultOptions(), nil)
	if err != nil {
		return nil, fmt.Errorf("open tsdb in %s: %w", dir, err)
	}
	return &Recorder{db: db}, nil
}

// Close closes the TSDB.
func (r *Recorder) Close() error { return r.db.Close() }

// Queryable is what the PromQL engine reads.
func (r *Recorder) Queryable() storage.Queryable { return r.db }

// Append parses a /metrics body in the Prometheus text format and stores
// every sample at the scrape time at, with the target labels added (job,
// instance), as Prometheus stores a scrape: histograms as _bucket (with
// le), _sum and _count, summaries as quantiles, _sum and _count. It
// returns the number of samples stored.
func (r *Recorder) Append(ctx context.Context, body io.Reader, at time.Time, target labels.Labels) (int, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(body)
	if err != nil {
		return 0, fmt.Errorf("parse metrics: %w", err)
	}
	ts := at.UnixMilli()
	app := r.db.Appender(ctx)
	n := 0
	add := func(name string, m *dto.Metric, v float64, extra ...string) error {
		b := labels.NewBuilder(target)
		for _, l := range m.GetLabel() {
			b.Set(l.GetName(), l.GetValue())
		}
		for i := 0; i+1 < len(extra); i += 2 {
			b.Set(extra[i], extra[i+1])
		}
		b.Set(labels.MetricName, name)
		if _, err := app.Append(0, b.Labels(), ts, v); err != nil {
			return fmt.Errorf("append %s: %w", name, err)
		}
		n++
		return nil
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var err error
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				err = add(name, m, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				err = add(name, m, m.GetGauge().GetValue())
			case dto.MetricType_HISTOGRAM:
				err = appendHistogram(name, m, add)
			case dto.MetricType_SUMMARY:
				s := m.GetSummary()
				for _, q := range s.GetQuantile() {
					if err = add(name, m, q.GetValue(), "quantile", formatFloat(q.GetQuantile())); err != nil {
						break
					}
				}
				if err == nil {
					err = add(name+"_sum", m, s.GetSampleSum())
				}
				if err == nil {
					err = add(name+"_count", m, float64(s.GetSampleCount()))
				}
			default:
				err = add(name, m, m.GetUntyped().GetValue())
			}
			if err != nil {
				_ = app.Rollback()
				return 0, err
			}
		}
	}
	if err := app.Commit(); err != nil {
		return 0, fmt.Errorf("commit scrape: %w", err)
	}
	return n, nil
}

func appendHistogram(name string, m *dto.Metric, add func(string, *dto.Metric, float64, ...string) error) error {
	h := m.GetHistogram()
	inf := false
	for _, b := range h.GetBucket() {
		if math.IsInf(b.GetUpperBound(), +1) {
			inf = true
		}
		if err := add(name+"_bucket", m, float64(b.GetCumulativeCount()), "le", formatFloat(b.GetUpperBound())); err != nil {
			return err
		}
	}
	if !inf {
		if err := add(name+"_bucket", m, float64(h.GetSampleCount()), "le", "+Inf"); err != nil {
			return err
		}
	}
	if err := add(name+"_sum", m, h.GetSampleSum()); err != nil {
		return err
	}
	return add(name+"_count", m, float64(h.GetSampleCount()))
}

// formatFloat writes le and quantile values as Prometheus does.
func formatFloat(f float64) string {
	if math.IsInf(f, +1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}
