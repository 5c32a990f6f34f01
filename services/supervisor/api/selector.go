package api

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A label selector in the Kubernetes syntax (RunFilter.label_selector):
// comma-separated requirements, all of which must hold:
//
//	key=value, key==value   the label is set to value
//	key!=value              the label is not set to value (or is absent)
//	key in (a,b)            the label is set to one of the values
//	key notin (a,b)         the label is absent or set to none of them
//	key                     the label is set
//	!key                    the label is absent
//
// Keys are label keys ([a-z0-9_./-], at most 63); values are any text
// without whitespace, ',', '(', ')', '=' or '!' (empty after = and !=).
// Whitespace around tokens is ignored. It is parsed by hand: the
// Kubernetes parser (k8s.io/apimachinery) is a heavy dependency.

// selOp is the operator of a requirement.
type selOp int

const (
	opEq selOp = iota
	opNotEq
	opIn
	opNotIn
	opExists
	opNotExists
)

// requirement is one condition of a selector.
type requirement struct {
	key    string
	op     selOp
	values []string
}

// labelSelector is a parsed selector: every requirement must hold.
type labelSelector []requirement

// matches reports whether labels (get returns a label's value) satisfy
// every requirement.
func (s labelSelector) matches(get func(string) (string, bool)) bool {
	for _, r := range s {
		v, ok := get(r.key)
		switch r.op {
		case opEq:
			if !ok || v != r.values[0] {
				return false
			}
		case opNotEq:
			if ok && v == r.values[0] {
				return false
			}
		case opIn:
			if !ok || !contains(r.values, v) {
				return false
			}
		case opNotIn:
			if ok && contains(r.values, v) {
				return false
			}
		case opExists:
			if !ok {
				return false
			}
		case opNotExists:
			if ok {
				return false
			}
		}
	}
	return true
}

func contains(vs []string, v string) bool {
	for _, x := range vs {
		if x == v {
			return true
		}
	}
	return false
}

// maxSelectorBytes bounds RunFilter.label_selector.
const maxSelectorBytes = 1024

// selectorError is a parse error at a position of the selector (counted
// in characters from 1).
type selectorError struct {
	pos int
	msg string
}

func (e *selectorError) Error() string { return fmt.Sprintf("at position %d: %s", e.pos, e.msg) }

// parseSelector parses a label selector; an empty one selects everything.
func parseSelector(in string) (labelSelector, error) {
	if len(in) > maxSelectorBytes {
		return nil, fmt.Errorf("%d bytes, at most %d", len(in), maxSelectorBytes)
	}
	if !utf8.ValidString(in) {
		return nil, fmt.Errorf("not valid UTF-8")
	}
	p := &selParser{in: in}
	var sel labelSelector
	p.space()
	if p.eof() {
		return nil, nil
	}
	for {
		r, err := p.requirement()
		if err != nil {
			return nil, err
		}
		sel = append(sel, r)
		p.space()
		if p.eof() {
			return sel, nil
		}
		if !p.take(",") {
			return nil, p.errorf("want ',' between requirements, found %s", p.found())
		}
	}
}

// selParser reads a selector left to right.
type selParser struct {
	in  string
	off int
}

func (p *selParser) eof() bool { return p.off >= len(p.in) }

// pos is the 1-based character position of the next token.
func (p *selParser) pos() int { return utf8.RuneCountInString(p.in[:p.off]) + 1 }

func (p *selParser) errorf(format string, args ...any) error {
	return &selectorError{pos: p.pos(), msg: fmt.Sprintf(format, args...)}
}

// found describes the next token for an error.
func (p *selParser) found() string {
	if p.eof() {
		return "the end"
	}
	r, _ := utf8.DecodeRuneInString(p.in[p.off:])
	return fmt.Sprintf("%q", r)
}

func (p *selParser) space() {
	for !p.eof() {
		r, n := utf8.DecodeRuneInString(p.in[p.off:])
		if !unicode.IsSpace(r) {
			return
		}
		p.off += n
	}
}

func (p *selParser) take(tok string) bool {
	if strings.HasPrefix(p.in[p.off:], tok) {
		p.off += len(tok)
		return true
	}
	return false
}

// word reads a run of characters that are not whitespace or punctuation
// of the syntax.
func (p *selParser) word() string {
	start := p.off
	for !p.eof() {
		r, n := utf8.DecodeRuneInString(p.in[p.off:])
		if unicode.IsSpace(r) || strings.ContainsRune(",()=!", r) {
			break
		}
		p.off += n
	}
	return p.in[start:p.off]
}

func (p *selParser) key() (string, error) {
	p.space()
	at := p.pos()
	k := p.word()
	if k == "" {
		return "", p.errorf("want a label key, found %s", p.found())
	}
	if !labelKeyRE.MatchString(k) {
		return "", &selectorError{pos: at, msg: fmt.Sprintf("label key %q: want 1 to 63 of [a-z0-9_./-]", clip(k))}
	}
	return k, nil
}

func (p *selParser) requirement() (requirement, error) {
	p.space()
	if p.take("!") {
		if p.take("=") {
			return requirement{}, &selectorError{pos: p.pos() - 2, msg: "want a label key before '!='"}
		}
		k, err := p.key()
		if err != nil {
			return requirement{}, err
		}
		return requirement{key: k, op: opNotExists}, nil
	}
	k, err := p.key()
	if err != nil {
		return requirement{}, err
	}
	p.space()
	switch {
	case p.eof() || strings.HasPrefix(p.in[p.off:], ","):
		return requirement{key: k, op: opExists}, nil
	case p.take("=="), p.take("="):
		return requirement{key: k, op: opEq, values: []string{p.value()}}, nil
	case p.take("!="):
		return requirement{key: k, op: opNotEq, values: []string{p.value()}}, nil
	}
	at := p.pos()
	switch w := p.word(); w {
	case "in", "notin":
		vs, err := p.set()
		if err != nil {
			return requirement{}, err
		}
		op := opIn
		if w == "notin" {
			op = opNotIn
		}
		return requirement{key: k, op: op, values: vs}, nil
	case "":
		return requirement{}, p.errorf("after key %q: want '=', '==', '!=', 'in', 'notin', ',' or the end, found %s", k, p.found())
	default:
		return requirement{}, &selectorError{pos: at, msg: fmt.Sprintf("after key %q: want '=', '==', '!=', 'in' or 'notin', found %q", k, clip(w))}
	}
}

func (p *selParser) value() string {
	p.space()
	return p.word()
}

// set reads "(a, b, ...)" (at least one value).
func (p *selParser) set() ([]string, error) {
	p.space()
	if !p.take("(") {
		return nil, p.errorf("want '(' to open the values, found %s", p.found())
	}
	var vs []string
	for {
		p.space()
		at := p.pos()
		v := p.word()
		if v == "" {
			return nil, &selectorError{pos: at, msg: fmt.Sprintf("want a value, found %s", p.found())}
		}
		vs = append(vs, v)
		p.space()
		switch {
		case p.take(")"):
			return vs, nil
		case p.take(","):
		default:
			return nil, p.errorf("want ',' or ')' in the values, found %s", p.found())
		}
	}
}
