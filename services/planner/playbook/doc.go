// Package playbook is the planner's default backend: deterministic plans
// from YAML playbooks, with no model and no network. It is also planex's
// "hybrid automation" path: a known workflow is written once as a playbook
// and runs with the same engine, checks and audit trail as a model's plan.
//
// A playbook matches goals with regular expressions whose named captures
// bind parameters, and emits a DAG of steps whose arguments may use the
// parameters and, through CEL references the engine evaluates, the outputs
// of earlier steps:
//
//	name: open-tickets
//	description: Count the open support tickets of one customer
//	examples: ["How many open support tickets does Acme Corp have?"]
//	match:
//	  - '(?i)^how many open (?:support )?tickets does (?P<customer>.+?) have\??$'
//	params:
//	  customer: {required: true}
//	steps:
//	  - id: count
//	    tool: sql.query
//	    args:
//	      sql: SELECT count(*) FROM support_tickets t JOIN customers c ON c.id = t.customer_id WHERE c.name = ? AND t.status = 'open'
//	      params: ["${{ params.customer }}"]
//	    expect: output.row_count == 1
//	answer: params.customer + ' has ' + string(int(steps.count.output.rows[0][0])) + ' open tickets'
//	on_failure:
//	  - when: {step: count, code: EXPECTATION_FAILED}
//	    steps: [...]
//
// Parameters never reach the engine: "${{ params.x }}" in an argument and
// params.x in a CEL expression (answer, expect) are replaced by the planner.
// On a replan, the first on_failure branch whose condition matches the
// failure (and that was not used yet) replaces the unfinished part of the
// plan; completed steps are kept as they ran. In next-step mode the
// backend returns the steps whose dependencies completed, and stop with the
// final answer when every step completed.
//
// [Load] rejects a malformed playbook with "file:line: reason": bad YAML,
// unknown fields, bad regular expressions, captures not declared as
// parameters, unknown or cyclic dependencies, references to steps that are
// not dependencies, expressions that do not compile, examples that do not
// match. README.md in this directory is the full reference of the format;
// [DemoFS] holds the playbooks of the `planex dev` demo.
package playbook
