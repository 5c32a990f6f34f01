package playbook

import "embed"

// DemoFS holds the playbooks of the `planex dev` demo under demo/*.yaml:
// open support tickets of a customer, top customers by revenue by email, a
// runbook by email, comparing two customers, and average order value by
// region (whose first plan fails on purpose and is repaired by an
// on_failure branch). Load them with Load(Source{FS: DemoFS, Name:
// "builtin"}).
//
//go:embed demo/*.yaml
var DemoFS embed.FS
