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
	var nkeys []string
	cmd := &cobra.Command{
		Use:   "nats-config",
		Short: "Print the nats-server authorization block: one nkey user per planex service with its least-privilege permissions",
		Long: `Print the nats-server authorization block: one nkey user per planex service
(supervisor, planner, executor-<pool>) with its publish/subscribe allow lists.
Generate each service's nkey with 'nk -gen user -pubout' and give the seed to
the service (--nats-nkey-file).`,
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
			out, err := natsauth.ServerConfig(m)
			if err != nil {
				return usageError(cmd, "--nkey: %v", err)
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), out)
			return err
		},
	}
	cmd.Flags().StringArrayVar(&nkeys, "nkey", nil, "service=public nkey, e.g. executor-sql=UAB... (repeatable)")
	return cmd
}
