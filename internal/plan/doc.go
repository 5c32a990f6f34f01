// Package plan is the plan model shared by the supervisor engine and the
// planner service: it validates a [planexv1.Plan] before anything runs,
// evaluates the CEL expressions a plan carries, and answers the DAG
// questions the engine asks on every step.
//
// # References
//
// A string argument of a step may refer to values known only while the run
// executes. A reference is a CEL expression between "${{" and "}}":
//
//	{"query": "${{ inputs.query }}"}                        whole-string reference
//	{"ids":   "${{ steps.find.output.rows.map(r, r.id) }}"} whole-string reference
//	{"subject": "Report for ${{ goal }}"}                    interpolation
//
// A string that is exactly one reference (no text before or after it) is
// replaced by the expression's value with its JSON type: a list stays a list,
// a map an object, an int an integral number. A reference inside a longer
// string is interpolated as text: strings as they are, every other value as
// compact JSON. Objects and lists are searched recursively; object keys are
// never evaluated. A "}}" that closes a map literal or sits inside a string
// literal does not end the reference. There is no escape for a literal "${{".
//
// Expressions see three variables:
//
//	goal    string                   the run's goal
//	inputs  map(string, dyn)         the run's inputs
//	steps   map(string, dyn)         steps.<id>.output is the output of step <id>
//
// A step may only use steps.<id>.output (or steps["<id>"].output) where <id>
// is one of its transitive dependencies; [Validate] rejects anything else,
// because the output of any other step may not exist when the step runs. The
// plan's answer expression sees the same variables and may use every step.
// A step's expect expression instead sees `output` (the step's output) and
// `args` (its resolved arguments) and must yield a bool.
//
// Outputs are JSON values, so numbers that came through JSON or
// google.protobuf.Struct are doubles; comparisons between ints and doubles
// work (steps.count.output.n > 0), arithmetic needs matching types
// (int(steps.count.output.n) + 1).
//
// Besides the CEL standard library, expressions may use the strings,
// encoders (base64), math, lists and sets extensions and optional values
// (steps.a.output.?rows.orValue([])). Evaluation is bounded by a cost limit.
//
// # Caching
//
// Compiled CEL programs and compiled JSON Schemas are cached in bounded,
// concurrency-safe caches, so validating a plan warms the programs its run
// will evaluate. Tool specs and their schemas are treated as immutable once
// they are handed to this package.
package plan
