package monitoring

import (
	"fmt"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/model/rulefmt"
)

// Query is one PromQL expression of a rule or a panel.
type Query struct {
	// Where names it: "alert PlanexNatsDown", "dashboard planex-nats panel \"Stream bytes\"".
	Where string
	// Expr is the expression as Prometheus evaluates it (Grafana's
	// $__rate_interval replaced).
	Expr string
}

// RateInterval stands for Grafana's $__rate_interval when a panel's
// query is parsed or evaluated outside Grafana.
const RateInterval = "1m"

// Queries are every rule's and panel's expression.
func Queries(rules *rulefmt.RuleGroups) []Query {
	var out []Query
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			where := "record " + r.Record
			if r.Alert != "" {
				where = "alert " + r.Alert
			}
			out = append(out, Query{Where: "rules group " + g.Name + " " + where, Expr: r.Expr})
		}
	}
	for _, d := range Dashboards {
		for _, p := range d.Panels {
			for _, t := range p.Targets {
				out = append(out, Query{Where: fmt.Sprintf("dashboard %s panel %q", d.UID, p.Title), Expr: PanelExpr(t.Expr)})
			}
		}
	}
	return out
}

// PanelExpr is a panel query with Grafana's variables replaced.
func PanelExpr(expr string) string { return strings.ReplaceAll(expr, "$__rate_interval", RateInterval) }

// Recorded are the names the recording rules define.
func Recorded(rules *rulefmt.RuleGroups) map[string]bool {
	out := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				out[r.Record] = true
			}
		}
	}
	return out
}

// Check reports every selector of qs that names a metric that is neither
// emitted, recorded by a rule, external, event-only nor pending, and
// every label a selector of an emitted metric matches on that the
// metric's series do not carry.
func Check(qs []Query, emitted Emitted, recorded map[string]bool) []error {
	var errs []error
	for _, q := range qs {
		sels, err := Selectors(q.Expr)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", q.Where, err))
			continue
		}
		for _, s := range sels {
			if recorded[s.Metric] {
				continue
			}
			if _, ok := External[s.Metric]; ok {
				continue
			}
			if _, ok := EventOnly[s.Metric]; ok {
				continue
			}
			if _, ok := Pending[s.Metric]; ok {
				continue
			}
			ls, ok := emitted[s.Metric]
			if !ok {
				errs = append(errs, fmt.Errorf("%s: metric %s is not emitted by planex (nor recorded by a rule, nor a documented external, event-only or pending metric); emitted planex metrics: %s",
					q.Where, s.Metric, strings.Join(planexNames(emitted), ", ")))
				continue
			}
			for _, l := range s.Labels {
				if !ls[l] {
					errs = append(errs, fmt.Errorf("%s: metric %s has no label %q (its labels: %s)", q.Where, s.Metric, l, strings.Join(keys(ls), ", ")))
				}
			}
		}
	}
	return errs
}

func planexNames(e Emitted) []string {
	var out []string
	for _, n := range e.Names() {
		if strings.HasPrefix(n, "planex_") {
			out = append(out, n)
		}
	}
	return out
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
