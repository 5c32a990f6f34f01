package supervisor_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/authn/authntest"
	"github.com/planex-dev/planex/internal/natstest"
	"github.com/planex-dev/planex/internal/tlsconfig"
	"github.com/planex-dev/planex/services/supervisor"
)

// startSecured runs a supervisor with TLS, client certificates, API keys
// and JWTs on (the planner is unreachable: runs stay in planning, which is
// all the API needs).
func startSecured(t *testing.T, f *authntest.Fixture, extra ...string) string {
	t.Helper()
	srv := natstest.Start(t)
	args := append([]string{"--grpc-addr", "127.0.0.1:0", "--nats-url", srv.URL(), "--planner-addr", "127.0.0.1:1",
		"--shutdown-grace", "2s", "--planner-timeout", "1s"}, f.ServerArgs()...)
	cfg := parse(t, append(args, extra...)...)
	ready := make(chan net.Addr, 1)
	cfg.OnReady = func(a net.Addr) { ready <- a }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- supervisor.Run(ctx, cfg, natstest.Logger(t), nil) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case a := <-ready:
		return a.String()
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("supervisor not ready")
	}
	return ""
}

// rpcCall calls one SupervisorService method; runID is a run the caller
// started (for CancelRun) or any run.
type rpcCall struct {
	name string
	need string // role the method needs
	call func(ctx context.Context, c planexv1.SupervisorServiceClient, runID string) error
	ok   codes.Code // the code of an authorised call
}

var rpcs = []rpcCall{
	{"GetRun", "viewer", func(ctx context.Context, c planexv1.SupervisorServiceClient, id string) error {
		_, err := c.GetRun(ctx, &planexv1.GetRunRequest{RunId: id})
		return err
	}, codes.OK},
	{"ListRuns", "viewer", func(ctx context.Context, c planexv1.SupervisorServiceClient, _ string) error {
		_, err := c.ListRuns(ctx, &planexv1.ListRunsRequest{})
		return err
	}, codes.OK},
	{"WatchRun", "viewer", func(ctx context.Context, c planexv1.SupervisorServiceClient, id string) error {
		s, err := c.WatchRun(ctx, &planexv1.WatchRunRequest{RunId: id})
		if err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	}, codes.OK},
	{"ListTools", "viewer", func(ctx context.Context, c planexv1.SupervisorServiceClient, _ string) error {
		_, err := c.ListTools(ctx, &planexv1.ListToolsRequest{})
		return err
	}, codes.OK},
	{"StartRun", "runner", func(ctx context.Context, c planexv1.SupervisorServiceClient, _ string) error {
		_, err := c.StartRun(ctx, &planexv1.StartRunRequest{Goal: "count tickets"})
		return err
	}, codes.OK},
	{"CancelRun", "runner", func(ctx context.Context, c planexv1.SupervisorServiceClient, id string) error {
		_, err := c.CancelRun(ctx, &planexv1.CancelRunRequest{RunId: id, Reason: "test"})
		return err
	}, codes.OK},
	// Authorised, Decide reaches the run and finds no such gate.
	{"Decide", "approver", func(ctx context.Context, c planexv1.SupervisorServiceClient, id string) error {
		_, err := c.Decide(ctx, &planexv1.DecideRequest{RunId: id, GateId: "g-none", Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE})
		return err
	}, codes.NotFound},
}

// below is a role that does not reach need ("" has no planex role).
var below = map[string]string{"viewer": "", "runner": "viewer", "approver": "runner"}

// TestAuthorizationMatrix calls every SupervisorService method with no
// credentials, with a role below the one it needs, and with the role it
// needs, over mTLS, API keys and JWTs.
func TestAuthorizationMatrix(t *testing.T) {
	f := authntest.New(t)
	addr := startSecured(t, f)
	_, forged, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}

	type transport struct {
		name string
		// client returns a client with role ("" none); ok false when the
		// transport has no identity without a role.
		client func(role string) (planexv1.SupervisorServiceClient, bool)
	}
	transports := []transport{
		{"mtls", func(role string) (planexv1.SupervisorServiceClient, bool) {
			var roles []string
			if role != "" {
				roles = []string{role}
			}
			return planexv1.NewSupervisorServiceClient(f.Dial(addr, f.ClientCert("user-"+role, roles...), "")), true
		}},
		{"api-key", func(role string) (planexv1.SupervisorServiceClient, bool) {
			if role == "" {
				return nil, false // every key in the file has a role
			}
			return planexv1.NewSupervisorServiceClient(f.Dial(addr, tlsconfig.Files{}, f.APIKeys[role])), true
		}},
		{"jwt", func(role string) (planexv1.SupervisorServiceClient, bool) {
			roles := []string{"other-app-role"}
			if role != "" {
				roles = []string{role}
			}
			return planexv1.NewSupervisorServiceClient(f.Dial(addr, tlsconfig.Files{}, f.Token("user-"+role, roles, nil))), true
		}},
	}
	anonymous := planexv1.NewSupervisorServiceClient(f.Dial(addr, tlsconfig.Files{}, ""))
	badKey := planexv1.NewSupervisorServiceClient(f.Dial(addr, tlsconfig.Files{}, "pxk_not-a-key"))
	forgedJWT := planexv1.NewSupervisorServiceClient(f.Dial(addr, tlsconfig.Files{}, f.Token("mallory", []string{"admin"}, forged)))

	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			// Each transport's runner starts the run it cancels.
			runner, _ := tr.client("runner")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			started, err := runner.StartRun(ctx, &planexv1.StartRunRequest{Goal: "list open tickets"})
			if err != nil {
				t.Fatalf("StartRun as runner: %v", err)
			}
			runID := started.GetRun().GetId()
			if got := started.GetRun().GetStartedBy(); got == "" {
				t.Fatalf("run started_by is empty")
			}
			for _, rpc := range rpcs {
				t.Run(rpc.name, func(t *testing.T) {
					expect := func(what string, c planexv1.SupervisorServiceClient, want codes.Code, wantMsg string) {
						t.Helper()
						err := rpc.call(ctx, c, runID)
						st := status.Convert(err)
						if st.Code() != want {
							t.Fatalf("%s: %v, want %s", what, err, want)
						}
						if wantMsg != "" && st.Message() != wantMsg {
							t.Fatalf("%s: message %q leaks detail, want %q", what, st.Message(), wantMsg)
						}
					}
					expect("no credentials", anonymous, codes.Unauthenticated, "authentication required")
					expect("unknown API key", badKey, codes.Unauthenticated, "authentication required")
					expect("JWT signed by another key", forgedJWT, codes.Unauthenticated, "authentication required")
					if c, ok := tr.client(below[rpc.need]); ok {
						expect("role "+below[rpc.need], c, codes.PermissionDenied, "permission denied")
					}
					right := runner
					if rpc.need != "runner" {
						right, _ = tr.client(rpc.need)
					}
					expect("role "+rpc.need, right, rpc.ok, "")
				})
			}
		})
	}
}

// TestRunOwnership: a runner cancels only its own runs (admins any); an
// approver may not approve a run it started unless --allow-self-approval;
// decided and started runs name the authenticated identity.
func TestRunOwnership(t *testing.T) {
	f := authntest.New(t)
	addr := startSecured(t, f)
	client := func(role string) planexv1.SupervisorServiceClient {
		return planexv1.NewSupervisorServiceClient(f.Dial(addr, tlsconfig.Files{}, f.APIKeys[role]))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	approver, runner, admin := client("approver"), client("runner"), client("admin")
	mine, err := approver.StartRun(ctx, &planexv1.StartRunRequest{Goal: "list open tickets"})
	if err != nil {
		t.Fatal(err)
	}
	if got := mine.GetRun().GetStartedBy(); got != "apikey:approver-key" {
		t.Fatalf("started_by = %q, want apikey:approver-key", got)
	}
	id := mine.GetRun().GetId()
	if _, err := runner.CancelRun(ctx, &planexv1.CancelRunRequest{RunId: id}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("runner cancels another's run: %v, want PermissionDenied", err)
	}
	_, err = approver.Decide(ctx, &planexv1.DecideRequest{RunId: id, GateId: "g", Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE})
	if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != "permission denied" {
		t.Fatalf("approver approves own run: %v, want PermissionDenied", err)
	}
	_, err = admin.Decide(ctx, &planexv1.DecideRequest{RunId: id, GateId: "g", Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("admin decides another's run: %v, want NotFound (no such gate)", err)
	}
	if _, err := admin.CancelRun(ctx, &planexv1.CancelRunRequest{RunId: id}); err != nil {
		t.Fatalf("admin cancels any run: %v", err)
	}

	t.Run("self approval allowed by policy", func(t *testing.T) {
		addr := startSecured(t, f, "--allow-self-approval")
		c := planexv1.NewSupervisorServiceClient(f.Dial(addr, tlsconfig.Files{}, f.APIKeys["approver"]))
		r, err := c.StartRun(ctx, &planexv1.StartRunRequest{Goal: "list open tickets"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Decide(ctx, &planexv1.DecideRequest{RunId: r.GetRun().GetId(), GateId: "g", Decision: planexv1.DecisionKind_DECISION_KIND_APPROVE})
		if status.Code(err) != codes.NotFound {
			t.Fatalf("self approval with the policy: %v, want NotFound (no such gate)", err)
		}
	})
}

// TestPlaintextNeedsOptOut: without TLS files the supervisor refuses to
// start unless --plaintext is given.
func TestPlaintextNeedsOptOut(t *testing.T) {
	cfg := parse(t, "--nats-url", "nats://127.0.0.1:4222")
	err := cfg.Validate()
	if err == nil {
		t.Fatal("no TLS and no --plaintext: want an error")
	}
	for _, want := range []string{"--tls-cert-file", "--plaintext"} {
		if !contains(err.Error(), want) {
			t.Fatalf("error %q does not name %s", err, want)
		}
	}
}
