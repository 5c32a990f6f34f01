package supervisor_test

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// TestRunsSurviveAnotherTenantsAddition: adding a tenant to a stock
// nats-server is a configuration reload (the reloader sidecar; natstest
// AddTenant), and while it runs the other tenants' accounts answer their
// JetStream API calls 503 "jetstream not enabled" (10076) — 1,170 of
// 1,512 AccountInfo calls of a tenant's supervisor across four reloads.
// Tenant a's runs, started before, during and after six other tenants
// are added, must all succeed.
//
// It does not yet: in about one attempt of three a run of a stays
// RUNNING with its last chain step DISPATCHED (directly, in the run log)
// and never delivered to the pool — the step went into PLANEX_EVENTS
// while the reload stopped and restored the account's streams and
// consumers (the pool saw its earlier steps up to three times). And under
// -race nats-server's reload races with itself (setOpts against
// getDirectRequest, configureAccounts against setupResponseServiceImport).
// So it runs only when asked: PLANEX_TEST_TENANT_RELOAD=1 go test -run
// TestRunsSurviveAnotherTenantsAddition ./services/supervisor/ (issue 31:
// tenants added without a reload — the NATS account resolver — or a
// dispatch that a lost delivery cannot strand).
func TestRunsSurviveAnotherTenantsAddition(t *testing.T) {
	if os.Getenv("PLANEX_TEST_TENANT_RELOAD") == "" {
		t.Skip("reproduces an open defect (a step dispatched during another tenant's NATS reload is never delivered); PLANEX_TEST_TENANT_RELOAD=1 runs it")
	}
	t.Parallel()
	s := startTenantStack(t, 1, map[string][]string{"a": {"test"}}, map[string]string{"pa": "platform-admin", "a": "admin a"})
	admin := s.tenants("pa")
	ctx := testCtx(t, 3*time.Minute)
	if _, err := admin.CreateTenant(ctx, &planexv1.CreateTenantRequest{Tenant: &planexv1.Tenant{Name: "a", Pools: []string{"test"}}}); err != nil {
		t.Fatal(err)
	}
	waitTenant(t, admin, "a", true, 30*time.Second)
	pool := startTenantPool(t, s.nats, "a")
	t.Cleanup(func() {
		if t.Failed() {
			pool.mu.Lock()
			defer pool.mu.Unlock()
			t.Logf("pool executions %v", pool.execs)
			t.Logf("pool reports %v", pool.reports)
		}
	})
	a := s.runs("a")
	s.planner.on("chain", always(
		step("s1", "test.sleep", map[string]any{"ms": 1}),
		step("s2", "test.sleep", map[string]any{"ms": 1}, "s1"),
		step("s3", "test.echo", map[string]any{"value": "x"}, "s2"),
	))

	// A probe in a's account proves the blip happened beside the runs.
	probe, err := jetstream.New(s.nats.Connect(t, "a", "supervisor", nil))
	if err != nil {
		t.Fatal(err)
	}
	var blips atomic.Int64
	var mu sync.Mutex
	var ids []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := probe.AccountInfo(ctx); errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
				blips.Add(1)
			}
		}
	}()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := a.StartRun(ctx, &planexv1.StartRunRequest{Goal: "chain"})
				if err != nil {
					t.Errorf("StartRun during the reloads: %v", err)
					return
				}
				mu.Lock()
				ids = append(ids, resp.GetRun().GetId())
				mu.Unlock()
			}
		}()
	}
	for i := range 6 {
		s.nats.AddTenant(t, fmt.Sprintf("new%d", i), "test")
	}
	close(stop)
	wg.Wait()
	if len(ids) == 0 || blips.Load() == 0 {
		t.Fatalf("%d runs started, %d JetStream calls refused in a's account: the reloads disturbed nothing to survive", len(ids), blips.Load())
	}
	for _, id := range ids {
		if run := waitTerminal(t, a, id, time.Minute); run.GetStatus() != planexv1.RunStatus_RUN_STATUS_SUCCEEDED {
			t.Errorf("run %s: %s %s %q", id, run.GetStatus(), run.GetStopReason(), run.GetStopMessage())
		}
	}
	t.Logf("%d runs of tenant a across 6 tenants added (%d JetStream calls refused meanwhile)", len(ids), blips.Load())
}
