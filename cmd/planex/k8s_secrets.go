package main

import (
	"encoding/base64"
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

--out-dir keeps what the operator needs afterwards: ca.crt and ca.key (to
issue more certificates), admin.token (the admin API key, for
'planex --token-file'), the step keys, and every Secret's files as
secrets/<name>/<key> (the NATS authorization block, the nkey seeds, the
certificates: for NATS or planex outside Kubernetes). Nothing secret is
printed to the terminal but the Secret manifests on stdout.`,
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
			secrets, err := k8sSecrets(outDir, namespace, pools, validity, console, consoleHosts)
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
			return nil
		},
	}
	cmd.Flags().StringVar(&namespace, "namespace", "planex", "namespace the Secrets (and the certificates' DNS names) are for")
	cmd.Flags().StringSliceVar(&pools, "pools", []string{"sql", "email", "search"}, "executor pools to make identities for (comma separated)")
	cmd.Flags().StringVar(&outDir, "out-dir", "planex-credentials", "directory for the CA, the admin API key and the step keys (created 0700)")
	cmd.Flags().DurationVar(&validity, "cert-validity", 365*24*time.Hour, "validity of the issued certificates (the CA gets ten times as long)")
	cmd.Flags().BoolVar(&console, "console", false, "also issue planex-tls-console, the web console's server certificate")
	cmd.Flags().StringSliceVar(&consoleHosts, "console-hosts", nil, "with --console: public DNS names of the console (the ingress host) added to its certificate")
	return cmd
}

// k8sSecrets generates the credentials into dir and returns the Secrets;
// with console, also the web console's server certificate for the Service
// planex-console and consoleHosts.
func k8sSecrets(dir, ns string, pools []string, validity time.Duration, console bool, consoleHosts []string) ([]secret, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--out-dir: %w", err)
	}
	ca, err := tlsconfig.NewCA("planex CA ("+ns+")", 10*validity)
	if err != nil {
		return nil, err
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := tlsconfig.WriteFileAtomic(filepath.Join(dir, "ca.key"), caKey, 0o600); err != nil {
		return nil, err
	}
	if err := tlsconfig.WriteFileAtomic(filepath.Join(dir, "ca.crt"), ca.CertPEM, 0o644); err != nil {
		return nil, err
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
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, fmt.Errorf("generate NATS nkey for %s: %w", svc, err)
		}
		seed, err := kp.Seed()
		if err != nil {
			return nil, err
		}
		if nkeysPub[svc], err = kp.PublicKey(); err != nil {
			return nil, err
		}
		out = append(out, secret{name: "planex-nats-" + svc, typ: "Opaque", data: map[string][]byte{"nkey": seed}})
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
	authConf, err := natsauth.ServerConfig(nkeysPub)
	if err != nil {
		return nil, err
	}
	out = append(out, secret{name: "nats-auth", typ: "Opaque", data: map[string][]byte{"auth.conf": []byte(authConf)}})

	signingFile, verifyDir := filepath.Join(dir, "step-signing.key"), filepath.Join(dir, "step-verify")
	kid, err := stepsign.GenerateKeyFiles(signingFile, verifyDir)
	if err != nil {
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

	key, line, err := authn.GenerateAPIKey("admin", authn.RoleAdmin)
	if err != nil {
		return nil, err
	}
	if err := tlsconfig.WriteFileAtomic(filepath.Join(dir, "admin.token"), []byte(key+"\n"), 0o600); err != nil {
		return nil, err
	}
	out = append(out, secret{name: "planex-api-keys", typ: "Opaque", data: map[string][]byte{
		"api-keys": []byte("# planex API keys: sha256:<hex> <name> <roles>; add more with `planex auth api-key`\n" + line + "\n")}})
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
