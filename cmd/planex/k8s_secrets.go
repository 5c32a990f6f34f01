package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"

	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// secret is one Kubernetes Secret to print.
type secret struct {
	name, typ string
	data      map[string][]byte
}

// k8sSecretsCmd generates every credential the Kubernetes manifests
// (deploy/k8s, deploy/helm/planex) mount, as Secret manifests.
func k8sSecretsCmd() *cobra.Command {
	var (
		namespace, outDir string
		pools             []string
		validity          time.Duration
		console           bool
		consoleHosts      []string
		tenantFlags       []string
		natsAdmin         bool
	)
	cmd := &cobra.Command{
		Use:   "k8s-secrets",
		Short: "Generate the Secrets the Kubernetes manifests mount (TLS, NATS nkeys and authorization, step keys, API keys) and print them as YAML",
		Long: `Generate every credential deploy/k8s and deploy/helm/planex mount and print
them as Kubernetes Secret manifests (apply with kubectl apply -f -):

  planex-tls-<service>     tls.crt, tls.key, ca.crt: the service's certificate
                           (the supervisor's carries OU admin: it calls the planner)
  nats-tls                 tls.crt, tls.key, ca.crt: the NATS servers' certificate
  nats-auth                auth.conf: one nkey user per service with its
                           least-privilege permissions (included by nats.conf)
  planex-nats-<service>    nkey: the service's NATS nkey seed
  planex-step-signing      step-signing.key: the supervisor's ed25519 key
  planex-step-verify       <key id>.pem: the executors' trusted public keys
  planex-api-keys          api-keys: hashed API keys (one admin key)
  planex-tls-console       with --console: tls.crt, tls.key, ca.crt: the web
                           console's server certificate (components/console,
                           console.enabled in the chart); --console-hosts adds
                           the public names the ingress sends it
  planex-tenant-<name>-nats
                           with --tenant NAME=POOLS: supervisor.nk and
                           executor-<pool>.nk, the nkey seeds of the tenant's
                           users; auth.conf then holds an account per tenant
                           (planex-tenant-<name>, JetStream enabled) and puts
                           the default tenant's users in the account
                           planex-default (JetStream enabled), not in the
                           global account
  planex-nats-admin        with --nats-admin: nkey, the seed of an account
                           admin of the default tenant's account (global, or
                           planex-default with tenants): for planex backup
                           and restore; no pod mounts it

--out-dir keeps what the operator needs afterwards: ca.crt and ca.key (to
issue more certificates), admin.token (the admin API key, for
'planex --token-file'), the step keys, and every Secret's files as
secrets/<name>/<key> (the NATS authorization block, the nkey seeds, the
certificates: for NATS or planex outside Kubernetes). Nothing secret is
printed to the terminal but the Secret manifests on stdout.

Re-running with the same --out-dir keeps every key it holds (the CA, the
NATS nkeys, the step keys, the admin API key) and re-issues the
certificates from the same CA, so adding a tenant is: re-run with one more
--tenant, apply, and let NATS reload (the nats-reloader sidecar does, or
nats-server --signal reload) — nothing restarts. Pass every tenant on each
run: a tenant left out loses its account in auth.conf.

The first --tenant moves the default tenant's users from the global account
into planex-default, where its existing streams are not: an installation
with data moves it once, with planex backup and planex restore (the command
prints the steps; docs/tenancy.md).`,
		Example: `  planex auth k8s-secrets --namespace planex --out-dir ./planex-credentials | kubectl apply -f -`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, p := range pools {
				if !bus.ValidToken(p) {
					return usageError(cmd, "--pools: %q is not a pool name", p)
				}
			}
			if namespace == "" || strings.ContainsAny(namespace, " ./") {
				return usageError(cmd, "--namespace %q: want a namespace name", namespace)
			}
			if !console && len(consoleHosts) > 0 {
				return usageError(cmd, "--console-hosts: needs --console")
			}
			for _, h := range consoleHosts {
				if h == "" || strings.ContainsAny(h, " /:@") {
					return usageError(cmd, "--console-hosts: %q is not a DNS name", h)
				}
			}
			tenants, err := parseTenants(tenantFlags)
			if err != nil {
				return usageError(cmd, "%v", err)
			}
			secrets, err := k8sSecretsWithTenants(outDir, namespace, pools, validity, console, consoleHosts, tenants, natsAdmin)
			if err != nil {
				return err
			}
			for _, sec := range secrets {
				for k, v := range sec.data {
					if err := os.MkdirAll(filepath.Join(outDir, "secrets", sec.name), 0o700); err != nil {
						return err
					}
					if err := tlsconfig.WriteFileAtomic(filepath.Join(outDir, "secrets", sec.name, k), v, 0o600); err != nil {
						return err
					}
				}
			}
			if err := writeSecrets(cmd.OutOrStdout(), namespace, secrets); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "planex: %d Secrets for namespace %s on stdout; CA, admin API key (admin.token) and step keys in %s\n", len(secrets), namespace, outDir)
			if len(tenants) > 0 {
				fmt.Fprint(cmd.ErrOrStderr(), firstTenantNotice)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&namespace, "namespace", "planex", "namespace the Secrets (and the certificates' DNS names) are for")
	cmd.Flags().StringSliceVar(&pools, "pools", []string{"sql", "email", "search"}, "executor pools to make identities for (comma separated)")
	cmd.Flags().StringVar(&outDir, "out-dir", "planex-credentials", "directory for the CA, the admin API key and the step keys (created 0700)")
	cmd.Flags().DurationVar(&validity, "cert-validity", 365*24*time.Hour, "validity of the issued certificates (the CA gets ten times as long)")
	cmd.Flags().BoolVar(&console, "console", false, "also issue planex-tls-console, the web console's server certificate")
	cmd.Flags().StringSliceVar(&consoleHosts, "console-hosts", nil, "with --console: public DNS names of the console (the ingress host) added to its certificate")
	cmd.Flags().StringArrayVar(&tenantFlags, "tenant", nil, "tenant with its own NATS account and the executor pools it owns or is granted, NAME=pool1,pool2 (repeatable); the default tenant then moves to the NATS account planex-default")
	cmd.Flags().BoolVar(&natsAdmin, "nats-admin", false, "also issue planex-nats-admin, an account admin of the default tenant's NATS account for planex backup and restore")
	return cmd
}

// parseTenants parses --tenant NAME=pool1,pool2 values into tenant →
// pools.
func parseTenants(flags []string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, f := range flags {
		name, list, _ := strings.Cut(f, "=")
		if err := natsauth.ValidTenant(name); err != nil {
			return nil, fmt.Errorf("--tenant %q: %w", f, err)
		}
		if _, ok := out[name]; ok {
			return nil, fmt.Errorf("--tenant %q: tenant %s given twice", f, name)
		}
		pools := []string{}
		for _, p := range strings.Split(list, ",") {
			if p == "" {
				continue
			}
			if !bus.ValidToken(p) {
				return nil, fmt.Errorf("--tenant %q: %q is not a pool name", f, p)
			}
			if !slices.Contains(pools, p) {
				pools = append(pools, p)
			}
		}
		out[name] = pools
	}
	return out, nil
}

// keptNkey returns the user nkey seed file holds and its public key, or a
// new seed when file does not exist: re-runs keep the keys NATS knows.
func keptNkey(file string) (seed []byte, pub string, err error) {
	seed, err = os.ReadFile(file)
	if os.IsNotExist(err) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, "", fmt.Errorf("generate NATS nkey: %w", err)
		}
		if seed, err = kp.Seed(); err != nil {
			return nil, "", err
		}
	} else if err != nil {
		return nil, "", fmt.Errorf("--out-dir: %w", err)
	}
	seed = bytes.TrimSpace(seed)
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		return nil, "", fmt.Errorf("--out-dir: NATS nkey seed %s: %w", file, err)
	}
	if pub, err = kp.PublicKey(); err != nil {
		return nil, "", err
	}
	return seed, pub, nil
}

// k8sSecrets generates the credentials into dir and returns the Secrets;
// with console, also the web console's server certificate for the Service
// planex-console and consoleHosts.
func k8sSecrets(dir, ns string, pools []string, validity time.Duration, console bool, consoleHosts []string) ([]secret, error) {
	return k8sSecretsWithTenants(dir, ns, pools, validity, console, consoleHosts, nil, false)
}

// firstTenantNotice is what k8s-secrets with tenants prints on stderr: the
// default tenant's users are in planex-default, which an installation with
// data in the global account must fill once.
const firstTenantNotice = `planex: with tenants, auth.conf puts the default tenant's NATS users in the account ` + natsauth.DefaultAccount + `, not in the
planex: global account where an installation without tenants keeps its streams. One that already has data moves it once
planex: (docs/tenancy.md, "Adding the first tenant to an existing installation"):
planex:   1. with the auth.conf of today plus an admin (this command with --nats-admin and without --tenant, applied, NATS
planex:      reloaded), stop the planex services and run planex backup --out DIR as that admin (Secret planex-nats-admin);
planex:   2. on a NATS cluster, delete the global account's streams now, as that admin (nats stream rm; the backup holds
planex:      them): restarted with accounts, a node reports them as not current on /healthz for good;
planex:   3. apply these Secrets (generated with --nats-admin too) and let NATS reload, or restart it one node at a time;
planex:   4. planex restore --in DIR as the same admin, now in ` + natsauth.DefaultAccount + `;
planex:   5. start the services, the supervisors with each tenant's supervisor.nk under --tenant-credentials-dir.
`

// k8sSecretsWithTenants is k8sSecrets where tenants (tenant → pools) also
// get a Secret of nkey seeds each and an account in auth.conf, the default
// tenant's users then in natsauth.DefaultAccount; with admin, the default
// tenant's account also gets an account admin (Secret planex-nats-admin).
// What dir already holds from an earlier run (CA, nkeys, step keys, admin
// API key) is kept.
func k8sSecretsWithTenants(dir, ns string, pools []string, validity time.Duration, console bool, consoleHosts []string, tenants map[string][]string, admin bool) ([]secret, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--out-dir: %w", err)
	}
	caCert, caKeyFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	var ca *tlsconfig.CA
	if _, err := os.Stat(caKeyFile); err == nil {
		if ca, err = tlsconfig.LoadCA(caCert, caKeyFile); err != nil {
			return nil, fmt.Errorf("--out-dir: %w", err)
		}
	} else {
		if ca, err = tlsconfig.NewCA("planex CA ("+ns+")", 10*validity); err != nil {
			return nil, err
		}
		caKey, err := ca.KeyPEM()
		if err != nil {
			return nil, err
		}
		if err := tlsconfig.WriteFileAtomic(caKeyFile, caKey, 0o600); err != nil {
			return nil, err
		}
		if err := tlsconfig.WriteFileAtomic(caCert, ca.CertPEM, 0o644); err != nil {
			return nil, err
		}
	}
	// Names a client may dial: the Service in every DNS form, and loopback
	// for `kubectl port-forward`.
	hosts := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, n, n+"."+ns, n+"."+ns+".svc", n+"."+ns+".svc.cluster.local")
		}
		return append(out, "localhost", "127.0.0.1", "::1")
	}
	tlsSecret := func(name string, l tlsconfig.Leaf) (secret, error) {
		l.Validity = validity
		c, k, err := ca.Issue(l)
		if err != nil {
			return secret{}, err
		}
		return secret{name: name, typ: "kubernetes.io/tls", data: map[string][]byte{"tls.crt": c, "tls.key": k, "ca.crt": ca.CertPEM}}, nil
	}
	var out []secret
	services := natsauth.Services(pools...)
	nkeysPub := map[string]string{}
	for _, svc := range services {
		l := tlsconfig.Leaf{CommonName: "planex-" + svc, URIs: []string{"spiffe://planex/" + ns + "/" + svc},
			Hosts: hosts("planex-" + svc), Server: true, Client: true}
		if svc == "supervisor" {
			l.OrganizationalUnits = []string{authn.RoleAdmin.String()} // it calls PlannerService.Plan
		}
		s, err := tlsSecret("planex-tls-"+svc, l)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
		name := "planex-nats-" + svc
		seed, pub, err := keptNkey(filepath.Join(dir, "secrets", name, "nkey"))
		if err != nil {
			return nil, fmt.Errorf("NATS nkey of %s: %w", svc, err)
		}
		nkeysPub[svc] = pub
		out = append(out, secret{name: name, typ: "Opaque", data: map[string][]byte{"nkey": seed}})
	}
	tenantPub := map[string]map[string]string{}
	tenantNames := make([]string, 0, len(tenants))
	for tn := range tenants {
		tenantNames = append(tenantNames, tn)
	}
	slices.Sort(tenantNames)
	for _, tn := range tenantNames {
		name := "planex-tenant-" + tn + "-nats"
		sec := secret{name: name, typ: "Opaque", data: map[string][]byte{}}
		tenantPub[tn] = map[string]string{}
		for _, svc := range natsauth.TenantServices(tenants[tn]...) {
			seed, pub, err := keptNkey(filepath.Join(dir, "secrets", name, svc+".nk"))
			if err != nil {
				return nil, fmt.Errorf("tenant %s: NATS nkey of %s: %w", tn, svc, err)
			}
			sec.data[svc+".nk"], tenantPub[tn][svc] = seed, pub
		}
		out = append(out, sec)
	}
	if console {
		// A server certificate only: the console calls the supervisor
		// without a client certificate (each browser signs in with its own
		// token), and it has no NATS identity.
		s, err := tlsSecret("planex-tls-console", tlsconfig.Leaf{CommonName: "planex-console",
			Hosts: append(hosts("planex-console"), consoleHosts...), Server: true})
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	natsHosts := append(hosts("nats"), "*.nats-headless", "*.nats-headless."+ns, "*.nats-headless."+ns+".svc", "*.nats-headless."+ns+".svc.cluster.local")
	s, err := tlsSecret("nats-tls", tlsconfig.Leaf{CommonName: "nats", Hosts: natsHosts, Server: true, Client: true})
	if err != nil {
		return nil, err
	}
	out = append(out, s)
	// A stock nats-server started with tenant accounts gives $G no
	// JetStream: the default tenant goes into an account of its own.
	authOpts := natsauth.ServerConfigOptions{DefaultAccount: true}
	if admin {
		seed, pub, err := keptNkey(filepath.Join(dir, "secrets", "planex-nats-admin", "nkey"))
		if err != nil {
			return nil, fmt.Errorf("NATS nkey of the account admin: %w", err)
		}
		authOpts.Admin = pub
		out = append(out, secret{name: "planex-nats-admin", typ: "Opaque", data: map[string][]byte{"nkey": seed}})
	}
	authConf, err := natsauth.ServerConfigWithOptions(nkeysPub, tenantPub, authOpts)
	if err != nil {
		return nil, err
	}
	out = append(out, secret{name: "nats-auth", typ: "Opaque", data: map[string][]byte{"auth.conf": []byte(authConf)}})

	signingFile, verifyDir := filepath.Join(dir, "step-signing.key"), filepath.Join(dir, "step-verify")
	var kid string
	if signer, err := stepsign.LoadSigner(signingFile); err == nil {
		kid = signer.KeyID()
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("--out-dir: %w", err)
	} else if kid, err = stepsign.GenerateKeyFiles(signingFile, verifyDir); err != nil {
		return nil, err
	}
	priv, err := os.ReadFile(signingFile)
	if err != nil {
		return nil, err
	}
	out = append(out, secret{name: "planex-step-signing", typ: "Opaque", data: map[string][]byte{"step-signing.key": priv}})
	verify := secret{name: "planex-step-verify", typ: "Opaque", data: map[string][]byte{}}
	entries, err := os.ReadDir(verifyDir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries { // every trusted key: rotation keeps the old ones until removed
		b, err := os.ReadFile(filepath.Join(verifyDir, e.Name()))
		if err != nil {
			return nil, err
		}
		verify.data[e.Name()] = b
	}
	if _, ok := verify.data[kid+".pem"]; !ok {
		return nil, fmt.Errorf("step verify key %s.pem missing in %s", kid, verifyDir)
	}
	out = append(out, verify)

	apiKeys, err := os.ReadFile(filepath.Join(dir, "secrets", "planex-api-keys", "api-keys"))
	if _, terr := os.Stat(filepath.Join(dir, "admin.token")); err != nil || terr != nil {
		key, line, err := authn.GenerateAPIKey("admin", authn.RoleAdmin)
		if err != nil {
			return nil, err
		}
		if err := tlsconfig.WriteFileAtomic(filepath.Join(dir, "admin.token"), []byte(key+"\n"), 0o600); err != nil {
			return nil, err
		}
		apiKeys = []byte("# planex API keys: sha256:<hex> <name> <roles>; add more with `planex auth api-key`\n" + line + "\n")
	}
	out = append(out, secret{name: "planex-api-keys", typ: "Opaque", data: map[string][]byte{"api-keys": apiKeys}})
	return out, nil
}

// writeSecrets prints secrets as a YAML stream of v1 Secrets.
func writeSecrets(w io.Writer, ns string, secrets []secret) error {
	var b strings.Builder
	for _, s := range secrets {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: %s\n  labels:\n    app.kubernetes.io/part-of: planex\ntype: %s\ndata:\n", s.name, ns, s.typ)
		keys := make([]string, 0, len(s.data))
		for k := range s.data {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "  %s: %s\n", k, base64.StdEncoding.EncodeToString(s.data[k]))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
