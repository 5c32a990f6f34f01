package main

import (
	"context"
	"errors"
	"io"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/mcpserver"
	"github.com/planex-dev/planex/services/supervisor/runlog"
)

// mcpCmd serves planex to MCP clients (Claude Desktop, IDEs) on stdio.
func mcpCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve planex as an MCP server on stdio (for Claude Desktop and IDEs)",
		Long: `Serve planex as a Model Context Protocol server on stdin/stdout, backed by
the supervisor at --addr: MCP clients get the tools start_run, get_run,
list_runs, cancel_run, decide and list_tools, progress notifications
while a started run advances, and each run's event log as the resource
planex://runs/<run_id>/events. Add it to a client's config as
  {"mcpServers": {"planex": {"command": "planex", "args": ["mcp", "--addr", "127.0.0.1:7400"]}}}
Logs go to stderr; stdout carries the protocol only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, closeConn, err := dial(cf.addr)
			if err != nil {
				return err
			}
			defer closeConn()
			schedules, closeSchedules, err := dialSchedules(cf.addr)
			if err != nil {
				return err
			}
			defer closeSchedules()
			err = newMCPServer(client, schedules, cf.addr).Run(cmd.Context(), &mcp.StdioTransport{})
			if errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
				return nil
			}
			return err
		},
	}
	cf.register(cmd.Flags())
	return cmd
}

// newMCPServer is the shared MCP server over the supervisor at addr, its
// errors phrased like the other commands' (naming addr and the flag).
func newMCPServer(client planexv1.SupervisorServiceClient, schedules planexv1.ScheduleServiceClient, addr string) *mcp.Server {
	return mcpserver.New(client, mcpserver.Options{Error: func(err error) error { return rpcError(addr, err) }, Fold: runlog.Fold, Schedules: schedules})
}
