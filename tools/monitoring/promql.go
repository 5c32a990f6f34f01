package monitoring

import (
	"fmt"
	"log/slog"
	"os"
	"sort"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// promqlParser parses the rules' and panels' expressions as Prometheus
// does.
var promqlParser = parser.NewParser(parser.Options{})

// Selector is one series selector of an expression: the metric it names
// and the labels it matches on.
type Selector struct {
	// Metric is the metric name (from the selector's name or its
	// __name__="..." matcher).
	Metric string
	// Labels are the label names the selector matches on, __name__
	// excepted.
	Labels []string
}

// Selectors parses expr and returns its series selectors, in order. A
// selector without a fixed metric name (a regexp on __name__) is an
// error: such a selector cannot be checked against what planex emits.
func Selectors(expr string) ([]Selector, error) {
	node, err := promqlParser.ParseExpr(expr)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", expr, err)
	}
	var out []Selector
	var serr error
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		s := Selector{Metric: vs.Name}
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName {
				if m.Type != labels.MatchEqual {
					serr = fmt.Errorf("selector %s: the metric name must be fixed, not matched with %s", vs, m.Type)
				}
				s.Metric = m.Value
				continue
			}
			s.Labels = append(s.Labels, m.Name)
		}
		sort.Strings(s.Labels)
		out = append(out, s)
		return nil
	})
	if serr != nil {
		return nil, serr
	}
	return out, nil
}

// LoadRules reads and validates a Prometheus rule file as Prometheus
// does (rule names, expressions, durations, annotation templates).
func LoadRules(path string) (*rulefmt.RuleGroups, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, promqlParser, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %v", path, errs)
	}
	return groups, nil
}
