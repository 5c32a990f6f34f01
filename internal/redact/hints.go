package redact

import "strings"

// A hint is a cheap test that a pattern may match a text, run before the
// regular expression: most texts (an SQL row's cells, a log line) hold no
// secret, and a literal search is tens of times faster than a regular
// expression scanning every position. A hint must never refuse a text
// the pattern matches.
type hint func(t *probe) bool

// probe is a text under test, with its lower-case form made once when a
// case-insensitive hint asks for it.
type probe struct {
	s       string
	lower   string
	lowered bool
}

func (p *probe) fold() string {
	if !p.lowered {
		p.lower, p.lowered = strings.ToLower(p.s), true
	}
	return p.lower
}

// has: s contains one of words.
func has(words ...string) hint {
	return func(t *probe) bool {
		for _, w := range words {
			if strings.Contains(t.s, w) {
				return true
			}
		}
		return false
	}
}

// hasFold: s contains one of the lower-case words, in any case.
func hasFold(words ...string) hint {
	return func(t *probe) bool {
		l := t.fold()
		for _, w := range words {
			if strings.Contains(l, w) {
				return true
			}
		}
		return false
	}
}

// all: every hint passes.
func all(hs ...hint) hint {
	return func(t *probe) bool {
		for _, h := range hs {
			if !h(t) {
				return false
			}
		}
		return true
	}
}

// cardDigits: s holds a run of at least n digits, single spaces, dots or
// dashes allowed between them, the shape of a card number.
func cardDigits(n int) hint {
	return func(t *probe) bool {
		c, sep := 0, false
		for i := 0; i < len(t.s); i++ {
			switch b := t.s[i]; {
			case isDigit(b):
				if c++; c >= n {
					return true
				}
				sep = false
			case !sep && c > 0 && (b == ' ' || b == '.' || b == '-'):
				sep = true
			default:
				c, sep = 0, false
			}
		}
		return false
	}
}

// run: s holds a run of at least n bytes for which in is true.
func run(n int, in func(byte) bool) hint {
	return func(t *probe) bool {
		c := 0
		for i := 0; i < len(t.s); i++ {
			if !in(t.s[i]) {
				c = 0
				continue
			}
			if c++; c >= n {
				return true
			}
		}
		return false
	}
}

// dotted: s holds a '.' between two runs of at least n base64url bytes,
// the shape of a JWT's first dot.
func dotted(n int) hint {
	return func(t *probe) bool {
		s := t.s
		for i := strings.IndexByte(s, '.'); i >= 0; {
			before, after := 0, 0
			for j := i - 1; j >= 0 && before < n && isB64URL(s[j]); j-- {
				before++
			}
			for j := i + 1; j < len(s) && after < n && isB64URL(s[j]); j++ {
				after++
			}
			if before >= n && after >= n {
				return true
			}
			k := strings.IndexByte(s[i+1:], '.')
			if k < 0 {
				break
			}
			i += 1 + k
		}
		return false
	}
}

func isB64URL(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || isDigit(c) || c == '-' || c == '_'
}

func isBase32Upper(c byte) bool { return c >= 'A' && c <= 'Z' || c >= '2' && c <= '7' }

// mayMatch runs p's hint, if any, on t.
func (p Pattern) mayMatch(t *probe) bool { return p.hint == nil || p.hint(t) }
