// Package monitoring holds planex's dashboards (defined in Go, written as
// Grafana JSON) and the tests that keep the alerting rules and the
// dashboards honest: every PromQL expression parses, every metric it
// names is emitted by planex (scraped from a real `planex dev` running a
// workload) or is a documented external metric, every alert has a
// severity, a `for:` and a runbook section, and the copies of the rules
// and dashboards in the kustomize components and the Helm chart match
// their source in deploy/monitoring.
//
//	go test ./...                          check (what CI runs)
//	go test -run TestGenerated -update     rewrite the copies after editing the source
//	go test -run TestDashboardImages -update-images
//	                                       render docs/img/dashboards/*.png from the
//	                                       dashboards' queries over a dev workload
package monitoring
