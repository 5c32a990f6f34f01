package mcppool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// FileConfig is the --mcp-config file: the "mcpServers" object MCP clients
// (Claude Desktop, IDEs) already use, with planex's optional additions per
// server ("timeout", "tools").
type FileConfig struct {
	// Servers maps a server name to how to reach it.
	Servers map[string]ServerConfig `json:"mcpServers"`

	// mask holds the values Expand took from the environment; the pool
	// replaces them with the variable's name wherever it prints.
	mask *mask
}

// ServerConfig is one MCP server: a stdio command or a streamable-HTTP URL.
type ServerConfig struct {
	// Command starts a stdio server; Args are its arguments.
	Command string   `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	// Env is added to the minimal environment the server runs with (PATH,
	// HOME, LANG, TMPDIR and nothing else of the executor's environment).
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the server's working directory (default: the executor's).
	Cwd string `json:"cwd,omitempty"`

	// URL is a streamable-HTTP endpoint.
	URL string `json:"url,omitempty"`
	// Headers are sent with every HTTP request.
	Headers map[string]string `json:"headers,omitempty"`
	// BearerTokenFile holds a token sent as "Authorization: Bearer …".
	BearerTokenFile string `json:"bearerTokenFile,omitempty"`

	// Timeout is the default timeout of the server's tools ("30s").
	Timeout string `json:"timeout,omitempty"`
	// Tools override what the server's annotations say, by MCP tool name.
	Tools map[string]ToolOverride `json:"tools,omitempty"`
}

// ToolOverride replaces the planex semantics derived from a tool's MCP
// annotations. Unset fields keep the derived value.
type ToolOverride struct {
	// SideEffect is "read", "write" or "external".
	SideEffect string `json:"sideEffect,omitempty"`
	// RequiresApproval makes steps of the tool wait for a human decision.
	RequiresApproval *bool `json:"requiresApproval,omitempty"`
	// Idempotent allows retrying the tool when its server dies mid-call.
	Idempotent *bool `json:"idempotent,omitempty"`
	// Disabled hides the tool from the catalog.
	Disabled bool `json:"disabled,omitempty"`
	// Timeout is the tool's default timeout ("2m").
	Timeout string `json:"timeout,omitempty"`
	// SensitiveFields are argument paths redacted in logs and events.
	SensitiveFields []string `json:"sensitiveFields,omitempty"`
}

// LoadConfig reads and checks an --mcp-config file. Unknown fields are
// refused so a typo does not silently drop a setting.
func LoadConfig(path string) (FileConfig, error) {
	if path == "" {
		return FileConfig{}, errors.New("--mcp-config: required for the mcp pool")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return FileConfig{}, fmt.Errorf("--mcp-config: %w", err)
	}
	var fc FileConfig
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fc); err != nil {
		return FileConfig{}, fmt.Errorf("--mcp-config %s: %w", path, err)
	}
	if fc, err = fc.Expand(os.LookupEnv); err != nil {
		return FileConfig{}, fmt.Errorf("--mcp-config %s: %w", path, err)
	}
	if err := fc.Validate(); err != nil {
		return FileConfig{}, fmt.Errorf("--mcp-config %s: %w", path, err)
	}
	return fc, nil
}

// Validate checks every server, naming the field at fault.
func (fc FileConfig) Validate() error {
	if len(fc.Servers) == 0 {
		return errors.New("mcpServers: no servers configured")
	}
	var errs []error
	seen := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(fc.Servers)) {
		sc := fc.Servers[name]
		field := "mcpServers." + name
		id, err := serverID(name)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
		} else if other, dup := seen[id]; dup {
			errs = append(errs, fmt.Errorf("%s: name maps to %q like server %q", field, id, other))
		}
		seen[id] = name
		switch {
		case sc.Command == "" && sc.URL == "":
			errs = append(errs, fmt.Errorf("%s: set command (stdio) or url (streamable HTTP)", field))
		case sc.Command != "" && sc.URL != "":
			errs = append(errs, fmt.Errorf("%s: set command or url, not both", field))
		case sc.URL != "":
			u, err := url.Parse(sc.URL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				// The URL is not echoed: it may carry an expanded secret.
				errs = append(errs, fmt.Errorf("%s.url: want an http:// or https:// URL", field))
			}
			if len(sc.Args) > 0 || len(sc.Env) > 0 || sc.Cwd != "" {
				errs = append(errs, fmt.Errorf("%s: args, env and cwd apply to stdio servers only", field))
			}
		default:
			if len(sc.Headers) > 0 || sc.BearerTokenFile != "" {
				errs = append(errs, fmt.Errorf("%s: headers and bearerTokenFile apply to url servers only", field))
			}
		}
		if _, err := parseTimeout(sc.Timeout); err != nil {
			errs = append(errs, fmt.Errorf("%s.timeout: %w", field, err))
		}
		for tool, o := range sc.Tools {
			tf := field + ".tools." + tool
			if _, err := sideEffectOf(o.SideEffect); err != nil {
				errs = append(errs, fmt.Errorf("%s.sideEffect: %w", tf, err))
			}
			if _, err := parseTimeout(o.Timeout); err != nil {
				errs = append(errs, fmt.Errorf("%s.timeout: %w", tf, err))
			}
		}
	}
	return errors.Join(errs...)
}

func parseTimeout(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q: want a positive duration such as 30s", s)
	}
	return d, nil
}

var idRE = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// serverID is the server's name as used in tool names: lower case, other
// characters than letters and digits replaced by '_'.
func serverID(name string) (string, error) {
	id := sanitize(name)
	if !idRE.MatchString(id) || len(id) > 32 {
		return "", fmt.Errorf("server name %q: want up to 32 letters, digits, '-' or '_', starting with a letter", name)
	}
	return id, nil
}

// sanitize lower-cases s and replaces every character that may not appear
// in a planex tool name with '_'.
func sanitize(s string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(s) {
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}
