package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/stepsign"
)

// authCmd groups the commands that make credentials for a deployment.
func authCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Make credentials: API keys, step signing keys, the NATS authorization block, Kubernetes Secrets",
	}
	cmd.AddCommand(apiKeyCmd(), stepKeyCmd(), natsConfigCmd(), k8sSecretsCmd())
	return cmd
}

func apiKeyCmd() *cobra.Command {
	var roles []string
	var tenantName string
	cmd := &cobra.Command{
		Use:   "api-key NAME",
		Short: "Generate an API key; add the printed line to --auth-api-keys-file and give the key to its user",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.ContainsAny(args[0], " \t\n#") {
				return usageError(cmd, "NAME %q: no spaces or '#'", args[0])
			}
			var rs []authn.Role
			for _, r := range roles {
				role, err := authn.ParseRole(r)
				if err != nil {
					return usageError(cmd, "--role: %v", err)
				}
				rs = append(rs, role)
			}
			if tenantName != "" && tenantName != authn.DefaultTenant {
				if err := authn.ValidTenant(tenantName); err != nil {
					return usageError(cmd, "--tenant: %v", err)
				}
				if slices.Contains(rs, authn.RolePlatformAdmin) {
					return usageError(cmd, "--role platform-admin: only a key of the default tenant holds it (drop --tenant, or give the tenant's key admin)")
				}
			}
			key, line, err := authn.GenerateAPIKey(args[0], rs...)
			if err != nil {
				return err
			}
			if tenantName != "" && tenantName != authn.DefaultTenant {
				line += " tenant=" + tenantName
			}
			fmt.Fprintf(cmd.OutOrStdout(), "key (give to the user; shown once):\n  %s\nline for --auth-api-keys-file (the hash only):\n  %s\n", key, line)
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&roles, "role", []string{"viewer"}, "roles: viewer, runner, approver, operator, admin, platform-admin (comma separated)")
	cmd.Flags().StringVar(&tenantName, "tenant", "", "the tenant the key belongs to (written as the line's tenant=<t> field; empty: the default tenant)")
	return cmd
}

func stepKeyCmd() *cobra.Command {
	var keyFile, verifyDir string
	cmd := &cobra.Command{
		Use:   "step-key",
		Short: "Generate an ed25519 step signing key (supervisor) and its public key (executors' --step-verify-keys directory)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			kid, err := stepsign.GenerateKeyFiles(keyFile, verifyDir)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "key id %s\n  private: %s (supervisor --step-signing-key-file)\n  public:  %s/%s.pem (executors --step-verify-keys %s)\n", kid, keyFile, verifyDir, kid, verifyDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&keyFile, "key-file", "step-signing.key", "where to write the private key (0600)")
	cmd.Flags().StringVar(&verifyDir, "verify-dir", "step-verify", "directory to add the public key to")
	return cmd
}

func natsConfigCmd() *cobra.Command {
	var nkeys, tenantNkeys []string
	var adminNkey string
	cmd := &cobra.Command{
		Use:   "nats-config",
		Short: "Print the nats-server authorization block: one nkey user per planex service with its least-privilege permissions",
		Long: `Print the nats-server authorization block: one nkey user per planex service
(supervisor, planner, executor-<pool>) with its publish/subscribe allow lists.
Generate each service's nkey with 'nk -gen user -pubout' and give the seed to
the service (--nats-nkey-file).

With --tenant-nkey, each tenant gets a NATS account of its own
(planex-tenant-<name>, JetStream enabled) holding its supervisor's and its
pools' executors' users, and the default tenant's users go into the account
planex-default (a stock nats-server started with accounts gives the global
account no JetStream; an installation that had no tenants moves its data
there once, docs/tenancy.md): the file has an accounts block instead of an
authorization block. Pass every tenant on every run: a tenant left out loses its account.
--admin-nkey adds the account admin (planex backup/restore) to the default
tenant's account. docs/tenancy.md says how to add a tenant without a
restart (nats-server --signal reload).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m := map[string]string{}
			for _, kv := range nkeys {
				svc, pub, ok := strings.Cut(kv, "=")
				if !ok || !strings.HasPrefix(pub, "U") {
					return usageError(cmd, "--nkey %q: want service=U<public nkey>", kv)
				}
				m[svc] = pub
			}
			if len(m) == 0 {
				return usageError(cmd, "--nkey: at least one service=public-nkey")
			}
			tenants := map[string]map[string]string{}
			for _, kv := range tenantNkeys {
				who, pub, ok := strings.Cut(kv, "=")
				tn, svc, ok2 := strings.Cut(who, ":")
				if !ok || !ok2 || tn == "" || svc == "" || !strings.HasPrefix(pub, "U") {
					return usageError(cmd, "--tenant-nkey %q: want tenant:identity=U<public nkey>, e.g. team-a:executor-sql=UAB...", kv)
				}
				if tenants[tn] == nil {
					tenants[tn] = map[string]string{}
				}
				if _, dup := tenants[tn][svc]; dup {
					return usageError(cmd, "--tenant-nkey %q: tenant %s's %s given twice", kv, tn, svc)
				}
				tenants[tn][svc] = pub
			}
			for tn, ids := range tenants {
				if _, ok := ids[natsauth.Supervisor]; !ok {
					return usageError(cmd, "--tenant-nkey: tenant %s has no supervisor (add %s:supervisor=U...): the supervisor serves the tenant through its account", tn, tn)
				}
			}
			if adminNkey != "" && !strings.HasPrefix(adminNkey, "U") {
				return usageError(cmd, "--admin-nkey %q: want a user public nkey (U...)", adminNkey)
			}
			// As planex auth k8s-secrets: with tenants, the default tenant
			// in an account of its own.
			out, err := natsauth.ServerConfigWithOptions(m, tenants,
				natsauth.ServerConfigOptions{DefaultAccount: true, Admin: adminNkey})
			if err != nil {
				return usageError(cmd, "--nkey/--tenant-nkey: %v", err)
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), out)
			return err
		},
	}
	cmd.Flags().StringArrayVar(&nkeys, "nkey", nil, "service=public nkey, e.g. executor-sql=UAB... (repeatable)")
	cmd.Flags().StringArrayVar(&tenantNkeys, "tenant-nkey", nil, "tenant:identity=public nkey of a tenant's supervisor or executor-<pool>, e.g. team-a:supervisor=UAB... (repeatable; every tenant needs its supervisor)")
	cmd.Flags().StringVar(&adminNkey, "admin-nkey", "", "public nkey of the account admin (planex backup/restore), in the default tenant's account")
	return cmd
}
