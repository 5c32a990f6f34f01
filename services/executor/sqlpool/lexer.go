package sqlpool

import (
	"fmt"
	"strings"
)

// dialect selects the lexical rules that differ between the backends.
type dialect int

const (
	dialectSQLite dialect = iota
	dialectPostgres
)

// tokenKind classifies a lexical token.
type tokenKind int

const (
	tokWord   tokenKind = iota // keyword or bare identifier
	tokIdent                   // quoted identifier: "x", `x`, [x]
	tokString                  // string or blob literal, dollar-quoted body
	tokNumber                  // numeric literal
	tokParam                   // ?, ?1, $1, :name, @name
	tokPunct                   // any other character
	tokSemi                    // ;
)

// token is one lexical token of an SQL text. Comments and whitespace are
// dropped.
type token struct {
	kind tokenKind
	text string // as written; for tokIdent the unquoted (and decoded) name
	pos  int    // byte offset in the text
	// value is the decoded content of a tokString: quotes removed, escapes
	// (E'..', U&'..') applied, a dollar-quoted body without its tags.
	value string
}

// lex splits sql into tokens. It understands what may hide a ';' or a
// keyword: '...' strings (a doubled quote escapes; E'...' backslash escapes and
// $tag$...$tag$ bodies in PostgreSQL), quoted identifiers ("x", and `x`
// and [x] in SQLite), -- line comments and /* block */ comments (nested in
// PostgreSQL). An unterminated string, identifier or comment is an error.
func lex(sql string, d dialect) ([]token, error) {
	var toks []token
	i := 0
	n := len(sql)
	for i < n {
		c := sql[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == '-' && i+1 < n && sql[i+1] == '-':
			end := strings.IndexByte(sql[i:], '\n')
			if end < 0 {
				i = n
			} else {
				i += end + 1
			}
		case c == '/' && i+1 < n && sql[i+1] == '*':
			end, err := blockComment(sql, i, d)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '\'':
			end, err := quoted(sql, i, '\'', false)
			if err != nil {
				return nil, err
			}
			toks = append(toks, token{kind: tokString, text: sql[i:end], pos: i, value: unquote(sql[i+1:end-1], '\'')})
			i = end
		case c == '"':
			end, err := quoted(sql, i, '"', false)
			if err != nil {
				return nil, err
			}
			toks = append(toks, token{kind: tokIdent, text: strings.ReplaceAll(sql[i+1:end-1], `""`, `"`), pos: i})
			i = end
		case d == dialectSQLite && c == '`':
			end, err := quoted(sql, i, '`', false)
			if err != nil {
				return nil, err
			}
			toks = append(toks, token{kind: tokIdent, text: strings.ReplaceAll(sql[i+1:end-1], "``", "`"), pos: i})
			i = end
		case d == dialectSQLite && c == '[':
			end := strings.IndexByte(sql[i+1:], ']')
			if end < 0 {
				return nil, fmt.Errorf("unterminated [identifier] at offset %d", i)
			}
			toks = append(toks, token{kind: tokIdent, text: sql[i+1 : i+1+end], pos: i})
			i += end + 2
		case c == '$' && d == dialectPostgres:
			tok, end, err := dollar(sql, i)
			if err != nil {
				return nil, err
			}
			toks = append(toks, tok)
			i = end
		case c == '?' || (d == dialectSQLite && (c == ':' || c == '@' || c == '$') && i+1 < n && isWordByte(sql[i+1])):
			end := i + 1
			for end < n && isWordByte(sql[end]) {
				end++
			}
			toks = append(toks, token{kind: tokParam, text: sql[i:end], pos: i})
			i = end
		case c >= '0' && c <= '9' || (c == '.' && i+1 < n && sql[i+1] >= '0' && sql[i+1] <= '9'):
			end := number(sql, i)
			toks = append(toks, token{kind: tokNumber, text: sql[i:end], pos: i})
			i = end
		case isWordStart(c):
			end := i + 1
			for end < n && (isWordByte(sql[end]) || sql[end] == '$') {
				end++
			}
			word := sql[i:end]
			// U&"..." identifiers and U&'...' strings carry Unicode escapes
			// (U&"pg\005fread\005ffile" is pg_read_file): decode them, so
			// that no check can be bypassed by spelling a name in escapes.
			if d == dialectPostgres && (word == "u" || word == "U") && end+1 < n && sql[end] == '&' && (sql[end+1] == '"' || sql[end+1] == '\'') {
				tok, next, err := unicodeQuoted(sql, i, end+1)
				if err != nil {
					return nil, err
				}
				toks = append(toks, tok)
				i = next
				continue
			}
			// String prefixes: E'..' (escapes), X'..' / B'..' (binary), N'..'.
			if end < n && sql[end] == '\'' && len(word) == 1 && strings.ContainsAny(word, "eEbBxXnN") {
				backslash := d == dialectPostgres && (word == "e" || word == "E")
				send, err := quoted(sql, end, '\'', backslash)
				if err != nil {
					return nil, err
				}
				val := sql[end+1 : send-1]
				if backslash {
					val = unescapeE(val)
				} else {
					val = unquote(val, '\'')
				}
				toks = append(toks, token{kind: tokString, text: sql[i:send], pos: i, value: val})
				i = send
				continue
			}
			toks = append(toks, token{kind: tokWord, text: word, pos: i})
			i = end
		case c == ';':
			toks = append(toks, token{kind: tokSemi, text: ";", pos: i})
			i++
		default:
			toks = append(toks, token{kind: tokPunct, text: sql[i : i+1], pos: i})
			i++
		}
	}
	return toks, nil
}

func isWordStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80
}

func isWordByte(c byte) bool { return isWordStart(c) || (c >= '0' && c <= '9') }

// quoted returns the end (exclusive) of the quoted run starting at start;
// a doubled quote is an escaped quote, and with backslash a backslash
// escapes the next byte.
func quoted(sql string, start int, q byte, backslash bool) (int, error) {
	for i := start + 1; i < len(sql); i++ {
		switch sql[i] {
		case '\\':
			if backslash {
				i++
			}
		case q:
			if i+1 < len(sql) && sql[i+1] == q {
				i++
				continue
			}
			return i + 1, nil
		}
	}
	what := "string literal"
	if q != '\'' {
		what = "quoted identifier"
	}
	return 0, fmt.Errorf("unterminated %s starting at offset %d", what, start)
}

// blockComment returns the end of the /* comment */ at start.
func blockComment(sql string, start int, d dialect) (int, error) {
	depth := 0
	for i := start; i < len(sql)-1; i++ {
		switch {
		case sql[i] == '/' && sql[i+1] == '*':
			if depth == 0 || d == dialectPostgres {
				depth++
			}
			i++
		case sql[i] == '*' && sql[i+1] == '/':
			depth--
			i++
			if depth == 0 {
				return i + 1, nil
			}
		}
	}
	return 0, fmt.Errorf("unterminated /* comment starting at offset %d", start)
}

// dollar lexes a PostgreSQL positional parameter ($1) or dollar-quoted
// string ($$...$$, $tag$...$tag$).
func dollar(sql string, start int) (token, int, error) {
	i := start + 1
	if i < len(sql) && sql[i] >= '0' && sql[i] <= '9' {
		for i < len(sql) && sql[i] >= '0' && sql[i] <= '9' {
			i++
		}
		return token{kind: tokParam, text: sql[start:i], pos: start}, i, nil
	}
	for i < len(sql) && isWordByte(sql[i]) {
		i++
	}
	if i >= len(sql) || sql[i] != '$' {
		return token{kind: tokPunct, text: "$", pos: start}, start + 1, nil
	}
	tag := sql[start : i+1]
	end := strings.Index(sql[i+1:], tag)
	if end < 0 {
		return token{}, 0, fmt.Errorf("unterminated dollar-quoted string %s starting at offset %d", tag, start)
	}
	stop := i + 1 + end + len(tag)
	return token{kind: tokString, text: sql[start:stop], pos: start, value: sql[i+1 : i+1+end]}, stop, nil
}

// number returns the end of the numeric literal at start.
func number(sql string, start int) int {
	i := start
	if strings.HasPrefix(strings.ToLower(sql[i:]), "0x") {
		i += 2
		for i < len(sql) && strings.IndexByte("0123456789abcdefABCDEF_", sql[i]) >= 0 {
			i++
		}
		return i
	}
	for i < len(sql) && (sql[i] >= '0' && sql[i] <= '9' || sql[i] == '.' || sql[i] == '_') {
		i++
	}
	if i < len(sql) && (sql[i] == 'e' || sql[i] == 'E') {
		j := i + 1
		if j < len(sql) && (sql[j] == '+' || sql[j] == '-') {
			j++
		}
		if j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
			i = j
			for i < len(sql) && sql[i] >= '0' && sql[i] <= '9' {
				i++
			}
		}
	}
	return i
}

// statement is one SQL statement, lexed.
type statement struct {
	tokens []token
	// verb is the upper-cased first keyword ("SELECT"), after any opening
	// parentheses.
	verb string
}

// parseOne lexes sql and checks that it holds exactly one statement (a
// trailing ';' is allowed).
func parseOne(sql string, d dialect) (statement, error) {
	toks, err := lex(sql, d)
	if err != nil {
		return statement{}, err
	}
	var stmts [][]token
	var cur []token
	for _, t := range toks {
		if t.kind == tokSemi {
			if len(cur) > 0 {
				stmts = append(stmts, cur)
			}
			cur = nil
			continue
		}
		cur = append(cur, t)
	}
	if len(cur) > 0 {
		stmts = append(stmts, cur)
	}
	switch len(stmts) {
	case 0:
		return statement{}, fmt.Errorf("no SQL statement (only comments or ';')")
	case 1:
	default:
		second := stmts[1][0]
		return statement{}, fmt.Errorf("%d statements; exactly one is allowed (the second starts at offset %d: %q)",
			len(stmts), second.pos, excerpt(sql[second.pos:]))
	}
	st := statement{tokens: stmts[0]}
	for _, t := range st.tokens {
		if t.kind == tokPunct && t.text == "(" {
			continue
		}
		if t.kind == tokWord {
			st.verb = strings.ToUpper(t.text)
		}
		break
	}
	if st.verb == "" {
		return statement{}, fmt.Errorf("statement does not start with a keyword: %q", excerpt(sql))
	}
	return st, nil
}

// excerpt shortens s for an error message.
func excerpt(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

// words returns the statement's bare words and quoted identifiers, lower
// case, for deny-list checks. Strings and comments are not words.
func (s statement) words() []string {
	out := make([]string, 0, len(s.tokens))
	for _, t := range s.tokens {
		if t.kind == tokWord || t.kind == tokIdent {
			out = append(out, strings.ToLower(t.text))
		}
	}
	return out
}

// sanitized renders the statement for traces: literals replaced by '?',
// comments and extra whitespace dropped, at most 2000 bytes.
func (s statement) sanitized() string {
	var b strings.Builder
	for i, t := range s.tokens {
		if i > 0 {
			b.WriteByte(' ')
		}
		switch t.kind {
		case tokString, tokNumber:
			b.WriteByte('?')
		case tokIdent:
			b.WriteString(`"` + t.text + `"`)
		default:
			b.WriteString(t.text)
		}
		if b.Len() > 2000 {
			return b.String()[:2000] + "..."
		}
	}
	return b.String()
}

// bindFor rewrites the positional ? placeholders of the statement for the
// dialect: PostgreSQL numbers its parameters ($1, $2, ...), so the same
// statement (a playbook's, a model's) runs on SQLite and PostgreSQL. A ?
// inside a literal, identifier or comment is not a token and stays. Mixing
// ? with $n is refused: the numbering would be ambiguous.
func (st statement) bindFor(sql string, d dialect) (string, error) {
	if d != dialectPostgres {
		return sql, nil
	}
	var qs []int
	numbered := false
	for _, t := range st.tokens {
		if t.kind != tokParam {
			continue
		}
		if t.text == "?" {
			qs = append(qs, t.pos)
		} else {
			numbered = true
		}
	}
	if len(qs) == 0 {
		return sql, nil
	}
	if numbered {
		return "", fmt.Errorf("statement mixes ? and $n parameters; use one style")
	}
	var b strings.Builder
	last := 0
	for i, pos := range qs {
		b.WriteString(sql[last:pos])
		fmt.Fprintf(&b, "$%d", i+1)
		last = pos + 1
	}
	b.WriteString(sql[last:])
	return b.String(), nil
}
