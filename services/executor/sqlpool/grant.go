package sqlpool

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// GrantOptions describe the least-privilege PostgreSQL role of the sql
// pool's read DSN.
type GrantOptions struct {
	// Role to create (if missing) and grant to, a plain lower-case
	// identifier.
	Role string
	// Schemas whose tables the role may read; default "public".
	Schemas []string
	// KeepFor are roles that keep EXECUTE on RevokedFunctions (an
	// application that takes advisory locks or calls set_config).
	KeepFor []string
}

// RevokedFunctions matches (as a PostgreSQL regular expression on
// pg_proc.proname) the functions whose EXECUTE GrantReadOnlySQL revokes:
// those that act outside the read-only transaction (advisory locks,
// signals to other sessions, settings, notifications, sequences, large
// objects, server files, other connections through dblink) and those that
// run SQL handed to them as a string (the query_to_xml, cursor_to_xml and
// table_to_xml families, ts_stat).
const RevokedFunctions = `^(` +
	`query_to_xml|query_to_xmlschema|query_to_xml_and_xmlschema|cursor_to_xml|cursor_to_xmlschema|` +
	`table_to_xml|table_to_xmlschema|table_to_xml_and_xmlschema|schema_to_xml.*|database_to_xml.*|ts_stat|` +
	`dblink.*|pg_read_file|pg_read_binary_file|pg_ls_.*|pg_stat_file|lo_.*|loread|lowrite|` +
	`pg_terminate_backend|pg_cancel_backend|pg_advisory.*|pg_try_advisory.*|set_config|pg_notify|` +
	`pg_sleep.*|pg_reload_conf|pg_rotate_logfile|pg_switch_wal|pg_create_restore_point|pg_promote|` +
	`pg_log_backend_memory_contexts|pg_logical_emit_message` +
	`)$`

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Validate checks the role and schema names, naming the flag at fault.
func (o GrantOptions) Validate() error {
	var errs []error
	if !identRE.MatchString(o.Role) {
		errs = append(errs, fmt.Errorf("--role %q: want a lower-case identifier of [a-z0-9_], at most 63 characters", o.Role))
	}
	for _, s := range o.Schemas {
		if !identRE.MatchString(s) {
			errs = append(errs, fmt.Errorf("--schema %q: want a lower-case identifier of [a-z0-9_], at most 63 characters", s))
		}
	}
	for _, r := range o.KeepFor {
		if !identRE.MatchString(r) {
			errs = append(errs, fmt.Errorf("--keep-for %q: want a lower-case identifier of [a-z0-9_], at most 63 characters", r))
		}
	}
	return errors.Join(errs...)
}

// GrantReadOnlySQL returns the SQL script that creates (if missing) and
// restricts the read-only role of the sql pool in the current database:
// login, no superuser, role or database creation; CONNECT on the
// database, USAGE and SELECT on the chosen schemas (tables created later
// included), no write privilege; every transaction read-only by default;
// and EXECUTE revoked from PUBLIC and the role on RevokedFunctions.
// PostgreSQL grants EXECUTE on functions to PUBLIC, so revoking it from one
// role would not take effect: the script revokes it from PUBLIC, which
// affects every non-superuser role of the database — grant the functions
// back to the roles that need them (KeepFor). Nothing in a sequence can be
// advanced by the role anyway: it gets no USAGE or UPDATE on sequences. Run
// it again after installing an
// extension (dblink).
func GrantReadOnlySQL(o GrantOptions) (string, error) {
	if len(o.Schemas) == 0 {
		o.Schemas = []string{"public"}
	}
	if err := o.Validate(); err != nil {
		return "", err
	}
	role := `"` + o.Role + `"`
	var b strings.Builder
	fmt.Fprintf(&b, `-- Read-only role %[1]s for the planex sql pool (sql.schema, sql.query).
-- Run as a superuser in the database the pool reads; set a password with
--   ALTER ROLE %[2]s PASSWORD '...';
-- and give sql.exec, if used, another role through --sql-write-dsn.
BEGIN;
DO $planex$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '%[1]s') THEN
    CREATE ROLE %[2]s LOGIN;
  END IF;
END
$planex$;
ALTER ROLE %[2]s NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
ALTER ROLE %[2]s SET default_transaction_read_only = on;
DO $planex$
BEGIN
  EXECUTE format('GRANT CONNECT ON DATABASE %%I TO %%I', current_database(), '%[1]s');
  EXECUTE format('REVOKE CREATE ON DATABASE %%I FROM %%I', current_database(), '%[1]s');
END
$planex$;
`, o.Role, role)
	for _, s := range o.Schemas {
		schema := `"` + s + `"`
		fmt.Fprintf(&b, `GRANT USAGE ON SCHEMA %[1]s TO %[2]s;
REVOKE CREATE ON SCHEMA %[1]s FROM PUBLIC, %[2]s;
GRANT SELECT ON ALL TABLES IN SCHEMA %[1]s TO %[2]s;
REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON ALL TABLES IN SCHEMA %[1]s FROM %[2]s;
ALTER DEFAULT PRIVILEGES IN SCHEMA %[1]s GRANT SELECT ON TABLES TO %[2]s;
`, schema, role)
	}
	keep := ""
	for _, r := range o.KeepFor {
		keep += fmt.Sprintf("\n    EXECUTE format('GRANT EXECUTE ON FUNCTION %%s TO %%I', f, '%s');", r)
	}
	fmt.Fprintf(&b, `-- Functions that act outside the read-only transaction or run SQL from a
-- string: EXECUTE revoked from PUBLIC (every role) and from %[1]s.
DO $planex$
DECLARE
  f regprocedure;
BEGIN
  FOR f IN SELECT p.oid::regprocedure FROM pg_proc p WHERE p.proname ~ '%[2]s' LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %%s FROM PUBLIC, %%I', f, '%[1]s');%[3]s
  END LOOP;
END
$planex$;
COMMIT;
`, o.Role, RevokedFunctions, keep)
	return b.String(), nil
}

// GrantReadOnly applies GrantReadOnlySQL on the database of dsn, whose
// role must be a superuser.
func GrantReadOnly(ctx context.Context, dsn string, o GrantOptions) error {
	script, err := GrantReadOnlySQL(o)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL %s: %w", redactDSN(dsn), err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, script); err != nil {
		return fmt.Errorf("grant read-only role %s: %w", o.Role, err)
	}
	return nil
}
