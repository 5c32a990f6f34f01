package sqlpool

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/services/executor/runner"
)

// postgresDB runs statements through a pgx pool.
type postgresDB struct {
	pool    *pgxpool.Pool
	timeout time.Duration
}

func openPostgres(ctx context.Context, cfg Config) (*postgresDB, error) {
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("parse PostgreSQL DSN %q: %w", redactDSN(cfg.DSN), err)
	}
	where := fmt.Sprintf("%s:%d/%s", pc.ConnConfig.Host, pc.ConnConfig.Port, pc.ConnConfig.Database)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL at %s: %w", where, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL at %s: %w", where, err)
	}
	return &postgresDB{pool: pool, timeout: cfg.StatementTimeout}, nil
}

func (p *postgresDB) system() string   { return "postgresql" }
func (p *postgresDB) dialect() dialect { return dialectPostgres }

func (p *postgresDB) close() error {
	p.pool.Close()
	return nil
}

// begin starts a transaction with the statement timeout set locally.
func (p *postgresDB) begin(ctx context.Context, mode pgx.TxAccessMode) (pgx.Tx, error) {
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: mode})
	if err != nil {
		return nil, err
	}
	ms := p.timeout.Milliseconds()
	if dl, ok := ctx.Deadline(); ok {
		ms = min(ms, time.Until(dl).Milliseconds())
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", max(ms, 1))); err != nil {
		return nil, errors.Join(err, tx.Rollback(ctx))
	}
	return tx, nil
}

// rollback ends a transaction, also when ctx already ended.
func rollback(ctx context.Context, tx pgx.Tx) error {
	err := tx.Rollback(context.WithoutCancel(ctx))
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}

func (p *postgresDB) schema(ctx context.Context) (_ []Table, err error) {
	tx, err := p.begin(ctx, pgx.ReadOnly)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, rollback(ctx, tx)) }()
	rows, err := tx.Query(ctx, `
SELECT c.table_name, c.column_name, c.data_type, c.is_nullable = 'YES',
  EXISTS (
    SELECT 1 FROM information_schema.table_constraints tc
    JOIN information_schema.key_column_usage k
      ON k.constraint_schema = tc.constraint_schema AND k.constraint_name = tc.constraint_name
    WHERE tc.constraint_type = 'PRIMARY KEY' AND tc.table_schema = c.table_schema
      AND tc.table_name = c.table_name AND k.column_name = c.column_name)
FROM information_schema.columns c
WHERE c.table_schema = current_schema()
ORDER BY c.table_name, c.ordinal_position`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanTables(rows)
}

func (p *postgresDB) query(ctx context.Context, text string, params []any, maxRows int) (_ *QueryOutput, err error) {
	tx, err := p.begin(ctx, pgx.ReadOnly)
	if err != nil {
		return nil, err
	}
	// Always roll back: even a setting changed by the statement is undone.
	defer func() { err = errors.Join(err, rollback(ctx, tx)) }()
	rows, err := tx.Query(ctx, text, params...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	fields := rows.FieldDescriptions()
	out := &QueryOutput{Columns: make([]Column, len(fields)), Rows: [][]any{}}
	for i, f := range fields {
		typ := fmt.Sprintf("oid:%d", f.DataTypeOID)
		if t, ok := rows.Conn().TypeMap().TypeForOID(f.DataTypeOID); ok {
			typ = t.Name
		}
		out.Columns[i] = Column{Name: f.Name, Type: typ}
	}
	for rows.Next() {
		if len(out.Rows) == maxRows {
			out.Truncated = true
			break
		}
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		row := make([]any, len(vals))
		for i, v := range vals {
			row[i] = pgValue(v, fields[i].DataTypeOID)
		}
		out.Rows = append(out.Rows, row)
	}
	if !out.Truncated {
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	out.RowCount = len(out.Rows)
	return out, nil
}

func (p *postgresDB) exec(ctx context.Context, text string, params []any) (_ int64, err error) {
	tx, err := p.begin(ctx, pgx.ReadWrite)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, rollback(ctx, tx))
		}
	}()
	tag, err := tx.Exec(ctx, text, params...)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// pgValue converts a decoded PostgreSQL value to its JSON form.
func pgValue(v any, oid uint32) any {
	switch x := v.(type) {
	case nil, bool, string, int64, float64:
		return x
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case float32:
		return float64(x)
	case time.Time:
		if oid == pgtype.DateOID {
			return x.Format(time.DateOnly)
		}
		return x.UTC().Format(time.RFC3339Nano)
	case []byte:
		return base64.StdEncoding.EncodeToString(x)
	case [16]byte: // uuid
		return fmt.Sprintf("%x-%x-%x-%x-%x", x[0:4], x[4:6], x[6:8], x[8:10], x[10:16])
	case pgtype.Numeric:
		return numericValue(x)
	case netip.Prefix, netip.Addr, net.IPNet, *net.IPNet:
		return fmt.Sprint(x)
	case map[string]any:
		return x // json, jsonb
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = pgValue(e, 0)
		}
		return out
	case fmt.Stringer:
		return x.String()
	}
	if d, ok := v.(interface{ Value() (any, error) }); ok {
		if dv, err := d.Value(); err == nil {
			if s, ok := dv.(string); ok {
				return s
			}
		}
	}
	return fmt.Sprint(v)
}

// numericValue keeps integral numerics as integers when they fit.
func numericValue(n pgtype.Numeric) any {
	if !n.Valid {
		return nil
	}
	if n.NaN || n.InfinityModifier != pgtype.Finite {
		f, _ := n.Float64Value()
		return fmt.Sprint(f.Float64) // NaN and ±Inf are not JSON numbers
	}
	if n.Exp >= 0 {
		if i, err := n.Int64Value(); err == nil && i.Valid {
			return i.Int64
		}
	}
	f, err := n.Float64Value()
	if err != nil || math.IsInf(f.Float64, 0) {
		r := new(big.Rat).SetInt(n.Int)
		return r.FloatString(int(max(-n.Exp, 0)))
	}
	return f.Float64
}

// classify maps PostgreSQL errors to tool errors.
func (p *postgresDB) classify(err error, readOnly bool) *runner.Error {
	if errors.Is(err, context.DeadlineExceeded) {
		return &runner.Error{Code: planexv1.ErrorCode_ERROR_CODE_TIMEOUT, Message: "statement did not finish within the statement timeout", Err: err}
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		msg := pe.Message
		if pe.Detail != "" {
			msg += " (" + pe.Detail + ")"
		}
		switch {
		case pe.Code == "25006": // read_only_sql_transaction
			return runner.PermissionDenied("args.sql", "sql.query is read-only, the database refused: %s; use sql.exec to change data", msg)
		case pe.Code == "57014": // query_canceled: statement_timeout
			return &runner.Error{Code: planexv1.ErrorCode_ERROR_CODE_TIMEOUT, Message: "statement cancelled at the statement timeout", Err: err}
		case pe.Code == "42501": // insufficient_privilege
			return runner.PermissionDenied("args.sql", "PostgreSQL: %s", msg)
		case strings.HasPrefix(pe.Code, "08"), strings.HasPrefix(pe.Code, "53"), strings.HasPrefix(pe.Code, "57P"), pe.Code == "40001", pe.Code == "40P01":
			return runner.Unavailable(err, "PostgreSQL unavailable: %s", msg)
		}
		return runner.Failed(err, "PostgreSQL: %s (SQLSTATE %s)", msg, pe.Code)
	}
	switch {
	case pgconn.SafeToRetry(err), readOnly && isConnErr(err):
		return runner.Unavailable(err, "PostgreSQL unreachable")
	case isConnErr(err):
		// The connection broke while a write was in flight: it may have
		// been committed.
		return runner.OutcomeUnknown(err, "the connection to PostgreSQL broke during the statement; it may or may not have been applied")
	}
	return runner.Failed(err, "PostgreSQL: %v", err)
}

func isConnErr(err error) bool {
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne)
}
