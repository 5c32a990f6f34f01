package sqlpool

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/executor/runner"
	"github.com/planex-dev/planex/services/executor/runner/runnertest"
)

// fixture is one backend with a seeded table t.
type fixture struct {
	name string
	pool *Pool
	dir  string
	// admin runs SQL with full rights, outside the pool under test.
	admin func(t testing.TB, sql string) [][]any
}

const seedRows = 5

// sqliteFixture creates a database file in t.TempDir.
func sqliteFixture(t testing.TB, cfg Config) *fixture {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "test.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	stmts := []string{`CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL, score REAL, active BOOLEAN,
		created DATETIME, data BLOB, note TEXT, amount NUMERIC, day DATE)`}
	for i := 1; i <= seedRows; i++ {
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO t VALUES (%d, 'name-%d', %d.5, %v, '2024-05-0%dT10:00:00Z', x'0102', NULL, %d2.5, '2024-05-0%d')`,
			i, i, i, i%2 == 1, i, i, i))
	}
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	cfg.DSN = "sqlite://" + path
	p, err := Open(runnertest.Context(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return &fixture{name: "sqlite", pool: p, dir: dir, admin: func(t testing.TB, q string) [][]any { return adminQuery(t, db, q) }}
}

func adminQuery(t testing.TB, db *sql.DB, q string) [][]any {
	t.Helper()
	rows, err := db.Query(q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out [][]any
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		out = append(out, vals)
	}
	return out
}

// postgresFixture creates its own schema in database test and drops it
// when the test ends.
func postgresFixture(t testing.TB, cfg Config) *fixture {
	t.Helper()
	dsn := os.Getenv("PLANEX_TEST_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	ctx := runnertest.Context(t)
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	admin, err := pgx.Connect(cctx, dsn)
	cancel()
	if err != nil {
		t.Skipf("PostgreSQL not reachable at %s (set PLANEX_TEST_POSTGRES_DSN): %v", redactDSN(dsn), err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	schema := "planex_test_" + hex.EncodeToString(suffix[:])
	stmts := []string{
		"CREATE SCHEMA " + schema,
		"SET search_path TO " + schema,
		`CREATE TABLE t (id integer PRIMARY KEY, name text NOT NULL, score double precision, active boolean,
			created timestamptz, data bytea, note text, amount numeric(10,2), day date)`,
	}
	for i := 1; i <= seedRows; i++ {
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO t VALUES (%d, 'name-%d', %d.5, %v, '2024-05-0%dT10:00:00Z', '\x0102', NULL, %d2.5, '2024-05-0%d')`,
			i, i, i, i%2 == 1, i, i, i))
	}
	for _, s := range stmts {
		if _, err := admin.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop test schema %s: %v", schema, err)
		}
	})
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	cfg.DSN = dsn + sep + "search_path=" + schema
	cfg.AllowPrivilegedRole = true // the test server's superuser
	p, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return &fixture{name: "postgres", pool: p, dir: t.TempDir(), admin: func(t testing.TB, q string) [][]any {
		t.Helper()
		rows, err := admin.Query(ctx, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rows.Close()
		var out [][]any
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, vals)
		}
		return out
	}}
}

// eachBackend runs f against SQLite and PostgreSQL.
func eachBackend(t *testing.T, cfg Config, f func(t *testing.T, fx *fixture)) {
	t.Run("sqlite", func(t *testing.T) { f(t, sqliteFixture(t, cfg)) })
	t.Run("postgres", func(t *testing.T) { f(t, postgresFixture(t, cfg)) })
}

// call runs a tool of the pool the way the runner does.
func call(t testing.TB, p *Pool, tool string, args map[string]any) (any, *runner.Error) {
	t.Helper()
	return runnertest.Call(t, p.Tools(), tool, runner.Call{}, args)
}

func TestQueryPreservesTypes(t *testing.T) {
	eachBackend(t, Config{}, func(t *testing.T, fx *fixture) {
		out, terr := call(t, fx.pool, "sql.query", map[string]any{"sql": "SELECT id, name, score, active, created, data, note, amount, day FROM t WHERE id = 1"})
		if terr != nil {
			t.Fatal(terr)
		}
		q := out.(*QueryOutput)
		want := []any{int64(1), "name-1", 1.5, true, "2024-05-01T10:00:00Z", "AQI=", nil, 12.5, "2024-05-01"}
		if len(q.Rows) != 1 || !reflect.DeepEqual(q.Rows[0], want) {
			t.Fatalf("row %#v, want %#v", q.Rows, want)
		}
		names := make([]string, len(q.Columns))
		for i, c := range q.Columns {
			names[i] = c.Name
			if c.Type == "" {
				t.Errorf("column %s has no type", c.Name)
			}
		}
		if got := strings.Join(names, ","); got != "id,name,score,active,created,data,note,amount,day" {
			t.Fatalf("columns %s", got)
		}
		if q.RowCount != 1 || q.Truncated {
			t.Fatalf("row_count %d truncated %v", q.RowCount, q.Truncated)
		}
		// Expressions are typed too.
		out, terr = call(t, fx.pool, "sql.query", map[string]any{"sql": "SELECT count(*) AS n, 2.5 AS f, NULL AS z FROM t"})
		if terr != nil {
			t.Fatal(terr)
		}
		if row := out.(*QueryOutput).Rows[0]; row[0] != int64(seedRows) || row[1] != 2.5 || row[2] != nil {
			t.Fatalf("expression row %#v", row)
		}
	})
}

func TestQueryBindsParameters(t *testing.T) {
	eachBackend(t, Config{}, func(t *testing.T, fx *fixture) {
		ph := func(i int) string {
			if fx.name == "postgres" {
				return fmt.Sprintf("$%d", i)
			}
			return "?"
		}
		tests := []struct {
			name   string
			sql    string
			params []any
			want   int
		}{
			{name: "int", sql: "SELECT name FROM t WHERE id = " + ph(1), params: []any{2}, want: 1},
			{name: "string and bool", sql: "SELECT name FROM t WHERE name = " + ph(1) + " AND active = " + ph(2), params: []any{"name-3", true}, want: 1},
			{name: "injection stays a value", sql: "SELECT name FROM t WHERE name = " + ph(1), params: []any{"x' OR '1'='1"}, want: 0},
			{name: "float", sql: "SELECT name FROM t WHERE score > " + ph(1), params: []any{3.25}, want: 3},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				out, terr := call(t, fx.pool, "sql.query", map[string]any{"sql": tt.sql, "params": tt.params})
				if terr != nil {
					t.Fatal(terr)
				}
				if n := out.(*QueryOutput).RowCount; n != tt.want {
					t.Fatalf("%d rows, want %d", n, tt.want)
				}
			})
		}
	})
}

func TestQueryRowCap(t *testing.T) {
	eachBackend(t, Config{MaxRows: 3}, func(t *testing.T, fx *fixture) {
		tests := []struct {
			name      string
			args      map[string]any
			rows      int
			truncated bool
			field     string
		}{
			{name: "pool cap", args: map[string]any{"sql": "SELECT id FROM t ORDER BY id"}, rows: 3, truncated: true},
			{name: "per call", args: map[string]any{"sql": "SELECT id FROM t ORDER BY id", "max_rows": 2}, rows: 2, truncated: true},
			{name: "under cap", args: map[string]any{"sql": "SELECT id FROM t WHERE id <= 2"}, rows: 2},
			{name: "above cap", args: map[string]any{"sql": "SELECT id FROM t", "max_rows": 10}, field: "args.max_rows"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				out, terr := call(t, fx.pool, "sql.query", tt.args)
				if tt.field != "" {
					if terr == nil || terr.Field != tt.field || terr.Code != planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT {
						t.Fatalf("error %v, want INVALID_ARGUMENT on %s", terr, tt.field)
					}
					return
				}
				if terr != nil {
					t.Fatal(terr)
				}
				q := out.(*QueryOutput)
				if len(q.Rows) != tt.rows || q.RowCount != tt.rows || q.Truncated != tt.truncated {
					t.Fatalf("%d rows (row_count %d) truncated %v, want %d truncated %v", len(q.Rows), q.RowCount, q.Truncated, tt.rows, tt.truncated)
				}
				if q.Rows[0][0] != int64(1) {
					t.Fatalf("first row %v", q.Rows[0])
				}
			})
		}
	})
}

func TestQueryTimeout(t *testing.T) {
	eachBackend(t, Config{StatementTimeout: 300 * time.Millisecond}, func(t *testing.T, fx *fixture) {
		slow := "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
		if fx.name == "postgres" {
			slow = "SELECT count(*) FROM generate_series(1, 10000000000)" // pg_sleep is not on the allowlist
		}
		start := time.Now()
		_, terr := call(t, fx.pool, "sql.query", map[string]any{"sql": slow})
		if terr == nil || terr.Code != planexv1.ErrorCode_ERROR_CODE_TIMEOUT {
			t.Fatalf("error %v, want TIMEOUT", terr)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("timeout took %v", d)
		}
		// The pool still works afterwards.
		if _, terr := call(t, fx.pool, "sql.query", map[string]any{"sql": "SELECT 1"}); terr != nil {
			t.Fatal(terr)
		}
	})
}

func TestSchema(t *testing.T) {
	eachBackend(t, Config{}, func(t *testing.T, fx *fixture) {
		out, terr := call(t, fx.pool, "sql.schema", map[string]any{})
		if terr != nil {
			t.Fatal(terr)
		}
		tables := out.(map[string]any)["tables"].([]Table)
		if len(tables) != 1 || tables[0].Name != "t" || len(tables[0].Columns) != 9 {
			t.Fatalf("tables %+v", tables)
		}
		id, name, note := tables[0].Columns[0], tables[0].Columns[1], tables[0].Columns[6]
		if id.Name != "id" || !id.PrimaryKey || id.Nullable || name.Nullable || name.PrimaryKey || !note.Nullable || name.Type == "" {
			t.Fatalf("columns id %+v name %+v note %+v", id, name, note)
		}
		if _, terr := call(t, fx.pool, "sql.schema", map[string]any{"tables": []any{"T"}}); terr != nil {
			t.Fatalf("filter by table: %v", terr)
		}
		_, terr = call(t, fx.pool, "sql.schema", map[string]any{"tables": []any{"t", "orders"}})
		if terr == nil || terr.Field != "args.tables[1]" || !strings.Contains(terr.Message, `"orders"`) {
			t.Fatalf("error %v, want INVALID_ARGUMENT on args.tables[1] naming orders", terr)
		}
	})
}

func TestExec(t *testing.T) {
	eachBackend(t, Config{}, func(t *testing.T, fx *fixture) {
		ph := "?"
		if fx.name == "postgres" {
			ph = "$1"
		}
		out, terr := call(t, fx.pool, "sql.exec", map[string]any{"sql": "UPDATE t SET note = 'seen' WHERE id > " + ph, "params": []any{3}})
		if terr != nil {
			t.Fatal(terr)
		}
		if n := out.(map[string]any)["rows_affected"]; n != int64(2) {
			t.Fatalf("rows_affected %v, want 2", n)
		}
		if got := fx.admin(t, "SELECT count(*) FROM t WHERE note = 'seen'"); fmt.Sprint(got[0][0]) != "2" {
			t.Fatalf("rows changed: %v", got)
		}
		for _, bad := range []string{"SELECT 1", "UPDATE t SET note = 'x'; DELETE FROM t", "PRAGMA user_version = 3", "ATTACH DATABASE 'x.db' AS x", "COPY t TO '/tmp/t.csv'"} {
			if _, terr := call(t, fx.pool, "sql.exec", map[string]any{"sql": bad}); terr == nil || terr.Field != "args.sql" {
				t.Errorf("sql.exec %q: error %v, want one naming args.sql", bad, terr)
			}
		}
		spec := fx.pool.Tools()[2].Spec()
		if spec.GetName() != "sql.exec" || spec.GetSideEffect() != planexv1.SideEffect_SIDE_EFFECT_WRITE || !spec.GetRequiresApproval() {
			t.Fatalf("sql.exec spec %v", spec)
		}
	})
}

// readOnlyCorpus is the statements sql.query must refuse, by backend.
func readOnlyCorpus(fx *fixture) []string {
	evil := filepath.Join(fx.dir, "evil.db")
	c := []string{
		"INSERT INTO t (id, name) VALUES (100, 'x')",
		"insert into t (id, name) values (101, 'x')",
		"UPDATE t SET name = 'x'",
		"UpDaTe t SET name = 'x'",
		"DELETE FROM t",
		"delete from t",
		"DELETE FROM t -- comment",
		"/* x */ DELETE FROM t",
		"-- x\nDELETE FROM t",
		"DROP TABLE t",
		"CREATE TABLE evil (x INTEGER)",
		"SELECT 1; DELETE FROM t",
		"SELECT * FROM t; DROP TABLE t;",
		"select 1;\n-- x\ndelete from t",
		"SELECT ';'; DELETE FROM t",
		"ALTER TABLE t ADD COLUMN evil INTEGER",
	}
	if fx.name == "sqlite" {
		return append(c,
			"ATTACH DATABASE '"+evil+"' AS evil",
			"attach '"+evil+"' as evil",
			"PRAGMA writable_schema=1",
			"PRAGMA user_version=5",
			"pragma USER_VERSION = 5",
			"VACUUM INTO '"+evil+"'",
			"REPLACE INTO t (id, name) VALUES (1, 'x')",
			"WITH x AS (SELECT 1) DELETE FROM t",
			"WITH x AS (SELECT 1) INSERT INTO t (id, name) SELECT 200, 'x' FROM x",
			"SELECT load_extension('evil')",
			"SELECT * FROM t /* a /* b */; DELETE FROM t",
		)
	}
	return append(c,
		"WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d",
		"with d as (update t set name = 'x' returning *) select * from d",
		"SELECT * INTO evil FROM t",
		"select * into temp evil from t",
		"COPY t TO '"+evil+"'",
		"COPY (SELECT 1) TO STDOUT",
		"SELECT pg_catalog.set_config('search_path', 'public', false)",
		"SELECT set_config('statement_timeout', '0', false)",
		`SELECT "set_config"('work_mem', '1MB', false)`,
		"SELECT pg_advisory_lock(1)",
		"SELECT * FROM t FOR UPDATE",
		"TRUNCATE t",
		"CREATE TEMP TABLE evil AS SELECT 1",
		"SELECT $$;$$; DELETE FROM t",
		"COMMIT; DELETE FROM t",
		"SET search_path TO public",
		"SELECT pg_read_file('/etc/passwd')",
		"SELECT lo_import('/etc/passwd')",
	)
}

// snapshot captures everything the corpus could change.
func snapshot(t testing.TB, fx *fixture) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprint(&b, fx.admin(t, "SELECT id, name, note FROM t ORDER BY id"))
	if fx.name == "sqlite" {
		fmt.Fprint(&b, fx.admin(t, "SELECT type, name, sql FROM sqlite_master ORDER BY name"))
		fmt.Fprint(&b, fx.admin(t, "PRAGMA user_version"))
	} else {
		fmt.Fprint(&b, fx.admin(t, "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY 1"))
	}
	return b.String()
}

func TestReadOnlyCorpus(t *testing.T) {
	eachBackend(t, Config{}, func(t *testing.T, fx *fixture) {
		before := snapshot(t, fx)
		for _, stmt := range readOnlyCorpus(fx) {
			t.Run(stmt, func(t *testing.T) {
				_, terr := call(t, fx.pool, "sql.query", map[string]any{"sql": stmt})
				if terr == nil {
					t.Fatalf("sql.query accepted %q", stmt)
				}
				if terr.Field != "args.sql" || (terr.Code != planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED && terr.Code != planexv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT) {
					t.Fatalf("error %v (code %v field %q), want PERMISSION_DENIED or INVALID_ARGUMENT on args.sql", terr, terr.Code, terr.Field)
				}
				if after := snapshot(t, fx); after != before {
					t.Fatalf("%q changed the database:\nbefore %s\nafter  %s", stmt, before, after)
				}
			})
		}
		if _, err := os.Stat(filepath.Join(fx.dir, "evil.db")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a corpus statement created a file: %v", err)
		}
		// Settings changed through a refused statement must not leak into
		// later queries either.
		if fx.name == "postgres" {
			out, terr := call(t, fx.pool, "sql.query", map[string]any{"sql": "SELECT current_setting('statement_timeout')"})
			if terr != nil {
				t.Fatal(terr)
			}
			if v := out.(*QueryOutput).Rows[0][0]; v == "0" {
				t.Fatalf("statement_timeout leaked as %v", v)
			}
		}
	})
}

// TestDatabaseEnforcesReadOnly bypasses the statement policy and runs the
// corpus straight on the read path, proving the database layer (READ ONLY
// transaction; mode=ro, query_only and the authorizer) refuses writes by
// itself.
func TestDatabaseEnforcesReadOnly(t *testing.T) {
	eachBackend(t, Config{}, func(t *testing.T, fx *fixture) {
		before := snapshot(t, fx)
		for _, stmt := range readOnlyCorpus(fx) {
			st, err := parseOne(stmt, fx.pool.db.dialect())
			if err != nil {
				continue // several statements: the driver would run only the first
			}
			switch st.verb {
			case "COPY", "SET", "COMMIT":
				continue // refused by the policy only (PostgreSQL allows them in read-only transactions)
			}
			if strings.Contains(strings.ToLower(stmt), "set_config") || strings.Contains(stmt, "pg_advisory_lock") ||
				strings.Contains(stmt, "pg_read_file") || strings.Contains(stmt, "load_extension") || strings.Contains(stmt, "lo_import") {
				continue // refused by the policy; the transaction, always rolled back, undoes them anyway
			}
			t.Run(stmt, func(t *testing.T) {
				_, err := fx.pool.db.query(runnertest.Context(t), stmt, nil, 10)
				if err == nil {
					t.Fatalf("the read path ran %q", stmt)
				}
				if terr := fx.pool.db.classify(err, true); terr.Code != planexv1.ErrorCode_ERROR_CODE_PERMISSION_DENIED {
					t.Logf("%q: %v (%v)", stmt, terr, err)
				}
				if after := snapshot(t, fx); after != before {
					t.Fatalf("%q changed the database", stmt)
				}
			})
		}
		if _, err := os.Stat(filepath.Join(fx.dir, "evil.db")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the read path created a file: %v", err)
		}
	})
}

func TestKind(t *testing.T) {
	tests := []struct {
		dsn, want string
		wantErr   bool
	}{
		{dsn: "postgres://u:p@h/db", want: "postgresql"},
		{dsn: "postgresql://h/db", want: "postgresql"},
		{dsn: "sqlite:///tmp/x.db", want: "sqlite"},
		{dsn: "data/demo.db", want: "sqlite"},
		{dsn: "", wantErr: true},
		{dsn: "mysql://u:secret@h/db", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.dsn, func(t *testing.T) {
			got, err := Kind(tt.dsn)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("Kind(%q) = %q, %v", tt.dsn, got, err)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
	if _, err := Open(runnertest.Context(t), Config{DSN: filepath.Join(t.TempDir(), "missing.db")}); err == nil || !strings.Contains(err.Error(), "missing.db") {
		t.Fatalf("Open of a missing SQLite file: %v", err)
	}
}
