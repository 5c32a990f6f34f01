package main

import (
	"bytes"
	"context"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/gen/planex/v1/planexv1connect"
	"github.com/planex-dev/planex/internal/natstest"
)

// TestConsoleFlagErrors: bad console flags stop the command before it
// listens or dials, with an error naming the flag.
func TestConsoleFlagErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"public address without TLS", []string{"console", "--http-addr", "0.0.0.0:7480"}, "--http-addr"},
		{"jaeger URL not http", []string{"console", "--jaeger-url", "ftp://jaeger"}, "--jaeger-url"},
		{"half a TLS pair", []string{"console", "--http-tls-cert-file", "c.pem"}, "--http-tls-key-file"},
		{"missing CA file", []string{"console", "--tls-ca-file", "/nonexistent/ca.pem"}, "--tls-ca-file"},
		{"dev console on a public address", []string{"dev", "--data-dir", "", "--console-addr", "0.0.0.0:7480"}, "--console-addr"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.args[0] == "dev" {
				tt.args[2] = t.TempDir()
			}
			root := newRootCmd()
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&out)
			root.SetArgs(tt.args)
			err := root.Execute()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%v: %v, want an error naming %s\n%s", tt.args, err, tt.want, out.String())
			}
		})
	}
}

// TestConsoleAgainstPlaintextSupervisor: `planex console --plaintext` in
// front of a supervisor started with --plaintext --auth-disabled serves the
// UI and SupervisorService over Connect (here through the generated Go
// client, as the browser does with JSON), without any token.
func TestConsoleAgainstPlaintextSupervisor(t *testing.T) {
	srv := natstest.Start(t)
	_, addr := startService(t, "supervisor", "--grpc-addr=127.0.0.1:0", "--nats-url="+srv.URL())

	cmd := exec.Command(planexBin, "console", "--plaintext", "--addr", addr, "--http-addr", "127.0.0.1:0")
	cmd.Env = serviceEnv()
	base := startWatching(t, cmd, cmd.StdoutPipe, nil, "planex console did not print its URL", func(line string) (string, bool) {
		_, rest, ok := strings.Cut(line, "planex console on ")
		if !ok {
			return "", false
		}
		return strings.Fields(rest)[0], true
	})

	resp, err := http.Get(base)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", base, resp.Status)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	api := planexv1connect.NewSupervisorServiceClient(http.DefaultClient, strings.TrimSuffix(base, "/"), connect.WithProtoJSON())
	started, err := api.StartRun(ctx, connect.NewRequest(&planexv1.StartRunRequest{Goal: "How many open support tickets does Acme Corp have?", Labels: map[string]string{"team": "console"}}))
	if err != nil {
		t.Fatalf("StartRun through the console: %v", err)
	}
	id := started.Msg.GetRun().GetId()
	list, err := api.ListRuns(ctx, connect.NewRequest(&planexv1.ListRunsRequest{Labels: map[string]string{"team": "console"}}))
	if err != nil {
		t.Fatalf("ListRuns through the console: %v", err)
	}
	if len(list.Msg.GetRuns()) != 1 || list.Msg.GetRuns()[0].GetId() != id {
		t.Fatalf("ListRuns by label: %v, want run %s", list.Msg.GetRuns(), id)
	}
	// The supervisor's status codes pass through unchanged.
	_, err = api.GetRun(ctx, connect.NewRequest(&planexv1.GetRunRequest{RunId: "01ARZ3NDEKTSV4RRFFQ69G5FAV"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("GetRun of an unknown run: %v, want not_found", err)
	}
	_, err = api.Decide(ctx, connect.NewRequest(&planexv1.DecideRequest{RunId: id}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "gate_id") {
		t.Fatalf("Decide without gate_id: %v, want invalid_argument naming gate_id", err)
	}

	stopWithSIGTERM(t, cmd, "console")
}
