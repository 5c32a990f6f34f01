package mcppool

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// varRE matches the variable references MCP client configs use:
// ${VAR}, ${VAR:-default} (Claude Code) and ${env:VAR} (VS Code).
var varRE = regexp.MustCompile(`\$\{(env:)?([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}`)

// Expand replaces ${VAR}, ${VAR:-default} and ${env:VAR} in every server's
// command, args, env values, cwd, url, header values and bearerTokenFile
// with values from lookup (the pool's environment). A variable that is
// unset and has no default is an error naming the field and the variable,
// never its value. The expanded values are secrets as far as planex knows:
// the returned config remembers them, and every error and log line of the
// pool shows "${VAR}" where a value taken from the environment would appear
// (connect errors that embed the URL, exec errors that embed the command,
// a server's stderr, step errors).
func (fc FileConfig) Expand(lookup func(string) (string, bool)) (FileConfig, error) {
	out := FileConfig{Servers: make(map[string]ServerConfig, len(fc.Servers)), mask: fc.mask.clone()}
	seen := func(name string) (string, bool) {
		v, ok := lookup(name)
		if ok {
			out.mask.add("${"+name+"}", v)
		}
		return v, ok
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(fc.Servers)) {
		sc := fc.Servers[name]
		field := "mcpServers." + name
		one := func(f, s string) string {
			v, err := expand(s, seen)
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

// minMaskLen is the shortest value masked: a value of one to three
// characters ("1", "ro", "on") cannot hold a credential, and masking it
// would garble every message that happens to contain it.
const minMaskLen = 4

// mask replaces the values of expanded variables (and the contents of
// bearer token files) in text that may be printed with the variable's
// reference, "${NAME}". It is safe for concurrent use; the zero value and
// nil mask nothing.
type mask struct {
	mu    sync.RWMutex
	pairs []maskPair // longest value first
}

type maskPair struct{ value, name string }

// clone returns a mask holding m's values (a new mask when m is nil).
func (m *mask) clone() *mask {
	c := &mask{}
	if m != nil {
		m.mu.RLock()
		c.pairs = slices.Clone(m.pairs)
		m.mu.RUnlock()
	}
	return c
}

// add remembers value, to be printed as ref ("${NAME}"), in the forms it
// takes once printed: as is, URL-escaped (a URL's query or path), and
// escaped by %q (exec errors quote the command; url.Error quotes the URL).
func (m *mask) add(ref, value string) {
	if m == nil || len(value) < minMaskLen {
		return
	}
	var forms []string
	for _, v := range []string{value, url.QueryEscape(value), url.PathEscape(value)} {
		q := strconv.Quote(v)
		forms = append(forms, v, q[1:len(q)-1])
		q = strconv.QuoteToASCII(v)
		forms = append(forms, q[1:len(q)-1])
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, f := range forms {
		if !slices.ContainsFunc(m.pairs, func(p maskPair) bool { return p.value == f }) {
			m.pairs = append(m.pairs, maskPair{value: f, name: ref})
		}
	}
	// Longest first, so a value containing another is replaced whole.
	slices.SortStableFunc(m.pairs, func(a, b maskPair) int { return cmp.Compare(len(b.value), len(a.value)) })
}

// String returns s with every remembered value replaced by its reference.
func (m *mask) String(s string) string {
	if m == nil {
		return s
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, p := range m.pairs {
		s = strings.ReplaceAll(s, p.value, p.name)
	}
	return s
}

// Error returns err with its message masked, or err itself when its message
// holds no remembered value. The masked error unwraps to err so that
// errors.Is and errors.As keep working; whoever prints it sees the masked
// message only.
func (m *mask) Error(err error) error {
	if err == nil || m == nil {
		return err
	}
	msg := err.Error()
	if masked := m.String(msg); masked != msg {
		return &maskedError{msg: masked, err: err}
	}
	return err
}

// maskedError is an error whose message had expanded values replaced.
type maskedError struct {
	msg string
	err error
}

func (e *maskedError) Error() string { return e.msg }
func (e *maskedError) Unwrap() error { return e.err }
