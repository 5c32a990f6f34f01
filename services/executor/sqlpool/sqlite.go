package sqlpool

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/executor/runner"
)

// sqliteDB holds two connection pools on one file: ro (mode=ro,
// query_only, read-only authorizer) for sql.schema and sql.query, and rw
// for sql.exec.
type sqliteDB struct {
	path string
	ro   *sql.DB
	rw   *sql.DB
}

// introspection pragmas are the only pragmas the read pool may run (as the
// pragma_table_info() functions sql.schema uses).
var introspection = map[string]bool{
	"table_info": true, "table_xinfo": true, "table_list": true, "index_list": true, "index_info": true,
	"index_xinfo": true, "foreign_key_list": true, "database_list": true, "collation_list": true, "function_list": true,
}

// readOnlyAuthorizer lets statements read and nothing else.
func readOnlyAuthorizer(action sqlite.AuthorizerActionCode, arg1, arg2, _, _ string) sqlite.AuthorizerReturnCode {
	switch action {
	case sqlite.AuthSelect, sqlite.AuthRead, sqlite.AuthRecursive, sqlite.AuthTransaction:
		return sqlite.AuthorizerOK
	case sqlite.AuthFunction:
		if strings.EqualFold(arg2, "load_extension") {
			return sqlite.AuthorizerDeny
		}
		return sqlite.AuthorizerOK
	case sqlite.AuthPragma:
		if introspection[strings.ToLower(arg1)] {
			return sqlite.AuthorizerOK
		}
	}
	return sqlite.AuthorizerDeny
}

// writeAuthorizer lets sql.exec change the database but not reach other
// files (ATTACH) or connection settings (PRAGMA).
func writeAuthorizer(action sqlite.AuthorizerActionCode, arg1, arg2, db, trig string) sqlite.AuthorizerReturnCode {
	switch action {
	case sqlite.AuthAttach, sqlite.AuthDetach:
		return sqlite.AuthorizerDeny
	case sqlite.AuthPragma:
		return readOnlyAuthorizer(action, arg1, arg2, db, trig)
	case sqlite.AuthFunction:
		return readOnlyAuthorizer(action, arg1, arg2, db, trig)
	}
	return sqlite.AuthorizerOK
}

// authorizing installs an authorizer on every connection it opens.
type authorizing struct {
	driver.Connector
	fn sqlite.AuthorizerFn
}

func (a authorizing) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := a.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	reg, ok := conn.(sqlite.AuthorizerRegisterer)
	if !ok {
		_ = conn.Close()
		return nil, errors.New("sqlite driver does not support authorizers")
	}
	if err := reg.RegisterAuthorizer(a.fn); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("install sqlite authorizer: %w", err)
	}
	return conn, nil
}

// fileURI builds the SQLite URI of path with query parameters.
func fileURI(path string, params url.Values) string {
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(path), RawQuery: params.Encode()}
	if !strings.HasPrefix(u.Path, "/") {
		u.Path = "/" + u.Path
	}
	return u.String()
}

func openSQLite(ctx context.Context, cfg Config, path string) (_ *sqliteDB, err error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("SQLite path %q: %w", path, err)
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("open SQLite database %s: %w", abs, err)
	}
	open := func(params url.Values, fn sqlite.AuthorizerFn) (*sql.DB, error) {
		c, err := sqlite.NewConnector(fileURI(abs, params))
		if err != nil {
			return nil, fmt.Errorf("open SQLite database %s: %w", abs, err)
		}
		return sql.OpenDB(authorizing{Connector: c, fn: fn}), nil
	}
	db := &sqliteDB{path: abs}
	busy := fmt.Sprint(cfg.StatementTimeout.Milliseconds())
	if db.rw, err = open(url.Values{"mode": {"rw"}, "_busy_timeout": {busy}}, writeAuthorizer); err != nil {
		return nil, err
	}
	db.rw.SetMaxOpenConns(1) // one writer at a time; SQLite serialises writes anyway
	if db.ro, err = open(url.Values{"mode": {"ro"}, "_query_only": {"1"}, "_busy_timeout": {busy}}, readOnlyAuthorizer); err != nil {
		return nil, errors.Join(err, db.rw.Close())
	}
	for _, p := range []*sql.DB{db.rw, db.ro} {
		if err := p.PingContext(ctx); err != nil {
			return nil, errors.Join(fmt.Errorf("open SQLite database %s: %w", abs, err), db.close())
		}
	}
	return db, nil
}

func (s *sqliteDB) system() string   { return "sqlite" }
func (s *sqliteDB) dialect() dialect { return dialectSQLite }

func (s *sqliteDB) ping(ctx context.Context) error {
	// Open connections keep a deleted or unmounted file readable; the
	// path must still lead to it.
	if _, err := os.Stat(s.path); err != nil {
		return err
	}
	var one int
	return s.ro.QueryRowContext(ctx, "SELECT 1").Scan(&one)
}

func (s *sqliteDB) close() error { return errors.Join(s.ro.Close(), s.rw.Close()) }

func (s *sqliteDB) schema(ctx context.Context) ([]Table, error) {
	rows, err := s.ro.QueryContext(ctx, `SELECT m.name, p.name, p.type, p."notnull" = 0 AND p.pk = 0, p.pk > 0
FROM sqlite_master AS m JOIN pragma_table_info(m.name) AS p
WHERE m.type IN ('table', 'view') AND m.name NOT LIKE 'sqlite\_%' ESCAPE '\'
ORDER BY m.name, p.cid`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanTables(rows)
}

func (s *sqliteDB) query(ctx context.Context, text string, params []any, maxRows int) (_ *QueryOutput, err error) {
	tx, err := s.ro.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, ignoreDone(tx.Rollback())) }()
	rows, err := tx.QueryContext(ctx, text, params...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	types, err := rows.ColumnTypes()
	if err != nil {
		return nil, err
	}
	out := &QueryOutput{Columns: make([]Column, len(types)), Rows: [][]any{}}
	for i, ct := range types {
		out.Columns[i] = Column{Name: ct.Name(), Type: strings.ToUpper(ct.DatabaseTypeName())}
	}
	vals := make([]any, len(types))
	ptrs := make([]any, len(types))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if len(out.Rows) == maxRows {
			out.Truncated = true
			break
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		row := make([]any, len(vals))
		for i, v := range vals {
			row[i] = sqliteValue(v, out.Columns[i].Type)
		}
		out.Rows = append(out.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out.RowCount = len(out.Rows)
	inferTypes(out)
	return out, nil
}

func (s *sqliteDB) exec(ctx context.Context, text string, params []any) (int64, error) {
	res, err := s.rw.ExecContext(ctx, text, params...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// ignoreDone drops the error of rolling back a finished transaction.
func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

// sqliteValue converts a scanned SQLite value to its JSON form.
func sqliteValue(v any, declared string) any {
	switch x := v.(type) {
	case int64:
		if declared == "BOOLEAN" || declared == "BOOL" {
			return x != 0
		}
		return x
	case []byte:
		return base64.StdEncoding.EncodeToString(x)
	case time.Time:
		if declared == "DATE" && x.Hour() == 0 && x.Minute() == 0 && x.Second() == 0 && x.Nanosecond() == 0 {
			return x.Format(time.DateOnly)
		}
		return x.UTC().Format(time.RFC3339Nano)
	}
	return v
}

// inferTypes names the type of expression columns (no declared type) from
// their first non-null value.
func inferTypes(out *QueryOutput) {
	for i := range out.Columns {
		if out.Columns[i].Type != "" {
			continue
		}
		for _, row := range out.Rows {
			switch row[i].(type) {
			case nil:
				continue
			case int64:
				out.Columns[i].Type = "INTEGER"
			case float64:
				out.Columns[i].Type = "REAL"
			case string:
				out.Columns[i].Type = "TEXT"
			case bool:
				out.Columns[i].Type = "BOOLEAN"
			}
			break
		}
	}
}

// classify maps SQLite errors to tool errors.
func (s *sqliteDB) classify(err error, readOnly bool) *runner.Error {
	var se *sqlite.Error
	if errors.Is(err, context.DeadlineExceeded) {
		return &runner.Error{Code: planexv1.ErrorCode_ERROR_CODE_TIMEOUT, Message: "statement did not finish within the statement timeout", Err: err}
	}
	if !errors.As(err, &se) {
		return runner.Failed(err, "SQLite: %v", err)
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_AUTH:
		if readOnly {
			return runner.PermissionDenied("args.sql", "sql.query is read-only, the database refused: %s; use sql.exec to change data", se.Error())
		}
		return runner.PermissionDenied("args.sql", "the database refused: %s", se.Error())
	case sqlite3.SQLITE_INTERRUPT:
		return &runner.Error{Code: planexv1.ErrorCode_ERROR_CODE_TIMEOUT, Message: "statement interrupted at the statement timeout", Err: err}
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return runner.Unavailable(err, "SQLite database is locked; retrying")
	}
	return runner.Failed(err, "SQLite: %s", se.Error())
}
