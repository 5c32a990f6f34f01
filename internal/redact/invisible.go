package redact

import (
	"strings"
	"unicode/utf8"
)

// Invisible characters are removed before patterns are matched, so that a
// secret split by one ("sk-" U+200B "proj…") is still found; the mask then
// covers the match's whole original span, invisible characters included.
// Text outside a match keeps them (an emoji's zero-width joiner, a
// right-to-left mark in Arabic prose).

// IsInvisible reports whether c renders as nothing and may be dropped
// before matching: zero-width space, non-joiner and joiner (U+200B–U+200D),
// left-to-right and right-to-left marks (U+200E, U+200F), word joiner and
// invisible operators (U+2060–U+2064), bidirectional embeddings, overrides
// and isolates (U+202A–U+202E, U+2066–U+2069), the byte order mark
// (U+FEFF), the soft hyphen (U+00AD), the Arabic letter mark (U+061C) and
// the Mongolian vowel separator (U+180E).
func IsInvisible(c rune) bool {
	switch {
	case c < 0xAD:
		return false
	case c == 0xAD, c == 0x061C, c == 0x180E, c == 0xFEFF:
		return true
	case c >= 0x200B && c <= 0x200F, c >= 0x202A && c <= 0x202E, c >= 0x2060 && c <= 0x2064, c >= 0x2066 && c <= 0x2069:
		return true
	}
	return false
}

// hasInvisible reports whether s holds an invisible character; ASCII text
// is answered without decoding runes.
func hasInvisible(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return strings.ContainsFunc(s[i:], IsInvisible)
		}
	}
	return false
}

// StripInvisible returns s without its invisible characters (IsInvisible).
func StripInvisible(s string) string {
	if !hasInvisible(s) {
		return s
	}
	norm, _ := normalize(s)
	return norm
}

// normalize returns s without invisible characters and, for each byte of
// the result, its offset in s.
func normalize(s string) (string, []int) {
	var b strings.Builder
	b.Grow(len(s))
	offs := make([]int, 0, len(s))
	for i := 0; i < len(s); {
		c, size := utf8.DecodeRuneInString(s[i:])
		if !IsInvisible(c) {
			// The original bytes, even of invalid UTF-8, so that offsets
			// map one to one.
			b.WriteString(s[i : i+size])
			for j := range size {
				offs = append(offs, i+j)
			}
		}
		i += size
	}
	return b.String(), offs
}
