package main

import (
	"bytes"
	"strings"
	"testing"
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
