package natsauth

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/planex-dev/planex/internal/authn"
)

// DefaultTenant is the implicit tenant of a deployment without tenants:
// its identities stay in NATS's global account ($G), where the streams and
// buckets of earlier releases live, so an upgrade moves nothing. With
// tenants on a stock nats-server they are in DefaultAccount instead
// (ServerConfigOptions.DefaultAccount). It is the tenant of callers that
// belong to no other (authn.DefaultTenant): one name in both.
const DefaultTenant = authn.DefaultTenant

// tenantAccountPrefix prefixes a tenant's NATS account name.
const tenantAccountPrefix = "planex-tenant-"

// ValidTenant checks that name can name a tenant other than the default
// one: a lower-case letter, then up to 30 lower-case letters, digits or
// '-' (so that it is a NATS account name, a Kubernetes Secret name part
// and a file name as is).
func ValidTenant(name string) error {
	switch {
	case name == DefaultTenant:
		return fmt.Errorf("tenant %q: reserved (the installation's own tenant, in the global account or %s)", name, DefaultAccount)
	}
	// One rule for tenant names, the one callers' credentials are checked
	// against (API key lines, the registry).
	return authn.ValidTenant(name)
}

// TenantAccount is the NATS account of tenant (not the default tenant,
// which is in the global account or DefaultAccount): it holds the tenant's complete planex
// data plane under the usual stream and bucket names.
func TenantAccount(tenant string) string { return tenantAccountPrefix + tenant }

// TenantServices lists the NATS identities of a tenant's account:
// "supervisor" (the shared supervisor's connection into the account) and
// "executor-<pool>" for each pool the tenant owns or is granted. The
// planner has no identity there: it uses gRPC and its cache in $G only.
func TenantServices(pools ...string) []string {
	out := []string{Supervisor}
	for _, p := range pools {
		out = append(out, Executor+"-"+p)
	}
	return out
}

// DefaultAccount is the NATS account of the default tenant in a
// configuration with tenants for a stock nats-server
// (ServerConfigOptions.DefaultAccount): a named account with JetStream,
// since $G has none there once other accounts exist.
const DefaultAccount = "planex-default"

// AccountAdmin is the identity ServerConfigOptions.Admin renders: the
// default tenant's account admin, for `planex backup` and `planex restore`
// (which the services' confined identities cannot run).
const AccountAdmin = "admin"

// ServerConfigOptions choose how ServerConfigWithOptions renders the
// default tenant.
type ServerConfigOptions struct {
	// DefaultAccount, when there are tenants, puts the default tenant's
	// identities (supervisor, planner, executor-<pool>) in the account
	// DefaultAccount with `jetstream: enabled` instead of the global
	// account ($G): what a stock nats-server needs (a server started with
	// an accounts block gives $G no JetStream, see ServerConfigWithTenants).
	// Without tenants it changes nothing: the default tenant stays in $G
	// and the output is ServerConfig's, so an installation without tenants
	// keeps its data where it is.
	DefaultAccount bool
	// Admin, when not empty, is the public nkey of AccountAdmin: a user
	// without permission limits inside the default tenant's account ($G or
	// DefaultAccount) and with nothing outside it (accounts share
	// nothing), for backups, restores and the one-time move of the default
	// tenant's data into DefaultAccount. Empty: no such user.
	Admin string
}

// ServerConfigWithTenants renders the authorization of a nats-server
// configuration file for the default tenant and more: platform maps the
// default tenant's identities (supervisor, planner, executor-<pool>) to
// their public nkeys and stays in `authorization { users = [...] }`, the
// global account $G, exactly as ServerConfig renders it; tenants maps each
// other tenant to its identities' public nkeys (supervisor and
// executor-<pool> only), each tenant becoming an account TenantAccount(t)
// of the `accounts` block with `jetstream: enabled` and its users holding
// the same ForService permissions. Accounts share nothing (no exports, no
// imports): a credential of one tenant reaches nothing of another, nor of
// $G. With no tenants the output is ServerConfig(platform).
//
// The global account loses JetStream when other accounts exist: a
// nats-server (2.15) started from a file with an `accounts` block enables
// JetStream only in the accounts that say `jetstream: enabled`, and $G
// cannot be listed there ("$G" is a reserved account name; nats-io/nats-server
// PR 5753, which would have allowed it, was closed). No option of the
// file gives it back: neither `no_auth_user`, nor the top-level
// `jetstream` block, nor `mappings` (which creates $G in the options
// without limits). A server started without accounts and reloaded with
// them keeps JetStream in $G (the limits it gave $G at start-up survive a
// reload), but loses it at its next restart: the default tenant's streams
// then answer "JetStream not enabled for account" (10039). Embedded
// servers keep it with EnableGlobalJetStream after Start (it survives
// reloads); a stock nats-server needs the default tenant in an account of
// its own: ServerConfigWithOptions with DefaultAccount
// (TestGlobalAccountJetStream shows all three cases).
func ServerConfigWithTenants(platform map[string]string, tenants map[string]map[string]string) (string, error) {
	return ServerConfigWithOptions(platform, tenants, ServerConfigOptions{})
}

// ServerConfigWithOptions is ServerConfigWithTenants with the default
// tenant rendered as opts says. With opts.DefaultAccount and tenants, the
// file has no `authorization` block: every user, the default tenant's
// included, is in an account of the `accounts` block, DefaultAccount
// first, each with `jetstream: enabled`. Moving an installation's default
// tenant from $G into DefaultAccount moves none of its data: its streams
// stay in $G's store until a backup of them is restored into
// DefaultAccount (docs/tenancy.md).
func ServerConfigWithOptions(platform map[string]string, tenants map[string]map[string]string, opts ServerConfigOptions) (string, error) {
	seen := map[string]string{}
	for svc, pub := range platform {
		seen[pub] = "identity " + svc
	}
	var admin map[string]string
	if opts.Admin != "" {
		if !strings.HasPrefix(opts.Admin, "U") {
			return "", fmt.Errorf("admin nkey %q: want a user public nkey (U...)", opts.Admin)
		}
		if other, ok := seen[opts.Admin]; ok {
			return "", fmt.Errorf("admin nkey: already used by %s", other)
		}
		seen[opts.Admin] = "identity " + AccountAdmin
		admin = map[string]string{AccountAdmin: opts.Admin}
	}
	inAccount := opts.DefaultAccount && len(tenants) > 0
	var b strings.Builder
	if !inAccount {
		b.WriteString("authorization {\n  users = [\n")
		if err := writeUsers(&b, "    ", platform); err != nil {
			return "", err
		}
		writeAdmins(&b, "    ", admin)
		b.WriteString("  ]\n}\n")
	}
	if len(tenants) == 0 {
		return b.String(), nil
	}
	names := make([]string, 0, len(tenants))
	for t := range tenants {
		names = append(names, t)
	}
	slices.Sort(names)
	b.WriteString("accounts {\n")
	if inAccount {
		fmt.Fprintf(&b, "  # the default tenant\n  %q: {\n    jetstream: enabled\n    users = [\n", DefaultAccount)
		if err := writeUsers(&b, "      ", platform); err != nil {
			return "", err
		}
		writeAdmins(&b, "      ", admin)
		b.WriteString("    ]\n  }\n")
	}
	for _, t := range names {
		if err := ValidTenant(t); err != nil {
			return "", err
		}
		for svc, pub := range tenants[t] {
			if svc != Supervisor && !strings.HasPrefix(svc, Executor+"-") {
				return "", fmt.Errorf("tenant %q: identity %q: want supervisor or executor-<pool> (the planner has no identity in a tenant's account)", t, svc)
			}
			if pub == "" {
				return "", fmt.Errorf("tenant %q: identity %q: empty public nkey", t, svc)
			}
			if other, ok := seen[pub]; ok {
				// nats-server refuses a key in two places; say which.
				return "", fmt.Errorf("tenant %q: identity %q: nkey already used by %s", t, svc, other)
			}
			seen[pub] = fmt.Sprintf("tenant %q identity %s", t, svc)
		}
		fmt.Fprintf(&b, "  # tenant %s\n  %q: {\n    jetstream: enabled\n    users = [\n", t, TenantAccount(t))
		if err := writeUsers(&b, "      ", tenants[t]); err != nil {
			return "", fmt.Errorf("tenant %q: %w", t, err)
		}
		b.WriteString("    ]\n  }\n")
	}
	b.WriteString("}\n")
	return b.String(), nil
}

// writeAdmins writes the account admins of admins (identity → public
// nkey): users without a permissions block, every subject of their
// account allowed.
func writeAdmins(b *strings.Builder, indent string, admins map[string]string) {
	for id, pub := range admins {
		fmt.Fprintf(b, "%[1]s# %[2]s: account admin (backup, restore)\n%[1]s{ nkey: %[3]q }\n", indent, id, pub)
	}
}

// EnableGlobalJetStream turns JetStream on in the global account ($G) of
// a running embedded server whose configuration has other accounts (see
// ServerConfigWithTenants: such a configuration alone leaves $G without
// JetStream), with the limits a server without accounts gives it, and
// loads $G's streams from the store. Call it after Start (once the server
// is ready for connections) on every node; it survives config reloads and
// is a no-op when $G already has JetStream.
func EnableGlobalJetStream(s *server.Server) error {
	if !s.JetStreamEnabled() {
		return errors.New("enable JetStream in the global account: JetStream is not enabled on the server")
	}
	gacc := s.GlobalAccount()
	if gacc.JetStreamEnabled() {
		return nil
	}
	if err := gacc.EnableJetStream(nil, nil); err != nil {
		return fmt.Errorf("enable JetStream in the global account: %w", err)
	}
	return nil
}
