package monitoring

import (
	"fmt"
	"io"
	"sort"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Emitted is what one scrape showed: for every metric name as PromQL
// sees it (histograms as _bucket, _sum and _count), the label names of
// its series.
type Emitted map[string]map[string]bool

// ParseScrape reads a /metrics body in the Prometheus text format.
func ParseScrape(r io.Reader) (Emitted, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	out := Emitted{}
	add := func(name string, m *dto.Metric, extra ...string) {
		ls := out[name]
		if ls == nil {
			ls = map[string]bool{}
			out[name] = ls
		}
		for _, l := range m.GetLabel() {
			ls[l.GetName()] = true
		}
		for _, l := range extra {
			ls[l] = true
		}
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				add(name+"_bucket", m, "le")
				add(name+"_sum", m)
				add(name+"_count", m)
			case dto.MetricType_SUMMARY:
				add(name, m, "quantile")
				add(name+"_sum", m)
				add(name+"_count", m)
			default:
				add(name, m)
			}
		}
	}
	return out, nil
}

// Merge adds what another scrape showed.
func (e Emitted) Merge(o Emitted) {
	for name, ls := range o {
		if e[name] == nil {
			e[name] = map[string]bool{}
		}
		for l := range ls {
			e[name][l] = true
		}
	}
}

// Names are the metric names, sorted.
func (e Emitted) Names() []string {
	out := make([]string, 0, len(e))
	for n := range e {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
