package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/planex-dev/planex/services/executor/sqlpool"
)

// sqlCmd groups the sql pool's administration commands.
func sqlCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sql",
		Short: "Administer the sql pool's database",
	}
	cmd.AddCommand(grantReadOnlyCmd())
	return cmd
}

// grantReadOnlyCmd prints, or applies, the SQL of the least-privilege
// PostgreSQL role for the sql pool's --sql-dsn.
func grantReadOnlyCmd() *cobra.Command {
	var (
		opts  sqlpool.GrantOptions
		apply bool
		dsn   string
	)
	cmd := &cobra.Command{
		Use:   "grant-readonly",
		Short: "Print (or --apply) the SQL of a read-only PostgreSQL role for the sql pool",
		Long: `Prints the SQL that creates (if missing) a PostgreSQL role for the sql pool's
--sql-dsn and restricts it: SELECT on the chosen schemas only, no superuser,
no INSERT/UPDATE/DELETE/TRUNCATE/CREATE, read-only transactions by default,
and EXECUTE revoked on the functions that act outside a read-only transaction
or run SQL from a string (query_to_xml and family, dblink*, pg_read_*, lo_*,
pg_*_backend, pg_advisory*, set_config, pg_notify, ...). EXECUTE is revoked
from PUBLIC, since PostgreSQL grants it to every role: list roles that still
need these functions with --keep-for. Run it again after installing an
extension. With --apply it runs the SQL on --dsn (as a superuser).`,
		Example: `  planex sql grant-readonly --role planex_ro --schema sales > readonly.sql
  planex sql grant-readonly --role planex_ro --schema public --apply --dsn postgres://postgres@db/shop`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			script, err := sqlpool.GrantReadOnlySQL(opts)
			if err != nil {
				return err
			}
			if !apply {
				_, err := fmt.Fprint(cmd.OutOrStdout(), script)
				return err
			}
			if dsn == "" {
				return errors.New("--dsn: required with --apply (a superuser connection to the database the pool reads)")
			}
			if k, err := sqlpool.Kind(dsn); err != nil || k != "postgresql" {
				return errors.New("--dsn: want a postgres:// DSN")
			}
			if err := sqlpool.GrantReadOnly(cmd.Context(), dsn, opts); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "role %s is read-only; set its password (ALTER ROLE %s PASSWORD ...) and use it in --sql-dsn\n", opts.Role, opts.Role)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Role, "role", "planex_ro", "role to create or restrict")
	f.StringSliceVar(&opts.Schemas, "schema", []string{"public"}, "schemas whose tables the role may read (repeat or separate with commas)")
	f.StringSliceVar(&opts.KeepFor, "keep-for", nil, "roles that keep EXECUTE on the revoked functions (repeat or separate with commas)")
	f.BoolVar(&apply, "apply", false, "run the SQL on --dsn instead of printing it")
	f.StringVar(&dsn, "dsn", "", "superuser connection to the database, with --apply")
	return cmd
}
