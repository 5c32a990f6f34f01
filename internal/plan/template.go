package plan

import (
	"errors"
	"fmt"
	"strings"
)

const (
	refOpen  = "${{"
	refClose = "}}"
)

// segment is a piece of a string argument: literal text or an expression.
type segment struct {
	text   string // literal text, or the trimmed expression when isExpr
	isExpr bool
}

// template is a string argument that holds at least one reference.
type template struct {
	segs []segment
}

// whole reports whether the string is exactly one reference, so its value
// keeps the expression's type.
func (t *template) whole() bool {
	return len(t.segs) == 1 && t.segs[0].isExpr
}

// hasRef is the cheap test every string argument goes through.
func hasRef(s string) bool {
	return strings.Contains(s, refOpen)
}

// parseTemplate splits s into text and expressions. It returns nil and no
// error when s holds no reference.
func parseTemplate(s string) (*template, error) {
	if !hasRef(s) {
		return nil, nil
	}
	t := &template{}
	rest := s
	for {
		i := strings.Index(rest, refOpen)
		if i < 0 {
			if rest != "" {
				t.segs = append(t.segs, segment{text: rest})
			}
			return t, nil
		}
		if i > 0 {
			t.segs = append(t.segs, segment{text: rest[:i]})
		}
		body := rest[i+len(refOpen):]
		end := exprEnd(body)
		if end < 0 {
			return nil, fmt.Errorf("reference at offset %d has no closing %q", len(s)-len(rest)+i, refClose)
		}
		expr := strings.TrimSpace(body[:end])
		if expr == "" {
			return nil, errors.New("empty reference \"${{ }}\"")
		}
		t.segs = append(t.segs, segment{text: expr, isExpr: true})
		rest = body[end+len(refClose):]
	}
}

// exprEnd returns the index of the "}}" that closes a reference body, or -1.
// Braces of map literals and string literals (quoted, triple-quoted, raw) are
// skipped, so "${{ {'a': {'b': 1}} }}" and "${{ '}}' }}" parse as intended.
func exprEnd(s string) int {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '{':
			depth++
		case '}':
			if depth > 0 {
				depth--
				continue
			}
			if i+1 < len(s) && s[i+1] == '}' {
				return i
			}
		case '\'', '"':
			raw := i > 0 && (s[i-1] == 'r' || s[i-1] == 'R')
			n := skipString(s[i:], raw)
			if n < 0 {
				return -1
			}
			i += n - 1
		}
	}
	return -1
}

// skipString returns the length of the string literal s starts with, or -1
// when it is not terminated.
func skipString(s string, raw bool) int {
	q := s[:1]
	if strings.HasPrefix(s, q+q+q) {
		q = q + q + q
	}
	for i := len(q); i < len(s); i++ {
		if s[i] == '\\' && !raw {
			i++
			continue
		}
		if strings.HasPrefix(s[i:], q) {
			return i + len(q)
		}
	}
	return -1
}
