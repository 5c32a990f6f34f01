package sqlpool

import (
	"strings"
	"testing"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

func TestCheckQueryPostgresAllowlist(t *testing.T) {
	accepted := []string{
		"SELECT count(*), max(score), avg(amount) FROM t",
		"WITH x(a) AS (SELECT 1) SELECT a FROM x",
		"WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3), s AS (SELECT 2) SELECT * FROM r, s",
		"SELECT * FROM generate_series(1, 3) AS g(n)",
		"SELECT * FROM (VALUES (1, 'a')) AS v(id, name)",
		"SELECT CAST(amount AS numeric(10,2)), amount::numeric(10, 2), name::varchar(20) FROM t",
		"SELECT extract(year FROM created), date_trunc('month', created) FROM t",
		"SELECT name FROM t WHERE id IN (1, 2) AND EXISTS (SELECT 1) AND NOT (active)",
		"SELECT row_number() OVER (PARTITION BY active ORDER BY id), lag(score) OVER w FROM t WINDOW w AS (ORDER BY id)",
		"SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY score) FILTER (WHERE active) FROM t",
		"SELECT pg_catalog.lower(name), coalesce(note, '') FROM t",
		"SELECT query_to_xml('select id, name from t', true, false, '')",
		"SELECT query_to_xml($$select 1$$, true, false, '')",
		"SELECT current_setting('statement_timeout')",
		"SELECT jsonb_build_object('a', 1) -> 'a', ARRAY(SELECT id FROM t), ROW(1, 2)",
		`SELECT U&"na\006de" FROM t`,
		"SELECT 'pg_read_file(''/etc/passwd'')' AS harmless_text",
	}
	for _, q := range accepted {
		t.Run("accept/"+q, func(t *testing.T) {
			if _, terr := checkQuery(q, dialectPostgres); terr != nil {
				t.Fatalf("checkQuery(%q) = %v, want accepted", q, terr)
			}
		})
	}
	refused := []struct{ sql, want string }{
		{"SELECT pg_sleep(1)", "pg_sleep"},
		{"SELECT my_function(1)", "my_function"},
		{"SELECT evil.lower(name) FROM t", "evil.lower"},
		{`SELECT "pg_terminate_backend"(1)`, "pg_terminate_backend"},
		{`SELECT U&"pg\005fread\005ffile"('/etc/passwd')`, "pg_read_file"},
		{`SELECT U&"pg!005fread!005ffile" UESCAPE '!' ('/etc/passwd')`, "pg_read_file"},
		{`SELECT U&"pg\+00005fsleep"(1)`, "pg_sleep"},
		{"SELECT query_to_xml('select pg_advisory_lock(4243)', true, false, '')", "pg_advisory_lock"},
		{"SELECT query_to_xml('select pg_terminate_backend(1)', true, false, '')", "pg_terminate_backend"},
		{"SELECT query_to_xml(E'select pg_advisory_lock(1)', true, false, '')", "pg_advisory_lock"},
		{`SELECT query_to_xml(E'select pg\x5fadvisory\x5flock(1)', true, false, '')`, "pg_advisory_lock"},
		{`SELECT query_to_xml(U&'select pg\005fsleep(1)', true, false, '')`, "pg_sleep"},
		{"SELECT query_to_xml($x$select pg_advisory_lock(1)$x$, true, false, '')", "pg_advisory_lock"},
		{"SELECT query_to_xml('select query_to_xml(''select pg_advisory_lock(1)'', true, false, '''')', true, false, '')", "pg_advisory_lock"},
		{"SELECT query_to_xml('select ' || 'pg_sleep(1)', true, false, '')", "single string literal"},
		{"SELECT query_to_xml($1, true, false, '')", "single string literal"},
		{"SELECT query_to_xml(name, true, false, '') FROM t", "single string literal"},
		{"SELECT query_to_xml('delete from t', true, false, '')", "DELETE"},
		{"SELECT query_to_xml('select dblink_exec(''dbname=x'', ''insert into t values (1)'')', true, false, '')", "dblink_exec"},
		{"SELECT ts_stat('select pg_advisory_lock(1)')", "ts_stat"},
		{"SELECT table_to_xml('t', true, false, '')", "table_to_xml"},
		{"SELECT xmlparse(document '<a/>')", "xmlparse"},
		{"SELECT * FROM t WHERE 1 OPERATOR(pg_catalog.=) 1", "operator"},
		{"SELECT lo_import('/etc/passwd')", "lo_import"},
	}
	for _, tt := range refused {
		t.Run("refuse/"+tt.sql, func(t *testing.T) {
			_, terr := checkQuery(tt.sql, dialectPostgres)
			if terr == nil {
				t.Fatalf("checkQuery(%q) accepted it", tt.sql)
			}
			if terr.Field != "args.sql" || terr.Code != planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED {
				t.Fatalf("checkQuery(%q) = %v (code %v, field %q), want PERMISSION_DENIED on args.sql", tt.sql, terr, terr.Code, terr.Field)
			}
			if !strings.Contains(terr.Message, tt.want) {
				t.Fatalf("checkQuery(%q) = %q, want it to name %q", tt.sql, terr.Message, tt.want)
			}
		})
	}
}

func TestCheckExecRefusesSQLInStrings(t *testing.T) {
	for _, q := range []string{
		"INSERT INTO t (id, name) SELECT 1, query_to_xml('select pg_advisory_lock(1)', true, false, '')::text",
		`UPDATE t SET name = U&"pg\005fread\005ffile"('/etc/passwd')`,
		"INSERT INTO t (id, name) VALUES (1, dblink_exec('x', 'y'))",
	} {
		if _, terr := checkExec(q, dialectPostgres); terr == nil || terr.Code != planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED {
			t.Errorf("checkExec(%q) = %v, want PERMISSION_DENIED", q, terr)
		}
	}
	if _, terr := checkExec("CREATE TABLE x (id integer, name varchar(20), amount numeric(10,2))", dialectPostgres); terr != nil {
		t.Fatalf("checkExec refused a plain CREATE TABLE: %v", terr)
	}
}

func TestUnicodeEscapes(t *testing.T) {
	tests := []struct {
		sql, want, wantErr string
	}{
		{sql: `SELECT U&"d\0061t\+000061"`, want: "data"},
		{sql: `SELECT U&"a\\b"`, want: `a\b`},
		{sql: `SELECT u&"x!0041" UESCAPE '!'`, want: "xA"},
		{sql: `SELECT U&"\D83D\DE00"`, want: "\U0001F600"},
		{sql: `SELECT U&"\zzzz"`, wantErr: "Unicode escape"},
		{sql: `SELECT U&"\D83D"`, wantErr: "surrogate"},
		{sql: `SELECT U&"x" UESCAPE 'a'`, wantErr: "UESCAPE"},
	}
	for _, tt := range tests {
		t.Run(tt.sql, func(t *testing.T) {
			toks, err := lex(tt.sql, dialectPostgres)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("lex(%q) error %v, want %q", tt.sql, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(toks) != 2 || toks[1].kind != tokIdent || toks[1].text != tt.want {
				t.Fatalf("lex(%q) = %+v, want identifier %q", tt.sql, toks, tt.want)
			}
		})
	}
	if got := unescapeE(`a\'b\n\x41\101\u00e9\\`); got != "a'b\nAA\u00e9\\" {
		t.Fatalf("unescapeE = %q", got)
	}
}
