package main

import (
	"os/exec"
	"strings"
	"testing"
)

func TestSQLGrantReadOnlyPrints(t *testing.T) {
	out, err := exec.Command(planexBin, "sql", "grant-readonly", "--role", "shop_ro", "--schema", "sales,public").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, want := range []string{`GRANT SELECT ON ALL TABLES IN SCHEMA "sales" TO "shop_ro";`, `GRANT USAGE ON SCHEMA "public" TO "shop_ro";`,
		"REVOKE EXECUTE ON FUNCTION", "dblink.*", "pg_advisory.*", "COMMIT;"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sql", "grant-readonly", "--role", "x; DROP ROLE postgres"}, `--role "x; DROP ROLE postgres"`},
		{[]string{"sql", "grant-readonly", "--apply"}, "--dsn: required with --apply"},
		{[]string{"sql", "grant-readonly", "--apply", "--dsn", "data/demo.db"}, "--dsn: want a postgres:// DSN"},
	} {
		out, err := exec.Command(planexBin, tc.args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("planex %v: %v %s, want an error naming %q", tc.args, err, out, tc.want)
		}
	}
}
