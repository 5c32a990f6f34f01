package monitoring

import (
	"encoding/json"
	"fmt"
)

// Dashboard is one Grafana dashboard: a grid of time series panels.
type Dashboard struct {
	// UID is Grafana's stable id; File is its JSON file name.
	UID, File string
	// Title and Description are shown by Grafana.
	Title, Description string
	// Panels, laid out two per row in order.
	Panels []Panel
}

// Panel is one time series panel.
type Panel struct {
	// Title and Description are shown by Grafana.
	Title, Description string
	// Unit is a Grafana unit id (short, s, percentunit, ops, bytes).
	Unit string
	// Targets are the panel's queries.
	Targets []Target
}

// Target is one PromQL query of a panel.
type Target struct {
	// Expr is the PromQL expression, Legend Grafana's legend format.
	Expr, Legend string
}

// runbookURL is the operations guide the dashboards link to.
const runbookURL = "https://github.com/planex-dev/planex/blob/main/docs/operations.md"

// Dashboards are planex's Grafana dashboards. Their queries only use raw
// metrics (not the recording rules), so they work before the rules are
// installed.
var Dashboards = []Dashboard{
	{
		UID: "planex-overview", File: "planex-overview.json", Title: "planex / Overview",
		Description: "Runs, their success ratio, step latency, queues and refusals at a glance.",
		Panels: []Panel{
			{Title: "Runs started and finished", Unit: "ops", Targets: []Target{
				{`sum(rate(planex_runs_started_total[$__rate_interval]))`, "started"},
				{`sum by (status) (rate(planex_runs_finished_total[$__rate_interval]))`, "{{status}}"},
			}},
			{Title: "Run success ratio (refusals and cancellations excluded)", Unit: "percentunit",
				Description: "SLI: succeeded runs over runs that finished for another reason than a rejection or a cancellation.",
				Targets:     []Target{{`sum(rate(planex_runs_finished_total{status="RUN_STATUS_SUCCEEDED"}[$__rate_interval])) / sum(rate(planex_runs_finished_total{stop_reason!~"STOP_REASON_(REJECTED|CANCELLED)"}[$__rate_interval]))`, "success ratio"}}},
			{Title: "Step latency p95 by tool", Unit: "s", Targets: []Target{
				{`histogram_quantile(0.95, sum by (le, tool) (rate(planex_executor_step_duration_seconds_bucket[$__rate_interval])))`, "{{tool}}"},
			}},
			{Title: "Queue lag (pending messages)", Unit: "short", Targets: []Target{
				{`max by (stream, consumer) (planex_consumer_pending)`, "{{stream}}/{{consumer}}"},
			}},
			{Title: "Planner calls failing", Unit: "ops", Targets: []Target{
				{`sum by (outcome) (rate(planex_planner_call_duration_seconds_count{outcome="error"}[$__rate_interval]))`, "supervisor → planner"},
				{`sum by (planex_backend, outcome) (rate(planex_planner_duration_seconds_count{outcome=~"error_.*"}[$__rate_interval]))`, "{{planex_backend}} {{outcome}}"},
			}},
			{Title: "Step requests refused by executors", Unit: "short", Targets: []Target{
				{`sum by (reason) (increase(planex_executor_steps_refused_total[$__rate_interval]))`, "{{reason}}"},
			}},
		},
	},
	{
		UID: "planex-runs-gates", File: "planex-runs-gates.json", Title: "planex / Runs and gates",
		Description: "How runs end, replans, escalations, time to first step, gate waits against their SLA, stranded and lost work.",
		Panels: []Panel{
			{Title: "Runs finished by stop reason", Unit: "ops", Targets: []Target{
				{`sum by (stop_reason) (rate(planex_runs_finished_total[$__rate_interval]))`, "{{stop_reason}}"},
			}},
			{Title: "Replans by cause", Unit: "ops", Targets: []Target{
				{`sum by (cause) (rate(planex_replans_total[$__rate_interval]))`, "{{cause}}"},
			}},
			{Title: "Escalated share of finished runs", Unit: "percentunit", Targets: []Target{
				{`sum(rate(planex_runs_finished_total{status="RUN_STATUS_ESCALATED"}[$__rate_interval])) / sum(rate(planex_runs_finished_total[$__rate_interval]))`, "escalated"},
			}},
			{Title: "Time to first step p95", Unit: "s", Targets: []Target{
				{`histogram_quantile(0.95, sum by (le) (rate(planex_run_first_step_duration_seconds_bucket[$__rate_interval])))`, "p95"},
			}},
			{Title: "Gate wait p95 by kind", Unit: "s", Targets: []Target{
				{`histogram_quantile(0.95, sum by (le, kind) (rate(planex_gate_wait_duration_seconds_bucket[$__rate_interval])))`, "{{kind}}"},
			}},
			{Title: "Gates decided, by SLA", Unit: "short", Targets: []Target{
				{`sum by (within_sla) (increase(planex_gates_decided_total[$__rate_interval]))`, "within SLA: {{within_sla}}"},
			}},
			{Title: "Stranded runs re-driven by the sweeper", Unit: "short", Targets: []Target{
				{`sum by (cause) (increase(planex_runs_redriven_total[$__rate_interval]))`, "{{cause}}"},
			}},
			{Title: "Lost results and dropped engine messages", Unit: "ops", Targets: []Target{
				{`sum by (outcome) (rate(planex_steps_finished_total{outcome=~"ERROR_CODE_(TIMEOUT|MAX_DELIVERIES|OUTCOME_UNKNOWN)"}[$__rate_interval]))`, "{{outcome}}"},
				{`sum by (kind, reason) (rate(planex_engine_messages_dropped_total[$__rate_interval]))`, "engine {{kind}} dropped: {{reason}}"},
			}},
			{Title: "Engine messages by kind and outcome", Unit: "ops", Targets: []Target{
				{`sum by (kind, outcome) (rate(planex_engine_handle_duration_seconds_count[$__rate_interval]))`, "{{kind}} {{outcome}}"},
			}},
			{Title: "Engine handling p95 by kind", Unit: "s", Targets: []Target{
				{`histogram_quantile(0.95, sum by (le, kind) (rate(planex_engine_handle_duration_seconds_bucket[$__rate_interval])))`, "{{kind}}"},
			}},
		},
	},
	{
		UID: "planex-pools-queues", File: "planex-pools-queues.json", Title: "planex / Pools and queues",
		Description: "Executor pools: steps by outcome, latency, concurrency, backends, queue lag and redeliveries.",
		Panels: []Panel{
			{Title: "Steps dispatched by pool", Unit: "ops", Targets: []Target{
				{`sum by (pool) (rate(planex_steps_dispatched_total[$__rate_interval]))`, "{{pool}}"},
			}},
			{Title: "Step attempts finished by outcome", Unit: "ops", Targets: []Target{
				{`sum by (outcome) (rate(planex_steps_finished_total[$__rate_interval]))`, "{{outcome}}"},
			}},
			{Title: "Executor step latency by tool (p50, p95)", Unit: "s", Targets: []Target{
				{`histogram_quantile(0.5, sum by (le, tool) (rate(planex_executor_step_duration_seconds_bucket[$__rate_interval])))`, "p50 {{tool}}"},
				{`histogram_quantile(0.95, sum by (le, tool) (rate(planex_executor_step_duration_seconds_bucket[$__rate_interval])))`, "p95 {{tool}}"},
			}},
			{Title: "Executor steps by tool and outcome", Unit: "ops", Targets: []Target{
				{`sum by (tool, outcome) (rate(planex_executor_steps_total[$__rate_interval]))`, "{{tool}} {{outcome}}"},
			}},
			{Title: "Steps in flight by pool", Unit: "short", Targets: []Target{
				{`sum by (pool) (planex_executor_steps_in_flight)`, "{{pool}}"},
			}},
			{Title: "Pool backends up", Unit: "short", Targets: []Target{
				{`min by (pool) (planex_executor_backend_up)`, "{{pool}}"},
			}},
			{Title: "Queue lag (planex)", Unit: "short", Targets: []Target{
				{`max by (stream, consumer) (planex_consumer_pending)`, "{{stream}}/{{consumer}}"},
			}},
			{Title: "Consumer pending and redelivered (NATS exporter)", Unit: "short", Targets: []Target{
				{`max by (stream_name, consumer_name) (jetstream_consumer_num_pending{stream_name=~"PLANEX_.*"})`, "pending {{stream_name}}/{{consumer_name}}"},
				{`max by (stream_name, consumer_name) (jetstream_consumer_num_redelivered{stream_name=~"PLANEX_.*"})`, "redelivered {{stream_name}}/{{consumer_name}}"},
			}},
			{Title: "Step requests refused by reason", Unit: "short", Targets: []Target{
				{`sum by (reason) (increase(planex_executor_steps_refused_total[$__rate_interval]))`, "{{reason}}"},
			}},
		},
	},
	{
		UID: "planex-nats", File: "planex-nats.json", Title: "planex / NATS and JetStream",
		Description: "NATS health and quorum, stream usage against MaxBytes, consumer acknowledgements.",
		Panels: []Panel{
			{Title: "NATS /healthz ok", Unit: "short", Targets: []Target{
				{`max by (pod) (gnatsd_healthz_status_value)`, "{{pod}}"},
			}},
			{Title: "NATS servers ready / replicas", Unit: "short", Targets: []Target{
				{`sum(kube_statefulset_status_replicas_ready{statefulset=~"(.*-)?nats"})`, "ready"},
				{`sum(kube_statefulset_replicas{statefulset=~"(.*-)?nats"})`, "replicas"},
			}},
			{Title: "Stream usage of MaxBytes (planex)", Unit: "percentunit", Targets: []Target{
				{`max by (stream) (planex_jetstream_stream_usage_ratio)`, "{{stream}}"},
			}},
			{Title: "Stream bytes", Unit: "bytes", Targets: []Target{
				{`max by (stream_name) (jetstream_stream_total_bytes)`, "{{stream_name}}"},
			}},
			{Title: "Stream messages", Unit: "short", Targets: []Target{
				{`max by (stream_name) (jetstream_stream_total_messages)`, "{{stream_name}}"},
			}},
			{Title: "Consumer ack pending", Unit: "short", Targets: []Target{
				{`max by (stream_name, consumer_name) (jetstream_consumer_num_ack_pending)`, "{{stream_name}}/{{consumer_name}}"},
			}},
			{Title: "Connections and slow consumers", Unit: "short", Targets: []Target{
				{`sum(gnatsd_varz_connections)`, "connections"},
				{`sum(gnatsd_varz_slow_consumers)`, "slow consumers"},
			}},
			{Title: "Messages in and out", Unit: "ops", Targets: []Target{
				{`sum(rate(gnatsd_varz_in_msgs[$__rate_interval]))`, "in"},
				{`sum(rate(gnatsd_varz_out_msgs[$__rate_interval]))`, "out"},
			}},
		},
	},
	{
		UID: "planex-planner", File: "planex-planner.json", Title: "planex / Planner and model cost",
		Description: "Planner calls by backend and outcome, latency, tokens spent and tokens per run.",
		Panels: []Panel{
			{Title: "Planner calls by backend and outcome", Unit: "ops", Targets: []Target{
				{`sum by (planex_backend, outcome) (rate(planex_planner_duration_seconds_count[$__rate_interval]))`, "{{planex_backend}} {{outcome}}"},
			}},
			{Title: "Planner latency p95 by backend", Unit: "s", Targets: []Target{
				{`histogram_quantile(0.95, sum by (le, planex_backend) (rate(planex_planner_duration_seconds_bucket[$__rate_interval])))`, "{{planex_backend}}"},
				{`histogram_quantile(0.95, sum by (le) (rate(planex_planner_call_duration_seconds_bucket[$__rate_interval])))`, "as the supervisor sees it"},
			}},
			{Title: "Tokens spent by model and type", Unit: "short", Targets: []Target{
				{`sum by (planex_model, type) (rate(planex_planner_tokens_total{type!=""}[$__rate_interval]))`, "{{planex_model}} {{type}}"},
			}},
			{Title: "Tokens per finished run", Unit: "short", Targets: []Target{
				{`sum(rate(planex_planner_tokens_total{type!=""}[$__rate_interval])) / sum(rate(planex_runs_finished_total[$__rate_interval]))`, "tokens/run"},
			}},
			{Title: "Replans by cause", Unit: "ops", Targets: []Target{
				{`sum by (cause) (rate(planex_replans_total[$__rate_interval]))`, "{{cause}}"},
			}},
			{Title: "Planner calls failing (supervisor)", Unit: "percentunit", Targets: []Target{
				{`sum(rate(planex_planner_call_duration_seconds_count{outcome="error"}[$__rate_interval])) / sum(rate(planex_planner_call_duration_seconds_count[$__rate_interval]))`, "error ratio"},
			}},
		},
	},
}

// JSON renders d as a Grafana dashboard (schema 39) whose panels read a
// Prometheus data source chosen with the ${datasource} variable.
func (d Dashboard) JSON() ([]byte, error) {
	ds := map[string]any{"type": "prometheus", "uid": "${datasource}"}
	panels := make([]any, 0, len(d.Panels))
	for i, p := range d.Panels {
		if len(p.Targets) == 0 {
			return nil, fmt.Errorf("dashboard %s panel %q: no query", d.UID, p.Title)
		}
		targets := make([]any, 0, len(p.Targets))
		for j, t := range p.Targets {
			targets = append(targets, map[string]any{
				"refId": string(rune('A' + j)), "datasource": ds, "expr": t.Expr, "legendFormat": t.Legend, "range": true,
			})
		}
		unit := p.Unit
		if unit == "" {
			unit = "short"
		}
		panels = append(panels, map[string]any{
			"id": i + 1, "type": "timeseries", "title": p.Title, "description": p.Description, "datasource": ds,
			"gridPos": map[string]int{"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i / 2) * 8},
			"fieldConfig": map[string]any{
				"defaults":  map[string]any{"unit": unit, "custom": map[string]any{"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}},
				"overrides": []any{},
			},
			"options": map[string]any{
				"legend":  map[string]any{"displayMode": "list", "placement": "bottom", "showLegend": true},
				"tooltip": map[string]any{"mode": "multi", "sort": "desc"},
			},
			"targets": targets,
		})
	}
	out := map[string]any{
		"uid": d.UID, "title": d.Title, "description": d.Description, "tags": []string{"planex"},
		"editable": false, "schemaVersion": 39, "version": 1, "refresh": "30s", "timezone": "",
		"time":        map[string]string{"from": "now-6h", "to": "now"},
		"links":       []any{map[string]any{"title": "Runbooks (docs/operations.md)", "type": "link", "url": runbookURL, "targetBlank": true}},
		"templating":  map[string]any{"list": []any{map[string]any{"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "current": map[string]any{}, "hide": 0}}},
		"annotations": map[string]any{"list": []any{}},
		"panels":      panels,
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
