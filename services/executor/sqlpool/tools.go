package sqlpool

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/executor/runner"
)

// Version is reported in the tool specs.
const Version = "1"

// Column is a result column.
type Column struct {
	// Name of the column.
	Name string `json:"name"`
	// Type is the database type name ("INTEGER", "int8", "timestamptz").
	Type string `json:"type"`
}

// QueryOutput is the output of sql.query.
type QueryOutput struct {
	// Columns in result order.
	Columns []Column `json:"columns"`
	// Rows of JSON values, one per column.
	Rows [][]any `json:"rows"`
	// RowCount is len(Rows).
	RowCount int `json:"row_count"`
	// Truncated is true when the row cap or the output size cap cut rows.
	Truncated bool `json:"truncated"`
}

// Len implements runner.Truncatable.
func (q *QueryOutput) Len() int { return len(q.Rows) }

// Cut implements runner.Truncatable.
func (q *QueryOutput) Cut(n int) any {
	return &QueryOutput{Columns: q.Columns, Rows: q.Rows[:n], RowCount: n, Truncated: true}
}

// Table is one table (or view) of sql.schema.
type Table struct {
	// Name of the table.
	Name string `json:"name"`
	// Columns in declaration order.
	Columns []TableColumn `json:"columns"`
}

// TableColumn is a column of a table.
type TableColumn struct {
	// Name of the column.
	Name string `json:"name"`
	// Type is the declared type.
	Type string `json:"type"`
	// Nullable reports whether NULL is allowed.
	Nullable bool `json:"nullable"`
	// PrimaryKey reports whether the column is part of the primary key.
	PrimaryKey bool `json:"primary_key"`
}

// buildTools builds the pool's tools.
func (p *Pool) buildTools() ([]runner.Tool, error) {
	var b runner.SchemaBuilder
	tools := []runner.Tool{newSchemaTool(p, &b), newQueryTool(p, &b), newExecTool(p, &b)}
	return tools, b.Err
}

func (p *Pool) dbName() string {
	if p.db.system() == "postgresql" {
		return "PostgreSQL"
	}
	return "SQLite"
}

func (p *Pool) placeholder() string {
	if p.db.dialect() == dialectPostgres {
		return "$1, $2, ..."
	}
	return "?"
}

var paramsSchema = map[string]any{
	"type":        "array",
	"maxItems":    100,
	"items":       map[string]any{"type": []any{"string", "number", "boolean", "null"}},
	"description": "values bound to the statement's placeholders, in order",
}

// newSchemaTool is sql.schema.
func newSchemaTool(p *Pool, b *runner.SchemaBuilder) runner.Tool {
	return runner.NewTool(&planexv1.ToolSpec{
		Name:        "sql.schema",
		Pool:        "sql",
		Description: fmt.Sprintf("Lists the tables of the %s database with their columns (name, type, nullable, primary_key). Pass tables to describe only some.", p.dbName()),
		ArgsSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"tables": map[string]any{"type": "array", "maxItems": 100, "items": map[string]any{"type": "string", "minLength": 1, "maxLength": 128}},
			},
			"additionalProperties": false,
		}),
		OutputSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{"tables": map[string]any{"type": "array", "items": map[string]any{
				"type": "object",
				"properties": map[string]any{
					"name": map[string]any{"type": "string"},
					"columns": map[string]any{"type": "array", "items": map[string]any{"type": "object", "properties": map[string]any{
						"name": map[string]any{"type": "string"}, "type": map[string]any{"type": "string"},
						"nullable": map[string]any{"type": "boolean"}, "primary_key": map[string]any{"type": "boolean"},
					}}},
				},
			}}},
		}),
		SideEffect:     planexv1.SideEffect_SIDE_EFFECT_READ,
		DefaultTimeout: durationpb.New(p.cfg.StatementTimeout),
		Idempotent:     true,
		Version:        Version,
	}, p.runSchema)
}

func (p *Pool) runSchema(ctx context.Context, c runner.Call) (any, error) {
	ctx, span := p.span(ctx, "schema", nil)
	defer span.End()
	ctx, cancel := p.withTimeout(ctx)
	defer cancel()
	tables, err := p.db.schema(ctx)
	if err != nil {
		fail(span, err)
		return nil, p.db.classify(err, true)
	}
	var want []string
	for _, v := range c.Args.GetFields()["tables"].GetListValue().GetValues() {
		want = append(want, v.GetStringValue())
	}
	if len(want) > 0 {
		byName := make(map[string]Table, len(tables))
		for _, tb := range tables {
			byName[strings.ToLower(tb.Name)] = tb
		}
		picked := make([]Table, 0, len(want))
		for i, name := range want {
			tb, ok := byName[strings.ToLower(name)]
			if !ok {
				return nil, runner.InvalidArgument(fmt.Sprintf("args.tables[%d]", i), "no table named %q; the database has %s", name, tableNames(tables))
			}
			picked = append(picked, tb)
		}
		tables = picked
	}
	span.SetAttributes(attribute.Int("db.response.returned_rows", len(tables)))
	return map[string]any{"tables": tables}, nil
}

// tableRows is what the row iterators of both drivers offer.
type tableRows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// scanTables reads (table, column, type, nullable, primary key) rows
// ordered by table into tables.
func scanTables(rows tableRows) ([]Table, error) {
	var tables []Table
	for rows.Next() {
		var table string
		var c TableColumn
		if err := rows.Scan(&table, &c.Name, &c.Type, &c.Nullable, &c.PrimaryKey); err != nil {
			return nil, err
		}
		if len(tables) == 0 || tables[len(tables)-1].Name != table {
			tables = append(tables, Table{Name: table})
		}
		t := &tables[len(tables)-1]
		t.Columns = append(t.Columns, c)
	}
	return tables, rows.Err()
}

func tableNames(tables []Table) string {
	names := make([]string, 0, len(tables))
	for _, t := range tables {
		names = append(names, t.Name)
	}
	if len(names) == 0 {
		return "no tables"
	}
	if len(names) > 30 {
		names = append(names[:30], "...")
	}
	return strings.Join(names, ", ")
}

// statementTool runs one checked statement: sql.query (readOnly) or
// sql.exec.
type statementTool struct {
	p        *Pool
	spec     *planexv1.ToolSpec
	check    func(string, dialect) (statement, *runner.Error)
	readOnly bool
}

func newQueryTool(p *Pool, b *runner.SchemaBuilder) *statementTool {
	return &statementTool{p: p, check: checkQuery, readOnly: true, spec: &planexv1.ToolSpec{
		Name: "sql.query",
		Pool: "sql",
		Description: fmt.Sprintf("Runs one read-only SQL statement (SELECT, WITH ... SELECT or VALUES) against the %s database with bound parameters (placeholders %s) "+
			"and returns {columns: [{name, type}], rows: [[...]], row_count, truncated}. At most %d rows; writes are refused.", p.dbName(), p.placeholder(), p.cfg.MaxRows),
		ArgsSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"sql":      map[string]any{"type": "string", "minLength": 1, "maxLength": 100000, "description": "exactly one read-only statement"},
				"params":   paramsSchema,
				"max_rows": map[string]any{"type": "integer", "minimum": 1, "maximum": p.cfg.MaxRows},
			},
			"required":             []any{"sql"},
			"additionalProperties": false,
		}),
		OutputSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"columns": map[string]any{"type": "array", "items": map[string]any{"type": "object", "properties": map[string]any{
					"name": map[string]any{"type": "string"}, "type": map[string]any{"type": "string"},
				}}},
				"rows":      map[string]any{"type": "array", "items": map[string]any{"type": "array"}},
				"row_count": map[string]any{"type": "integer"},
				"truncated": map[string]any{"type": "boolean"},
			},
		}),
		SideEffect:     planexv1.SideEffect_SIDE_EFFECT_READ,
		DefaultTimeout: durationpb.New(p.cfg.StatementTimeout),
		Idempotent:     true,
		Version:        Version,
	}}
}

func newExecTool(p *Pool, b *runner.SchemaBuilder) *statementTool {
	return &statementTool{p: p, check: checkExec, spec: &planexv1.ToolSpec{
		Name: "sql.exec",
		Pool: "sql",
		Description: fmt.Sprintf("Runs one SQL statement that changes the %s database (INSERT, UPDATE, DELETE, CREATE, DROP, ALTER ...) with bound parameters (placeholders %s) "+
			"and returns {rows_affected}. Requires approval.", p.dbName(), p.placeholder()),
		ArgsSchema: b.Of(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"sql":    map[string]any{"type": "string", "minLength": 1, "maxLength": 100000, "description": "exactly one statement"},
				"params": paramsSchema,
			},
			"required":             []any{"sql"},
			"additionalProperties": false,
		}),
		OutputSchema: b.Of(map[string]any{
			"type":       "object",
			"properties": map[string]any{"rows_affected": map[string]any{"type": "integer"}},
		}),
		SideEffect:       planexv1.SideEffect_SIDE_EFFECT_WRITE,
		DefaultTimeout:   durationpb.New(p.cfg.StatementTimeout),
		RequiresApproval: true,
		Version:          Version,
	}}
}

func (t *statementTool) Spec() *planexv1.ToolSpec { return t.spec }

func (t *statementTool) Run(ctx context.Context, c runner.Call) (any, error) {
	f := c.Args.GetFields()
	text := f["sql"].GetStringValue()
	st, terr := t.check(text, t.p.db.dialect())
	if terr != nil {
		return nil, terr
	}
	text, err := st.bindFor(text, t.p.db.dialect())
	if err != nil {
		return nil, runner.InvalidArgument("args.sql", "%v", err)
	}
	params, terr := bindParams(f["params"])
	if terr != nil {
		return nil, terr
	}
	maxRows, terr := runner.IntArg(c.Args, "max_rows", t.p.cfg.MaxRows, 1, t.p.cfg.MaxRows)
	if terr != nil {
		return nil, terr
	}
	ctx, span := t.p.span(ctx, st.verb, &st)
	defer span.End()
	ctx, cancel := t.p.withTimeout(ctx)
	defer cancel()
	var out any
	if t.readOnly {
		var q *QueryOutput
		if q, err = t.p.db.query(ctx, text, params, maxRows); err == nil {
			span.SetAttributes(attribute.Int("db.response.returned_rows", q.RowCount), attribute.Bool("planex.truncated", q.Truncated))
			out = q
		}
	} else {
		var n int64
		if n, err = t.p.db.exec(ctx, text, params); err == nil {
			span.SetAttributes(attribute.Int64("db.response.affected_rows", n))
			out = map[string]any{"rows_affected": n}
		}
	}
	if err != nil {
		fail(span, err)
		return nil, t.p.db.classify(err, t.readOnly)
	}
	return out, nil
}

// bindParams converts JSON parameters to driver values: integral numbers
// become int64 so they compare and bind as integers.
func bindParams(v *structpb.Value) ([]any, *runner.Error) {
	list := v.GetListValue().GetValues()
	out := make([]any, len(list))
	for i, p := range list {
		switch k := p.GetKind().(type) {
		case *structpb.Value_NullValue:
			out[i] = nil
		case *structpb.Value_BoolValue:
			out[i] = k.BoolValue
		case *structpb.Value_StringValue:
			out[i] = k.StringValue
		case *structpb.Value_NumberValue:
			n := k.NumberValue
			if n == math.Trunc(n) && math.Abs(n) <= 1<<53 {
				out[i] = int64(n)
			} else {
				out[i] = n
			}
		default:
			return nil, runner.InvalidArgument(fmt.Sprintf("args.params[%d]", i), "want a string, number, boolean or null, got %s", jsonKind(p))
		}
	}
	return out, nil
}

func jsonKind(v *structpb.Value) string {
	switch v.GetKind().(type) {
	case *structpb.Value_StructValue:
		return "an object"
	case *structpb.Value_ListValue:
		return "an array"
	}
	return "an unsupported value"
}

// Statement policy: which statements each tool accepts.
var (
	queryVerbs = map[dialect][]string{
		dialectSQLite:   {"SELECT", "WITH", "VALUES"},
		dialectPostgres: {"SELECT", "WITH", "VALUES", "TABLE"},
	}
	execVerbs = map[dialect][]string{
		dialectSQLite:   {"INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER", "WITH"},
		dialectPostgres: {"INSERT", "UPDATE", "DELETE", "MERGE", "CREATE", "DROP", "ALTER", "TRUNCATE", "WITH"},
	}
	// writeWords may not appear anywhere in a read-only statement.
	writeWords = []string{"insert", "update", "delete", "merge", "upsert", "drop", "create", "alter", "truncate",
		"grant", "revoke", "attach", "detach", "pragma", "vacuum", "reindex", "copy", "into"}
	// serverWords reach the server's file system or configuration; no tool
	// accepts them.
	serverWords = []string{"attach", "detach", "pragma", "vacuum", "copy"}
	// deniedFuncs act on the server (settings, locks, files, other
	// databases); neither tool accepts them. Prefixes end with '_' or are
	// whole families (dblink).
	deniedFuncs    = []string{"set_config", "pg_notify", "pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf", "pg_rotate_logfile", "pg_switch_wal", "pg_promote", "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "nextval", "setval", "load_extension", "readfile", "writefile", "fts3_tokenizer"}
	deniedPrefixes = []string{"pg_advisory_", "pg_try_advisory_", "pg_create_", "pg_drop_", "pg_replication_", "pg_logical_", "lo_", "dblink",
		"cursor_to_xml", "pg_read_", "pg_ls_", "pg_file_", "pg_stat_file"}
)

// checkQuery applies the read-only policy to an sql.query statement.
func checkQuery(text string, d dialect) (statement, *runner.Error) {
	return checkQueryDepth(text, d, 0)
}

// checkQueryDepth is checkQuery of a statement nested depth levels deep in
// SQL-running functions' string arguments.
func checkQueryDepth(text string, d dialect, depth int) (statement, *runner.Error) {
	st, err := parseOne(text, d)
	if err != nil {
		return st, runner.InvalidArgument("args.sql", "%v", err)
	}
	if !slices.Contains(queryVerbs[d], st.verb) {
		return st, runner.PermissionDenied("args.sql", "sql.query is read-only and runs only %s statements, got %s; use sql.exec to change data",
			strings.Join(queryVerbs[d], ", "), st.verb)
	}
	for _, w := range st.words() {
		if slices.Contains(writeWords, w) {
			return st, runner.PermissionDenied("args.sql", "sql.query is read-only: the statement contains %s; use sql.exec to change data (quote identifiers named like keywords)",
				strings.ToUpper(w))
		}
	}
	if f := deniedFunc(st); f != "" {
		return st, runner.PermissionDenied("args.sql", "function %s is not allowed", f)
	}
	if d == dialectPostgres {
		if msg := checkPGFuncs(st, depth); msg != "" {
			return st, runner.PermissionDenied("args.sql", "%s", msg)
		}
	}
	return st, nil
}

// checkExec applies the write policy to an sql.exec statement.
func checkExec(text string, d dialect) (statement, *runner.Error) {
	st, err := parseOne(text, d)
	if err != nil {
		return st, runner.InvalidArgument("args.sql", "%v", err)
	}
	if !slices.Contains(execVerbs[d], st.verb) {
		return st, runner.PermissionDenied("args.sql", "sql.exec runs only %s statements, got %s", strings.Join(execVerbs[d], ", "), st.verb)
	}
	for _, w := range st.words() {
		if slices.Contains(serverWords, w) {
			return st, runner.PermissionDenied("args.sql", "%s is not allowed", strings.ToUpper(w))
		}
	}
	for _, c := range st.calls() {
		if sqlStringFuncs[c.name] {
			return st, runner.PermissionDenied("args.sql", "function %s is not allowed in sql.exec (it runs SQL passed as a string)", c.name)
		}
	}
	if f := deniedFunc(st); f != "" {
		return st, runner.PermissionDenied("args.sql", "function %s is not allowed", f)
	}
	return st, nil
}

// deniedFunc returns the first denied function the statement calls (the
// blocklist, applied on both backends and by sql.exec; sql.query on
// PostgreSQL also applies the allowlist of checkPGFuncs).
func deniedFunc(st statement) string {
	for i, t := range st.tokens {
		if t.kind != tokWord && t.kind != tokIdent {
			continue
		}
		if i+1 >= len(st.tokens) || st.tokens[i+1].text != "(" {
			continue
		}
		name := strings.ToLower(t.text)
		if slices.Contains(deniedFuncs, name) {
			return name
		}
		for _, p := range deniedPrefixes {
			if strings.HasPrefix(name, p) {
				return name
			}
		}
	}
	return ""
}
