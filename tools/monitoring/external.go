package monitoring

// Source says where a metric the rules or dashboards use comes from when
// the planex workload of the tests cannot show it.
type Source struct {
	// From names the exporter (and its flag), or the code that emits it.
	From string
	// Why the test's scrape of planex dev cannot see it.
	Why string
}

// External are the metrics of other exporters the rules and dashboards
// read. Their names are checked against each exporter's source, not
// scraped: the test has no Kubernetes and no NATS exporter.
var External = map[string]Source{
	// prometheus-nats-exporter 0.17.3 (natsio/prometheus-nats-exporter,
	// the NATS pods' "metrics" sidecar, args -varz -connz -routez -subz
	// -healthz -jsz=all): collector/healthz.go, collector/jsz.go, and
	// for -varz the JSON keys of nats-server's /varz under gnatsd_varz_.
	"gnatsd_healthz_status_value":        {From: "prometheus-nats-exporter -healthz (1 when /healthz says ok; label value=ok|unreachable|error)"},
	"gnatsd_varz_connections":            {From: "prometheus-nats-exporter -varz (/varz connections)"},
	"gnatsd_varz_slow_consumers":         {From: "prometheus-nats-exporter -varz (/varz slow_consumers)"},
	"gnatsd_varz_in_msgs":                {From: "prometheus-nats-exporter -varz (/varz in_msgs)"},
	"gnatsd_varz_out_msgs":               {From: "prometheus-nats-exporter -varz (/varz out_msgs)"},
	"jetstream_server_total_streams":     {From: "prometheus-nats-exporter -jsz (server labels include meta_leader, is_meta_leader)"},
	"jetstream_stream_total_bytes":       {From: "prometheus-nats-exporter -jsz=all (label stream_name)"},
	"jetstream_stream_total_messages":    {From: "prometheus-nats-exporter -jsz=all (label stream_name)"},
	"jetstream_consumer_num_pending":     {From: "prometheus-nats-exporter -jsz=all (labels stream_name, consumer_name)"},
	"jetstream_consumer_num_ack_pending": {From: "prometheus-nats-exporter -jsz=all (labels stream_name, consumer_name)"},
	"jetstream_consumer_num_redelivered": {From: "prometheus-nats-exporter -jsz=all (labels stream_name, consumer_name)"},
	// kube-state-metrics (kube-prometheus-stack installs it).
	"kube_pod_status_ready":                  {From: "kube-state-metrics (labels namespace, pod, condition)"},
	"kube_statefulset_status_replicas_ready": {From: "kube-state-metrics (labels namespace, statefulset)"},
	"kube_statefulset_replicas":              {From: "kube-state-metrics (labels namespace, statefulset)"},
	// Prometheus itself, for every target it scrapes.
	"up": {From: "Prometheus (1 when the last scrape of the target succeeded; PodMonitor jobs are <namespace>/<podmonitor>)"},
}

// EventOnly are metrics planex emits only after an event the test's dev
// workload does not cause. The test checks that the code still declares
// each (its OpenTelemetry instrument name is in a non-test Go file).
var EventOnly = map[string]Source{
	"planex_runs_corrupt_total": {From: `services/supervisor/runlog/corrupt.go "planex.runs.corrupt"`,
		Why: "counted when a run log holds an entry that is not an event or breaks the hash chain; services/supervisor/corrupt_test.go covers it"},
	"planex_runs_redriven_total": {From: `services/supervisor/engine/sweep.go "planex.runs.redriven"`,
		Why: "counted when the sweeper re-drives a stranded run; the dev workload strands none (and the dev sweeper runs every minute); services/supervisor/metrics_test.go and engine/metrics_test.go cover it"},
	"planex_consumers_remade_total": {From: `internal/bus/consume.go "planex.consumers.remade"`,
		Why: "counted when a service makes again a durable consumer the server deleted; the dev workload deletes none; internal/bus/consume_test.go covers it"},
	"planex_planner_tokens_total": {From: `services/planner/server.go "planex.planner.tokens"`,
		Why: "only model backends (openai, anthropic) spend tokens; the dev stack plans with the demo playbooks, which spend none"},
}

// Pending are metrics the rules and dashboards are written for but the
// code does not emit yet: their alerts and panels stay empty until it
// does. The test fails once one is emitted, so that it moves out of this
// list and is checked like the others. Empty: every metric the rules and
// panels read is emitted, external or event-only.
var Pending = map[string]Source{}
