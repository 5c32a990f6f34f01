package sqlpool

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// unquote removes the doubling of q inside a quoted body.
func unquote(body string, q byte) string {
	return strings.ReplaceAll(body, string([]byte{q, q}), string(q))
}

// unescapeE decodes the body of a PostgreSQL E'...' string: \b \f \n \r
// \t, octal \ooo, hex \xhh, \uXXXX, \UXXXXXXXX, a doubled quote, and any
// other escaped character as itself.
func unescapeE(body string) string {
	var b strings.Builder
	for i := 0; i < len(body); i++ {
		c := body[i]
		if c == '\'' && i+1 < len(body) && body[i+1] == '\'' {
			b.WriteByte('\'')
			i++
			continue
		}
		if c != '\\' || i+1 >= len(body) {
			b.WriteByte(c)
			continue
		}
		i++
		switch e := body[i]; e {
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case '0', '1', '2', '3', '4', '5', '6', '7':
			j := i
			for j < len(body) && j < i+3 && body[j] >= '0' && body[j] <= '7' {
				j++
			}
			v, _ := strconv.ParseUint(body[i:j], 8, 8)
			b.WriteByte(byte(v))
			i = j - 1
		case 'x':
			j := i + 1
			for j < len(body) && j < i+3 && isHex(body[j]) {
				j++
			}
			if j == i+1 {
				b.WriteByte('x')
				continue
			}
			v, _ := strconv.ParseUint(body[i+1:j], 16, 8)
			b.WriteByte(byte(v))
			i = j - 1
		case 'u', 'U':
			width := 4
			if e == 'U' {
				width = 8
			}
			if i+1+width <= len(body) {
				if v, err := strconv.ParseUint(body[i+1:i+1+width], 16, 32); err == nil && utf8.ValidRune(rune(v)) {
					b.WriteRune(rune(v))
					i += width
					continue
				}
			}
			b.WriteByte(e)
		default:
			b.WriteByte(e)
		}
	}
	return b.String()
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// unicodeQuoted lexes a U&"..." identifier or U&'...' string starting at
// start (the U) whose quote is at quote, with an optional UESCAPE 'c'
// clause after it, and decodes its escapes.
func unicodeQuoted(sql string, start, quote int) (token, int, error) {
	q := sql[quote]
	end, err := quoted(sql, quote, q, false)
	if err != nil {
		return token{}, 0, err
	}
	body := unquote(sql[quote+1:end-1], q)
	esc := byte('\\')
	next := end
	// Optional UESCAPE 'c'.
	j := end
	for j < len(sql) && strings.IndexByte(" \t\r\n\f\v", sql[j]) >= 0 {
		j++
	}
	if j+7 <= len(sql) && strings.EqualFold(sql[j:j+7], "uescape") && (j+7 == len(sql) || !isWordByte(sql[j+7])) {
		k := j + 7
		for k < len(sql) && strings.IndexByte(" \t\r\n\f\v", sql[k]) >= 0 {
			k++
		}
		if k+3 > len(sql) || sql[k] != '\'' || sql[k+2] != '\'' {
			return token{}, 0, fmt.Errorf("UESCAPE at offset %d: want a one-character string literal", j)
		}
		esc = sql[k+1]
		if isHex(esc) || esc == '+' || esc == '\'' || esc == '"' || esc == ' ' {
			return token{}, 0, fmt.Errorf("UESCAPE at offset %d: invalid escape character %q", j, esc)
		}
		next = k + 3
	}
	val, err := decodeUnicode(body, esc)
	if err != nil {
		return token{}, 0, fmt.Errorf("Unicode escape in %s at offset %d: %w", sql[start:end], start, err)
	}
	if q == '"' {
		return token{kind: tokIdent, text: val, pos: start}, next, nil
	}
	return token{kind: tokString, text: sql[start:next], pos: start, value: val}, next, nil
}

// decodeUnicode applies PostgreSQL's Unicode escapes: esc esc is esc
// itself, esc XXXX and esc + XXXXXX are code points (UTF-16 surrogate pairs
// combined).
func decodeUnicode(body string, esc byte) (string, error) {
	var b strings.Builder
	var high rune
	for i := 0; i < len(body); i++ {
		c := body[i]
		if c != esc {
			if high != 0 {
				return "", fmt.Errorf("unpaired surrogate")
			}
			b.WriteByte(c)
			continue
		}
		if i+1 < len(body) && body[i+1] == esc {
			b.WriteByte(esc)
			i++
			continue
		}
		width, from := 4, i+1
		if i+1 < len(body) && body[i+1] == '+' {
			width, from = 6, i+2
		}
		if from+width > len(body) {
			return "", fmt.Errorf("invalid Unicode escape")
		}
		v, err := strconv.ParseUint(body[from:from+width], 16, 32)
		if err != nil {
			return "", fmt.Errorf("invalid Unicode escape %q", body[i:from+width])
		}
		r := rune(v)
		i = from + width - 1
		switch {
		case utf16.IsSurrogate(r) && high == 0 && r < 0xdc00:
			high = r
			continue
		case high != 0:
			r = utf16.DecodeRune(high, r)
			high = 0
			if r == utf8.RuneError {
				return "", fmt.Errorf("invalid surrogate pair")
			}
		case utf16.IsSurrogate(r), r == 0, !utf8.ValidRune(r):
			return "", fmt.Errorf("invalid Unicode code point %X", v)
		}
		b.WriteRune(r)
	}
	if high != 0 {
		return "", fmt.Errorf("unpaired surrogate")
	}
	return b.String(), nil
}
