package devstack

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/planex-dev/planex/internal/authn"
	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/stepsign"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// Credentials are the dev stack's keys and certificates, generated into
// <data-dir>/credentials on first start and reused on restarts, so that
// `planex dev` runs with TLS, authentication, NATS users and signed steps
// on and nothing to configure:
//
//	ca.pem, ca-key.pem          the stack's CA
//	services.pem, -key.pem      every service's certificate (127.0.0.1, OU admin)
//	api-keys                    hashed API keys (one, admin, for the CLI)
//	cli.token                   the CLI's API key (0600)
//	step-signing.key            the supervisor's step signing key
//	step-verify/<key id>.pem    the executors' trusted public keys
//	nats/<service>.nk           NATS user nkey seeds, one per service
//	nats/tenants/<tenant>/<service>.nk
//	                            a tenant's NATS user nkey seeds (EnsureTenant)
type Credentials struct {
	// Dir is <data-dir>/credentials.
	Dir string
	// CAFile is the CA bundle.
	CAFile string
	// Services is the certificate every service serves and presents.
	Services tlsconfig.Files
	// APIKeysFile is the hashed API key file.
	APIKeysFile string
	// CLITokenFile holds the CLI's admin API key.
	CLITokenFile string
	// SigningKeyFile is the supervisor's step signing key.
	SigningKeyFile string
	// VerifyKeysDir holds the executors' trusted step keys.
	VerifyKeysDir string
	// NATSSeedFiles maps a service ("supervisor", "planner",
	// "executor-sql"...) to its nkey seed file.
	NATSSeedFiles map[string]string
	// natsPublic maps a service to its public nkey.
	natsPublic map[string]string

	// auth admits the services' and tenants' nkeys to the embedded server.
	auth *natsauth.Embedded

	mu      sync.Mutex
	tenants map[string]TenantCredentials // by tenant
}

// devPools are the dev stack's executor pools (mcp runs only with
// --mcp-config; its NATS identity always exists).
var devPools = []string{"sql", "email", "search", "mcp"}

// EnsureCredentials generates what is missing in <dataDir>/credentials.
// extraPools are out-of-tree executor pools (`planex dev --pool-identity`)
// that get a NATS identity, credentials/nats/executor-<pool>.nk, like the
// dev pools.
func EnsureCredentials(dataDir string, extraPools ...string) (*Credentials, error) {
	pools := slices.Clone(devPools)
	for _, p := range extraPools {
		if !bus.ValidToken(p) || strings.Contains(p, ".") {
			return nil, fmt.Errorf("--pool-identity %q: want a pool name (letters, digits, '-' or '_')", p)
		}
		if !slices.Contains(pools, p) {
			pools = append(pools, p)
		}
	}
	dir := filepath.Join(dataDir, "credentials")
	if err := os.MkdirAll(filepath.Join(dir, "nats"), 0o700); err != nil {
		return nil, fmt.Errorf("--data-dir: credentials: %w", err)
	}
	c := &Credentials{
		Dir: dir, CAFile: filepath.Join(dir, "ca.pem"),
		Services:       tlsconfig.Files{CertFile: filepath.Join(dir, "services.pem"), KeyFile: filepath.Join(dir, "services-key.pem"), CAFile: filepath.Join(dir, "ca.pem")},
		APIKeysFile:    filepath.Join(dir, "api-keys"),
		CLITokenFile:   filepath.Join(dir, "cli.token"),
		SigningKeyFile: filepath.Join(dir, "step-signing.key"),
		VerifyKeysDir:  filepath.Join(dir, "step-verify"),
		NATSSeedFiles:  map[string]string{},
		natsPublic:     map[string]string{},
		auth:           natsauth.NewEmbedded(),
	}
	caKey := filepath.Join(dir, "ca-key.pem")
	var ca *tlsconfig.CA
	if exists(c.CAFile) && exists(caKey) {
		var err error
		if ca, err = tlsconfig.LoadCA(c.CAFile, caKey); err != nil {
			return nil, err
		}
	} else {
		var err error
		if ca, err = tlsconfig.NewCA("planex dev CA", 10*365*24*time.Hour); err != nil {
			return nil, err
		}
		key, err := ca.KeyPEM()
		if err != nil {
			return nil, err
		}
		if err := tlsconfig.WriteFileAtomic(caKey, key, 0o600); err != nil {
			return nil, err
		}
		if err := tlsconfig.WriteFileAtomic(c.CAFile, ca.CertPEM, 0o644); err != nil {
			return nil, err
		}
	}
	if !exists(c.Services.CertFile) || expiresWithin(c.Services.CertFile, 30*24*time.Hour) {
		if _, err := ca.IssueFiles(dir, "services", c.CAFile, tlsconfig.Leaf{
			CommonName: "planex-dev-services", OrganizationalUnits: []string{"admin"},
			Hosts: []string{"127.0.0.1", "::1", "localhost"}, Server: true, Client: true, Validity: 365 * 24 * time.Hour,
		}); err != nil {
			return nil, err
		}
	}
	if !exists(c.APIKeysFile) || !exists(c.CLITokenFile) {
		key, line, err := authn.GenerateAPIKey("dev-cli", authn.RoleAdmin)
		if err != nil {
			return nil, err
		}
		if err := tlsconfig.WriteFileAtomic(c.CLITokenFile, []byte(key+"\n"), 0o600); err != nil {
			return nil, err
		}
		if err := tlsconfig.WriteFileAtomic(c.APIKeysFile, []byte("# planex dev: hashed API keys (sha256:<hex> <name> <roles>)\n"+line+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	if !exists(c.SigningKeyFile) {
		if _, err := stepsign.GenerateKeyFiles(c.SigningKeyFile, c.VerifyKeysDir); err != nil {
			return nil, err
		}
	}
	for _, svc := range natsauth.Services(pools...) {
		seedFile := filepath.Join(dir, "nats", svc+".nk")
		seed, err := os.ReadFile(seedFile)
		if err != nil {
			kp, err := nkeys.CreateUser()
			if err != nil {
				return nil, fmt.Errorf("generate NATS nkey for %s: %w", svc, err)
			}
			if seed, err = kp.Seed(); err != nil {
				return nil, err
			}
			if err := tlsconfig.WriteFileAtomic(seedFile, seed, 0o600); err != nil {
				return nil, err
			}
		}
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
		if err != nil {
			return nil, fmt.Errorf("NATS nkey seed %s: %w", seedFile, err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, err
		}
		c.NATSSeedFiles[svc], c.natsPublic[svc] = seedFile, pub
	}
	// Tenants added before (EnsureTenant) keep their accounts.
	entries, err := os.ReadDir(filepath.Join(dir, "nats", "tenants"))
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("NATS tenant credentials: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if _, err := c.EnsureTenant(e.Name(), nil); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// ensureSeed returns the public nkey of the user seed in file, generating
// the seed (0600) when the file does not exist.
func ensureSeed(file string) (string, error) {
	seed, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return "", fmt.Errorf("generate NATS nkey %s: %w", file, err)
		}
		if seed, err = kp.Seed(); err != nil {
			return "", err
		}
		if err := tlsconfig.WriteFileAtomic(file, seed, 0o600); err != nil {
			return "", err
		}
	} else if err != nil {
		return "", fmt.Errorf("NATS nkey seed %s: %w", file, err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
	if err != nil {
		return "", fmt.Errorf("NATS nkey seed %s: %w", file, err)
	}
	return kp.PublicKey()
}

// TenantCredentials are one tenant's NATS identities in the dev stack:
// its supervisor and an executor per pool, users of the tenant's own
// account natsauth.TenantAccount(Tenant).
type TenantCredentials struct {
	// Tenant is the tenant's name.
	Tenant string
	// Account is its NATS account.
	Account string
	// SeedFiles maps an identity ("supervisor", "executor-<pool>") to its
	// nkey seed file, credentials/nats/tenants/<tenant>/<identity>.nk.
	SeedFiles map[string]string
	// PublicKeys maps an identity to its public nkey.
	PublicKeys map[string]string
}

// EnsureTenant gives tenant (not the default one) NATS identities: its
// supervisor and executor-<pool> for each of pools, generating the seeds
// that are missing and keeping the others (so do identities of pools
// granted earlier). It returns every identity the tenant has. The
// embedded server admits them after ServeNATS or AdmitTenant.
func (c *Credentials) EnsureTenant(tenant string, pools []string) (TenantCredentials, error) {
	if err := natsauth.ValidTenant(tenant); err != nil {
		return TenantCredentials{}, err
	}
	for _, p := range pools {
		if !bus.ValidToken(p) || strings.Contains(p, ".") {
			return TenantCredentials{}, fmt.Errorf("tenant %s: pool %q: want a pool name (letters, digits, '-' or '_')", tenant, p)
		}
	}
	dir := filepath.Join(c.Dir, "nats", "tenants", tenant)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return TenantCredentials{}, fmt.Errorf("tenant %s: NATS credentials: %w", tenant, err)
	}
	identities := natsauth.TenantServices(pools...)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return TenantCredentials{}, fmt.Errorf("tenant %s: NATS credentials: %w", tenant, err)
	}
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), ".nk"); ok && !e.IsDir() && !slices.Contains(identities, id) {
			if _, err := natsauth.ForService(id); err != nil || id == natsauth.Planner {
				return TenantCredentials{}, fmt.Errorf("tenant %s: %s: not a tenant identity (supervisor, executor-<pool>)", tenant, filepath.Join(dir, e.Name()))
			}
			identities = append(identities, id)
		}
	}
	tc := TenantCredentials{Tenant: tenant, Account: natsauth.TenantAccount(tenant), SeedFiles: map[string]string{}, PublicKeys: map[string]string{}}
	for _, id := range identities {
		file := filepath.Join(dir, id+".nk")
		pub, err := ensureSeed(file)
		if err != nil {
			return TenantCredentials{}, fmt.Errorf("tenant %s: %w", tenant, err)
		}
		tc.SeedFiles[id], tc.PublicKeys[id] = file, pub
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tenants == nil {
		c.tenants = map[string]TenantCredentials{}
	}
	c.tenants[tenant] = tc
	return tc, nil
}

// ConfigureNATS makes opts, the embedded server's options, authenticate
// its clients through the stack's natsauth.Embedded: each service and
// tenant identity by its nkey, in its account, with its
// natsauth.ForService permissions.
func (c *Credentials) ConfigureNATS(opts *server.Options) {
	c.auth.Configure(opts)
}

// ServeNATS binds the authenticator to ns, the server started from the
// options ConfigureNATS changed (ready for connections), and admits the
// stack's services in the global account, with JetStream, and every
// tenant EnsureTenant gave identities in an account of its own.
func (c *Credentials) ServeNATS(ns *server.Server) error {
	c.auth.Bind(ns)
	if err := c.auth.SetAccount(natsauth.GlobalAccount, c.natsPublic); err != nil {
		return fmt.Errorf("embedded NATS: %w", err)
	}
	c.mu.Lock()
	tenants := maps.Clone(c.tenants)
	c.mu.Unlock()
	for tn := range tenants {
		if err := c.AdmitTenant(tn); err != nil {
			return err
		}
	}
	return nil
}

// AdmitTenant admits tenant's identities (EnsureTenant) to the running
// embedded server in the tenant's own account, which it creates with
// JetStream the first time. There is no configuration reload: the other
// accounts' connections and JetStream calls go on undisturbed (a reload
// made them fail with "jetstream not enabled" while it ran, and raced
// inside nats-server; natsauth.Embedded).
func (c *Credentials) AdmitTenant(tenant string) error {
	c.mu.Lock()
	tc, ok := c.tenants[tenant]
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("tenant %s: no NATS identities (EnsureTenant)", tenant)
	}
	if err := c.auth.SetAccount(tc.Account, tc.PublicKeys); err != nil {
		return fmt.Errorf("tenant %s: embedded NATS: %w", tenant, err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func expiresWithin(certFile string, d time.Duration) bool {
	r, err := tlsconfig.NewReloader(tlsconfig.Files{CertFile: certFile, KeyFile: strings.TrimSuffix(certFile, ".pem") + "-key.pem"})
	if err != nil {
		return true
	}
	leaf, err := r.Leaf()
	return err != nil || time.Until(leaf.NotAfter) < d
}

// ClientContext tells a client on this machine how to reach a running dev
// stack: its CA bundle and the CLI's token file, and its NATS server with
// the supervisor's nkey seed (for the commands that read the run logs
// themselves: runs export, audit verify, replay). `planex dev` writes one
// per supervisor address into the user's config directory, so client
// commands pointed at that address authenticate with no flags.
type ClientContext struct {
	// Addr is the supervisor's address.
	Addr string `json:"addr"`
	// CAFile verifies the supervisor's certificate.
	CAFile string `json:"ca_file"`
	// TokenFile holds the CLI's API key.
	TokenFile string `json:"token_file"`
	// NATSURL is the embedded NATS server's client URL.
	NATSURL string `json:"nats_url,omitempty"`
	// NATSSeedFile holds the supervisor's NATS nkey seed.
	NATSSeedFile string `json:"nats_seed_file,omitempty"`
}

func contextPath(addr string) (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	name := strings.NewReplacer(":", "_", "/", "_", "[", "", "]", "").Replace(host) + "_" + port + ".json"
	return filepath.Join(dir, "planex", "dev-contexts", name), nil
}

// running are the contexts of the stacks running in this process (`planex
// run --dev`), found even where no config directory can be written.
var running sync.Map // addr → ClientContext

// writeContext records how to reach the stack at addr, whose NATS server
// serves natsURL.
func writeContext(addr, natsURL string, c *Credentials) (string, error) {
	cc := ClientContext{Addr: addr, CAFile: c.CAFile, TokenFile: c.CLITokenFile, NATSURL: natsURL, NATSSeedFile: c.NATSSeedFiles["supervisor"]}
	running.Store(addr, cc)
	path, err := contextPath(addr)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	b, err := json.Marshal(cc)
	if err != nil {
		return "", err
	}
	return path, tlsconfig.WriteFileAtomic(path, b, 0o600)
}

// LookupClientContext returns the context a dev stack wrote for addr, when
// it exists and its files are still there.
func LookupClientContext(addr string) (ClientContext, bool) {
	if host, port, err := net.SplitHostPort(addr); err == nil && host == "localhost" {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	if cc, ok := running.Load(addr); ok {
		return cc.(ClientContext), true
	}
	path, err := contextPath(addr)
	if err != nil {
		return ClientContext{}, false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ClientContext{}, false
	}
	var cc ClientContext
	if err := json.Unmarshal(b, &cc); err != nil || !exists(cc.CAFile) || !exists(cc.TokenFile) {
		return ClientContext{}, false
	}
	return cc, true
}

// forgetContext removes the context of a stopped stack.
func forgetContext(addr, file string) {
	running.Delete(addr)
	if file != "" {
		_ = os.Remove(file)
	}
}
