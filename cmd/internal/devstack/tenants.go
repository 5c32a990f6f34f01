package devstack

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/planex-dev/planex/internal/bus"
	"github.com/planex-dev/planex/internal/natsauth"
	"github.com/planex-dev/planex/internal/tlsconfig"
)

// The dev stack serves tenants without a restart: when the supervisor
// first connects to a tenant created through its API (TenantService), the
// stack gives the tenant NATS credentials (Credentials.EnsureTenant),
// admits them to the embedded server in the tenant's own account
// (Credentials.AdmitTenant: no configuration reload) and connects with the
// tenant's supervisor seed — within a reconcile round of the supervisor
// (seconds).

// connectTenant is the supervisor's TenantConnect in the dev stack.
func (s *Stack) connectTenant(logger *slog.Logger) func(ctx context.Context, tenant string) (*nats.Conn, error) {
	return func(ctx context.Context, tenant string) (*nats.Conn, error) {
		tc, err := s.ensureTenantAccount(tenant)
		if err != nil {
			return nil, err
		}
		opts, err := natsauth.Options{NKeySeedFile: tc}.NATSOptions()
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return bus.Connect(cctx, s.NATSURL, "planex-"+natsauth.Supervisor, logger.With("tenant", tenant), opts...)
	}
}

// ensureTenantAccount gives tenant its NATS identities and admits them to
// the embedded server in the tenant's account; it returns the tenant's
// supervisor seed file.
func (s *Stack) ensureTenantAccount(tenant string) (string, error) {
	s.tenantMu.Lock()
	defer s.tenantMu.Unlock()
	// Identities for the dev pools too, so that an executor can serve the
	// tenant: planex executor --pool sql --tenant <t> --nats-nkey-file
	// <data-dir>/credentials/nats/tenants/<t>/executor-sql.nk.
	tc, err := s.Credentials.EnsureTenant(tenant, devPools)
	if err != nil {
		return "", fmt.Errorf("tenant %s: NATS credentials: %w", tenant, err)
	}
	if err := s.Credentials.AdmitTenant(tenant); err != nil {
		return "", err
	}
	return tc.SeedFiles[natsauth.Supervisor], nil
}

// cliPlatformAdmin gives the dev CLI's API key (dev-cli) the
// platform-admin role, so that `planex tenants` works against `planex
// dev`; data directories made before tenants hold it as admin.
func cliPlatformAdmin(apiKeysFile string) error {
	data, err := os.ReadFile(apiKeysFile)
	if err != nil {
		return fmt.Errorf("dev API keys: %w", err)
	}
	lines := bytes.Split(data, []byte("\n"))
	changed := false
	for i, l := range lines {
		f := strings.Fields(string(l))
		if len(f) >= 3 && f[1] == "dev-cli" && f[2] == "admin" {
			f[2] = "platform-admin"
			lines[i] = []byte(strings.Join(f, " "))
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return tlsconfig.WriteFileAtomic(apiKeysFile, bytes.Join(lines, []byte("\n")), 0o600)
}
