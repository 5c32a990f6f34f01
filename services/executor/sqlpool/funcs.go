package sqlpool

import (
	"fmt"
	"strings"
)

// Function policy on PostgreSQL.
//
// sql.query on PostgreSQL calls only functions of pgAllowedFuncs: pure
// computations (math, text, dates, JSON, arrays, aggregates, windows) and
// a few catalog readers. Anything else — a new or extension function, a
// user-defined one, one qualified with a schema other than pg_catalog — is
// refused, so a function that acts outside the read-only transaction
// (advisory locks, signals to other backends, files, dblink) cannot slip
// through a list that forgot it. Functions that run SQL handed to them as a
// string (query_to_xml and its family, ts_stat) are allowed only with a
// single string literal as that argument, and the literal is checked by the
// same policy.

// sqlStringFuncs run the SQL text of their first argument.
var sqlStringFuncs = map[string]bool{
	"query_to_xml": true, "query_to_xmlschema": true, "query_to_xml_and_xmlschema": true, "ts_stat": true,
}

// pgAllowedFuncs are the functions sql.query may call on PostgreSQL.
var pgAllowedFuncs = setOf(
	// aggregates
	"count", "sum", "avg", "min", "max", "array_agg", "string_agg", "json_agg", "jsonb_agg", "json_object_agg", "jsonb_object_agg",
	"bool_and", "bool_or", "every", "bit_and", "bit_or", "stddev", "stddev_pop", "stddev_samp", "variance", "var_pop", "var_samp",
	"corr", "covar_pop", "covar_samp", "regr_avgx", "regr_avgy", "regr_count", "regr_intercept", "regr_r2", "regr_slope",
	"regr_sxx", "regr_sxy", "regr_syy", "percentile_cont", "percentile_disc", "mode", "grouping", "any_value",
	// windows
	"row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile", "lag", "lead", "first_value", "last_value", "nth_value",
	// conditionals and syntax that looks like a call
	"coalesce", "nullif", "greatest", "least", "cast", "extract", "overlay", "position", "substring", "trim", "normalize", "collation",
	// math
	"abs", "ceil", "ceiling", "floor", "round", "trunc", "sign", "sqrt", "cbrt", "power", "pow", "exp", "ln", "log", "log10", "mod", "div",
	"pi", "degrees", "radians", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "width_bucket",
	"gcd", "lcm", "factorial", "scale", "min_scale", "trim_scale", "random", "numeric", "int", "int2", "int4", "int8", "float4", "float8",
	// text
	"length", "char_length", "character_length", "octet_length", "bit_length", "lower", "upper", "initcap", "btrim", "ltrim", "rtrim",
	"substr", "left", "right", "strpos", "replace", "translate", "concat", "concat_ws", "format", "lpad", "rpad", "repeat", "reverse",
	"split_part", "starts_with", "regexp_match", "regexp_matches", "regexp_replace", "regexp_split_to_array", "regexp_split_to_table",
	"regexp_count", "regexp_instr", "regexp_like", "regexp_substr", "md5", "sha224", "sha256", "sha384", "sha512", "encode", "decode",
	"to_hex", "ascii", "chr", "quote_ident", "quote_literal", "quote_nullable", "string_to_array", "string_to_table", "array_to_string",
	"to_char", "to_number", "to_date", "to_timestamp", "unistr", "text", "varchar", "char", "character", "bpchar",
	// dates and times
	"now", "date_trunc", "date_part", "date_bin", "age", "make_date", "make_time", "make_timestamp", "make_timestamptz", "make_interval",
	"justify_days", "justify_hours", "justify_interval", "clock_timestamp", "statement_timestamp", "transaction_timestamp", "timeofday",
	"isfinite", "date", "time", "timestamp", "timestamptz", "interval", "timezone",
	// JSON
	"to_json", "to_jsonb", "row_to_json", "array_to_json", "json_build_object", "jsonb_build_object", "json_build_array", "jsonb_build_array",
	"json_object", "jsonb_object", "json_array_length", "jsonb_array_length", "json_extract_path", "jsonb_extract_path",
	"json_extract_path_text", "jsonb_extract_path_text", "json_each", "jsonb_each", "json_each_text", "jsonb_each_text",
	"json_array_elements", "jsonb_array_elements", "json_array_elements_text", "jsonb_array_elements_text", "json_object_keys",
	"jsonb_object_keys", "json_typeof", "jsonb_typeof", "jsonb_set", "jsonb_insert", "jsonb_strip_nulls", "json_strip_nulls", "jsonb_pretty",
	"jsonb_path_query", "jsonb_path_query_array", "jsonb_path_query_first", "jsonb_path_exists", "jsonb_path_match",
	"json_populate_record", "jsonb_populate_record", "json_to_record", "jsonb_to_record", "json_to_recordset", "jsonb_to_recordset",
	// arrays and sets
	"array_length", "cardinality", "unnest", "array_position", "array_positions", "array_append", "array_prepend", "array_cat",
	"array_remove", "array_replace", "array_upper", "array_lower", "array_dims", "array_ndims", "generate_series", "generate_subscripts",
	// types with modifiers, catalog readers
	"decimal", "bit", "varbit", "float", "pg_typeof", "format_type", "current_setting", "current_database", "current_schema",
	"version", "pg_size_pretty", "pg_column_size", "pg_relation_size", "pg_table_size", "pg_total_relation_size", "pg_indexes_size",
	"obj_description", "col_description", "pg_get_viewdef", "has_table_privilege", "has_column_privilege", "has_schema_privilege",
	// XML functions that run SQL: their text is checked (sqlStringFuncs)
	"query_to_xml", "query_to_xmlschema", "query_to_xml_and_xmlschema",
)

// notCalls are words that may stand before "(" without calling a
// function.
var notCalls = setOf(
	"select", "from", "where", "and", "or", "not", "in", "exists", "any", "all", "some", "values", "as", "on", "using", "over",
	"filter", "within", "group", "by", "partition", "order", "lateral", "row", "array", "case", "when", "then", "else", "end",
	"between", "is", "like", "ilike", "similar", "distinct", "join", "union", "intersect", "except", "limit", "offset", "fetch",
	"with", "recursive", "materialized", "having", "window", "rows", "range", "groups", "tablesample", "only", "escape", "collate",
	"asc", "desc", "nulls", "first", "last", "for", "to", "table", "cube", "rollup", "sets", "overlaps", "at", "zone", "ordinality",
	"natural", "cross", "inner", "outer", "full", "preceding", "following", "unbounded", "current", "exclude", "ties", "others",
	"no", "both", "leading", "trailing", "returning", "null", "true", "false", "default", "precision", "varying", "without", "time",
	"search", "cycle", "set", "breadth", "depth", "returns", "into",
)

func setOf(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// funcCall is one function call of a statement.
type funcCall struct {
	name   string // lower case, without schema
	schema string // lower case qualifier, "" when unqualified
	open   int    // index of the "(" token
}

// calls returns the function calls of a statement: a bare word or quoted
// identifier (U&"..." decoded by the lexer) directly followed by "(",
// except keywords, CTE names with column lists and alias column lists.
func (s statement) calls() []funcCall {
	cte := cteNames(s.tokens)
	var out []funcCall
	for i, t := range s.tokens {
		if t.kind != tokWord && t.kind != tokIdent {
			continue
		}
		if i+1 >= len(s.tokens) || s.tokens[i+1].kind != tokPunct || s.tokens[i+1].text != "(" {
			continue
		}
		name := strings.ToLower(t.text)
		if t.kind == tokWord && notCalls[name] {
			continue
		}
		if cte[i] {
			continue
		}
		if i > 0 && s.tokens[i-1].kind == tokWord && strings.EqualFold(s.tokens[i-1].text, "as") && !isCastType(s.tokens, i) {
			continue // alias column list: AS g(n)
		}
		c := funcCall{name: name, open: i + 1}
		if i >= 2 && s.tokens[i-1].text == "." && (s.tokens[i-2].kind == tokWord || s.tokens[i-2].kind == tokIdent) {
			c.schema = strings.ToLower(s.tokens[i-2].text)
		}
		out = append(out, c)
	}
	return out
}

// isCastType reports whether the word at i is the type of CAST(x AS
// type(...)): the AS sits inside a CAST's parentheses.
func isCastType(toks []token, i int) bool {
	depth := 0
	for j := i - 1; j >= 0; j-- {
		switch toks[j].text {
		case ")":
			depth++
		case "(":
			if depth == 0 {
				return j > 0 && strings.EqualFold(toks[j-1].text, "cast")
			}
			depth--
		}
	}
	return false
}

// cteNames marks the tokens that name a CTE with a column list:
// WITH [RECURSIVE] name (cols) AS [NOT] [MATERIALIZED] (...), ...
func cteNames(toks []token) map[int]bool {
	out := map[int]bool{}
	for i, t := range toks {
		if t.kind != tokWord || !strings.EqualFold(t.text, "with") {
			continue
		}
		j := i + 1
		if j < len(toks) && strings.EqualFold(toks[j].text, "recursive") {
			j++
		}
		for j < len(toks) {
			if toks[j].kind != tokWord && toks[j].kind != tokIdent {
				break
			}
			name := j
			j++
			if j < len(toks) && toks[j].text == "(" {
				out[name] = true
				j = matching(toks, j) + 1
			}
			if j >= len(toks) || !strings.EqualFold(toks[j].text, "as") {
				break
			}
			j++
			for j < len(toks) && (strings.EqualFold(toks[j].text, "not") || strings.EqualFold(toks[j].text, "materialized")) {
				j++
			}
			if j >= len(toks) || toks[j].text != "(" {
				break
			}
			j = matching(toks, j) + 1
			if j >= len(toks) || toks[j].text != "," {
				break
			}
			j++
		}
	}
	return out
}

// matching returns the index of the ")" closing the "(" at open, or the
// last index when it is not closed.
func matching(toks []token, open int) int {
	depth := 0
	for j := open; j < len(toks); j++ {
		if toks[j].kind != tokPunct {
			continue
		}
		switch toks[j].text {
		case "(":
			depth++
		case ")":
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return len(toks) - 1
}

// maxNesting bounds SQL-in-a-string nesting (query_to_xml('select
// query_to_xml(”...”)')).
const maxNesting = 4

// checkPGFuncs applies the allowlist to a read-only PostgreSQL statement
// and checks the SQL text passed to SQL-running functions. It returns a
// message naming the function, or "".
func checkPGFuncs(st statement, depth int) string {
	for _, c := range st.calls() {
		qual := c.name
		if c.schema != "" {
			qual = c.schema + "." + c.name
		}
		if c.schema != "" && c.schema != "pg_catalog" {
			return fmt.Sprintf("function %s is not allowed: sql.query calls only built-in functions", qual)
		}
		if !pgAllowedFuncs[c.name] {
			return fmt.Sprintf("function %s is not on sql.query's list of read-only functions", qual)
		}
		if !sqlStringFuncs[c.name] {
			continue
		}
		// The SQL text must be one literal, so that it can be checked here.
		arg := c.open + 1
		if arg+1 >= len(st.tokens) || st.tokens[arg].kind != tokString || (st.tokens[arg+1].text != "," && st.tokens[arg+1].text != ")") {
			return fmt.Sprintf("function %s: its query must be a single string literal", qual)
		}
		if depth >= maxNesting {
			return fmt.Sprintf("function %s: queries nested too deep", qual)
		}
		inner, terr := checkQueryDepth(st.tokens[arg].value, dialectPostgres, depth+1)
		if terr != nil {
			return fmt.Sprintf("function %s: its query is refused: %s", qual, terr.Message)
		}
		_ = inner
	}
	return ""
}
