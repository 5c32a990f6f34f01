package sqlpool

import (
	"strings"
	"testing"
)

func TestParseOne(t *testing.T) {
	tests := []struct {
		name    string
		sql     string
		d       dialect
		verb    string
		wantErr string
	}{
		{name: "select", sql: "SELECT 1", verb: "SELECT"},
		{name: "trailing semicolon", sql: "select 1 ;  -- done\n", verb: "SELECT"},
		{name: "semicolon in string", sql: "SELECT 'a;b' FROM t", verb: "SELECT"},
		{name: "escaped quote", sql: "SELECT 'it''s; fine'", verb: "SELECT"},
		{name: "semicolon in line comment", sql: "SELECT 1 -- ; DELETE FROM t", verb: "SELECT"},
		{name: "semicolon in block comment", sql: "SELECT 1 /* ; DELETE FROM t */", verb: "SELECT"},
		{name: "semicolon in quoted identifier", sql: `SELECT "a;b" FROM t`, verb: "SELECT"},
		{name: "semicolon in backticks", sql: "SELECT `a;b` FROM t", verb: "SELECT"},
		{name: "semicolon in brackets", sql: "SELECT [a;b] FROM t", verb: "SELECT"},
		{name: "leading comment", sql: "/* x */ DELETE FROM t", verb: "DELETE"},
		{name: "leading line comment", sql: "-- x\nDELETE FROM t", verb: "DELETE"},
		{name: "parenthesised", sql: "(SELECT 1) UNION (SELECT 2)", d: dialectPostgres, verb: "SELECT"},
		{name: "dollar quoted", sql: "SELECT $$a;b$$", d: dialectPostgres, verb: "SELECT"},
		{name: "tagged dollar quote", sql: "SELECT $x$ $$; $x$", d: dialectPostgres, verb: "SELECT"},
		{name: "E string backslash", sql: `SELECT E'a\';b'`, d: dialectPostgres, verb: "SELECT"},
		{name: "nested pg comment", sql: "SELECT 1 /* a /* b */ ; */", d: dialectPostgres, verb: "SELECT"},
		{name: "pg param", sql: "SELECT $1::int", d: dialectPostgres, verb: "SELECT"},

		{name: "two statements", sql: "SELECT 1; DELETE FROM t", wantErr: "2 statements"},
		{name: "two statements no space", sql: "SELECT 1;DELETE FROM t;", wantErr: "2 statements"},
		{name: "after comment", sql: "select 1;\n-- x\ndelete from t", wantErr: "2 statements"},
		{name: "after dollar quote", sql: "SELECT $$;$$; DELETE FROM t", d: dialectPostgres, wantErr: "2 statements"},
		{name: "sqlite comments do not nest", sql: "SELECT 1 /* a /* b */ ; DELETE FROM t", wantErr: "2 statements"},
		{name: "backslash does not escape in sqlite", sql: `SELECT 'a\'; DELETE FROM t; --'`, wantErr: "2 statements"},
		{name: "empty", sql: "  ; -- nothing", wantErr: "no SQL statement"},
		{name: "unterminated string", sql: "SELECT 'abc", wantErr: "unterminated string"},
		{name: "unterminated comment", sql: "SELECT 1 /* abc", wantErr: "unterminated /*"},
		{name: "unterminated dollar", sql: "SELECT $x$ abc", d: dialectPostgres, wantErr: "unterminated dollar"},
		{name: "no keyword", sql: "'x'", wantErr: "does not start with a keyword"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := parseOne(tt.sql, tt.d)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseOne(%q) error %v, want %q", tt.sql, err, tt.wantErr)
				}
				return
			}
			if err != nil || st.verb != tt.verb {
				t.Fatalf("parseOne(%q) = verb %q, err %v; want %q", tt.sql, st.verb, err, tt.verb)
			}
		})
	}
}

func TestSanitized(t *testing.T) {
	st, err := parseOne("SELECT name FROM t WHERE email = 'bob@example.com' AND id > 42 -- secret\n AND x = ?", dialectSQLite)
	if err != nil {
		t.Fatal(err)
	}
	got := st.sanitized()
	if want := "SELECT name FROM t WHERE email = ? AND id > ? AND x = ?"; got != want {
		t.Fatalf("sanitized = %q, want %q", got, want)
	}
}

func TestBindForPostgres(t *testing.T) {
	for _, tc := range []struct {
		name, in, want, err string
	}{
		{"numbers in order", "SELECT a FROM t WHERE b = ? AND c = lower(CAST(? AS TEXT))", "SELECT a FROM t WHERE b = $1 AND c = lower(CAST($2 AS TEXT))", ""},
		{"literal and comment keep ?", "SELECT '?' /* ? */, \"q?\" FROM t WHERE x = ? -- ?", "SELECT '?' /* ? */, \"q?\" FROM t WHERE x = $1 -- ?", ""},
		{"already numbered", "SELECT $1::int", "SELECT $1::int", ""},
		{"no params", "SELECT 1", "SELECT 1", ""},
		{"mixed", "SELECT ?, $2", "", "mixes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := parseOne(tc.in, dialectPostgres)
			if err != nil {
				t.Fatal(err)
			}
			got, err := st.bindFor(tc.in, dialectPostgres)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("bindFor(%q) = %q, %v; want error %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("bindFor(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
			if lite, _ := st.bindFor(tc.in, dialectSQLite); lite != tc.in {
				t.Errorf("SQLite statement changed: %q", lite)
			}
		})
	}
}
