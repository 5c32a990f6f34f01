package mcppool

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// varRE matches the variable references MCP client configs use:
// ${VAR}, ${VAR:-default} (Claude Code) and ${env:VAR} (VS Code).
var varRE = regexp.MustCompile(`\$\{(env:)?([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}`)

// Expand replaces ${VAR}, ${VAR:-default} and ${env:VAR} in every server's
// command, args, env values, cwd, url, header values and bearerTokenFile
// with values from lookup (the pool's environment). A variable that is
// unset and has no default is an error naming the field and the variable,
// never its value. The expanded values are secrets as far as planex knows:
// they are not logged.
func (fc FileConfig) Expand(lookup func(string) (string, bool)) (FileConfig, error) {
	out := FileConfig{Servers: make(map[string]ServerConfig, len(fc.Servers))}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(fc.Servers)) {
		sc := fc.Servers[name]
		field := "mcpServers." + name
		one := func(f, s string) string {
			v, err := expand(s, lookup)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s.%s: %w", field, f, err))
			}
			return v
		}
		sc.Command = one("command", sc.Command)
		sc.Cwd = one("cwd", sc.Cwd)
		sc.URL = one("url", sc.URL)
		sc.BearerTokenFile = one("bearerTokenFile", sc.BearerTokenFile)
		if sc.Args != nil {
			args := make([]string, len(sc.Args))
			for i, a := range sc.Args {
				args[i] = one(fmt.Sprintf("args[%d]", i), a)
			}
			sc.Args = args
		}
		sc.Env = expandMap(sc.Env, "env", one)
		sc.Headers = expandMap(sc.Headers, "headers", one)
		out.Servers[name] = sc
	}
	return out, errors.Join(errs...)
}

func expandMap(m map[string]string, field string, one func(f, s string) string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out[k] = one(field+"."+k, m[k])
	}
	return out
}

// expand replaces the variable references in s; the first unset one
// without a default is the error.
func expand(s string, lookup func(string) (string, bool)) (string, error) {
	if !strings.Contains(s, "${") {
		return s, nil
	}
	var err error
	out := varRE.ReplaceAllStringFunc(s, func(ref string) string {
		m := varRE.FindStringSubmatch(ref)
		if v, ok := lookup(m[2]); ok {
			return v
		}
		if m[3] != "" {
			return m[4]
		}
		if err == nil {
			err = fmt.Errorf("${%s%s}: environment variable %s is not set", m[1], m[2], m[2])
		}
		return ""
	})
	if err != nil {
		return "", err
	}
	return out, nil
}
