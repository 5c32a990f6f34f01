// Package demo generates the demo domain that `planex dev` lays into its data
// directory on first start, so that a fresh checkout can run realistic goals
// end to end without any external system.
//
// The domain is a small, fictional company seen from three sides, one per
// executor pool:
//
//   - GenerateDB writes a SQLite database (tables customers, orders,
//     invoices, support_tickets and meta) for the "sql" pool. The data is
//     produced by code from a fixed random seed, so every machine gets the
//     same rows and the same answers; the demo's notion of "today" is AsOf.
//     orders deliberately has no region column: region lives only on
//     customers, which is what the replanning scenario relies on (a first
//     plan that queries orders.region fails, the replan reads the schema and
//     joins customers).
//   - Runbooks returns the markdown runbooks and policies the "search" pool
//     indexes, among them "runbook-failed-payment-retries".
//   - AccountTeam, Oncall, Finance, AllowedDomains and TeamAddress name the
//     mailboxes the "email" pool may write to; all of them live under the
//     reserved domain example.com, so nothing can reach a real person.
//
// Nothing here reads the clock or the network: two calls produce the same
// domain, which keeps demo playbooks and tests stable.
package demo
