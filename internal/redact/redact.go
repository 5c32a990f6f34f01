// Package redact is planex's one redaction layer. The same Redactor
// cleans span attributes, log records and the sensitive parts of run
// events, so a value hidden in one place is hidden in all of them.
//
// It replaces matches of configurable patterns (e-mail addresses, bearer
// tokens and API keys, payment card numbers by default) and whole values
// of fields a tool declares sensitive (ToolSpec.sensitive_fields).
package redact

import (
	"fmt"
	"log/slog"
	"regexp"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
)

// Mask replaces redacted text.
const Mask = "[REDACTED]"

// Pattern is one named regular expression whose matches are replaced.
type Pattern struct {
	// Name identifies the pattern in configuration ("email").
	Name string
	// RE matches the sensitive text.
	RE *regexp.Regexp
	// Replace is the replacement; Mask when empty. It may use $1 etc.
	Replace string
}

// DefaultPatterns are applied unless configured otherwise.
func DefaultPatterns() []Pattern {
	return []Pattern{
		{Name: "email", RE: regexp.MustCompile(`[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}`), Replace: "[EMAIL]"},
		// key=value or key: value credentials; plain prose such as
		// "password reset" is left alone.
		{Name: "credential", RE: regexp.MustCompile(`(?i)\b(token|api[_-]?key|secret|password|passwd)(\s*[:=]\s*)("?)[^\s"',;]{6,}`), Replace: "$1$2$3" + Mask},
		{Name: "bearer", RE: regexp.MustCompile(`(?i)\b(bearer)(\s+)[A-Za-z0-9._~+/\-]{12,}=*`), Replace: "$1$2" + Mask},
		{Name: "openai_key", RE: regexp.MustCompile(`\bsk-[A-Za-z0-9_\-]{16,}`), Replace: Mask},
		{Name: "card", RE: regexp.MustCompile(`\b(?:\d[ -]?){12,18}\d\b`), Replace: "[CARD]"},
	}
}

// SecretPatterns are the default patterns that match credentials and
// payment cards — values that must never be stored, unlike e-mail
// addresses, which are personal data but may be needed to do the work.
func SecretPatterns() []Pattern {
	var out []Pattern
	for _, p := range DefaultPatterns() {
		if p.Name != "email" {
			out = append(out, p)
		}
	}
	return out
}

// Match reports the name of the first pattern matching s.
func (r *Redactor) Match(s string) (name string, ok bool) {
	if r == nil {
		return "", false
	}
	for _, p := range r.patterns {
		if p.RE.MatchString(s) {
			return p.Name, true
		}
	}
	return "", false
}

// Redactor applies patterns to strings and masks sensitive fields.
type Redactor struct {
	patterns []Pattern
}

// New returns a Redactor with the given patterns (DefaultPatterns when
// none are given).
func New(patterns ...Pattern) *Redactor {
	if len(patterns) == 0 {
		patterns = DefaultPatterns()
	}
	return &Redactor{patterns: patterns}
}

// Compile builds patterns from name=regexp pairs (for flags such as
// --redact-pattern ssn='\d{3}-\d{2}-\d{4}'), added to the defaults.
func Compile(pairs []string) ([]Pattern, error) {
	out := DefaultPatterns()
	for _, p := range pairs {
		name, expr, ok := strings.Cut(p, "=")
		if !ok || name == "" || expr == "" {
			return nil, fmt.Errorf("redact pattern %q: want name=regexp", p)
		}
		re, err := regexp.Compile(expr)
		if err != nil {
			return nil, fmt.Errorf("redact pattern %q: %w", name, err)
		}
		out = append(out, Pattern{Name: name, RE: re})
	}
	return out, nil
}

// String redacts every pattern match in s.
func (r *Redactor) String(s string) string {
	if r == nil || s == "" {
		return s
	}
	for _, p := range r.patterns {
		repl := p.Replace
		if repl == "" {
			repl = Mask
		}
		s = p.RE.ReplaceAllString(s, repl)
	}
	return s
}

// Value redacts a JSON-like value (maps, lists, strings) recursively;
// fields named in sensitive (dotted paths such as "to" or "args.body", or
// a bare field name matching at any depth) are replaced by Mask whole. A
// nil Redactor masks the sensitive fields only, applying no pattern.
func (r *Redactor) Value(v any, sensitive ...string) any {
	return r.value(v, "", sensitive)
}

func (r *Redactor) value(v any, path string, sensitive []string) any {
	switch t := v.(type) {
	case string:
		return r.String(t)
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			p := k
			if path != "" {
				p = path + "." + k
			}
			if isSensitive(p, k, sensitive) {
				out[k] = Mask
				continue
			}
			out[k] = r.value(x, p, sensitive)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = r.value(x, path, sensitive)
		}
		return out
	default:
		return v
	}
}

func isSensitive(path, key string, sensitive []string) bool {
	for _, s := range sensitive {
		if s == path || s == key {
			return true
		}
	}
	return false
}

// Struct returns a redacted copy of s (nil stays nil); see Value.
func (r *Redactor) Struct(s *structpb.Struct, sensitive ...string) *structpb.Struct {
	if s == nil {
		return nil
	}
	red, ok := r.Value(s.AsMap(), sensitive...).(map[string]any)
	if !ok {
		return nil
	}
	out, err := structpb.NewStruct(red)
	if err != nil {
		// Values came from a Struct, so they convert back; be safe anyway.
		return &structpb.Struct{}
	}
	return out
}

// ReplaceAttr is a slog.HandlerOptions.ReplaceAttr that redacts string
// attribute values, so no log line carries an address or a token.
func (r *Redactor) ReplaceAttr(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindString:
		if s := a.Value.String(); s != "" {
			if red := r.String(s); red != s {
				return slog.String(a.Key, red)
			}
		}
	case slog.KindAny:
		if err, ok := a.Value.Any().(error); ok {
			return slog.String(a.Key, r.String(err.Error()))
		}
	}
	return a
}
