// Package redact is planex's one redaction layer. The same Redactor
// cleans span attributes, log records and the sensitive parts of run
// events, so a value hidden in one place is hidden in all of them.
//
// It replaces matches of configurable patterns (e-mail addresses,
// credentials — key=value secrets, bearer tokens, HTTP Basic credentials,
// passwords in URLs, planex API keys, NATS nkey seeds, OpenAI, AWS,
// GitHub, Slack, Stripe and Google keys, JWTs, PEM private keys — and
// payment card numbers by default) and whole values of fields a tool
// declares sensitive (ToolSpec.sensitive_fields). Invisible characters
// are ignored when matching (see IsInvisible), and Leaves masks the values
// of a JSON document, each read next to its key: the output masking of
// docs/security.md, "Secrets in tool outputs".
package redact

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

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
	// Check, when set, confirms a match given the whole text and the
	// match's submatch indexes (as FindAllStringSubmatchIndex returns
	// them): a card number must pass the Luhn check, a token must look
	// random. Unconfirmed matches are left alone.
	Check func(text string, loc []int) bool
	// hint, when set, cheaply rules out texts RE cannot match.
	hint hint
	// contextual marks a pattern whose Check reads the words before the
	// match (a card number after "order" is not a card): Leaves applies it
	// to a value only next to its key.
	contextual bool
	// keyed marks a pattern whose match may take in a value's key
	// ("password: hunter22"): Leaves applies it to the value next to its
	// key too (contextual patterns are keyed).
	keyed bool
}

// DefaultPatterns are applied unless configured otherwise.
func DefaultPatterns() []Pattern {
	return append([]Pattern{
		{Name: "email", RE: regexp.MustCompile(`[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}`), Replace: "[EMAIL]", hint: has("@")},
	}, SecretPatterns()...)
}

// SecretPatterns are the default patterns that match credentials and
// payment cards — values that must never be stored, unlike e-mail
// addresses, which are personal data but may be needed to do the work.
// Each is specific enough to leave prose alone: a key=value credential or
// a bearer token must look random (digits with letters, or mixed case, or
// long), so "token: expired" and "bearer authentication" are not secrets;
// a card number must pass the Luhn check, stand alone (not inside a longer
// run of digits), be grouped like a card when separated, and not follow a
// word that names another kind of number ("order 4111...").
func SecretPatterns() []Pattern {
	return []Pattern{
		// key=value or key: value credentials; plain prose such as
		// "password reset" or "token: expired" is left alone.
		{Name: "credential", RE: regexp.MustCompile(`(?i)\b((?:auth|access|refresh|session)[_-]?token|token|api[_-]?key|secret|password|passwd|pwd|client[_-]?secret|access[_-]?key|private[_-]?key)(\s*[:=]\s*)("?)([^\s"',;]{6,})`),
			Replace: "$1$2$3" + Mask, Check: randomGroup(4, 6), keyed: true, hint: all(has(":", "="), hasFold("token", "key", "secret", "passw", "pwd"))},
		{Name: "bearer", RE: regexp.MustCompile(`(?i)\b(bearer)(\s+)([A-Za-z0-9._~+/\-]{12,}=*)`), Replace: "$1$2" + Mask, Check: randomGroup(3, 12), hint: hasFold("bearer")},
		// HTTP Basic credentials: "Authorization: Basic <base64 of user:password>".
		{Name: "basic_auth", RE: regexp.MustCompile(`(?i)\b(basic)(\s+)([A-Za-z0-9+/]{6,}={0,2})`), Replace: "$1$2" + Mask, Check: basicCheck, hint: hasFold("basic")},
		// A password in a URL: scheme://user:password@host. The user name
		// stays; placeholders ("password", "${DB_PASSWORD}", "***") are not
		// secrets.
		{Name: "url_password", RE: regexp.MustCompile(`\b([A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@\[\]]+:)([^\s/?#@]+)(@)`), Replace: "${1}" + Mask + "${3}", Check: urlPasswordCheck, hint: all(has("://"), has("@"))},
		{Name: "private_key", RE: regexp.MustCompile(`-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----)?`), hint: has("PRIVATE KEY")},
		// NATS credentials files ("-----BEGIN USER NKEY SEED-----") hold a
		// seed, masked on its own below; the block is masked whole.
		{Name: "nkey_seed", RE: regexp.MustCompile(`-----BEGIN (?:[A-Z0-9]+ )*NKEY SEED-----(?:[\s\S]*?------END (?:[A-Z0-9]+ )*NKEY SEED------)?`), hint: has("NKEY SEED")},
		// A NATS nkey seed: 'S', the key type (User, Account, Operator,
		// server N, Cluster, curve X), then 56 base32 characters (a
		// 2-byte prefix, the 32-byte seed and a CRC-16, 58 characters in
		// all, github.com/nats-io/nkeys).
		{Name: "nkey_seed", RE: regexp.MustCompile(`\bS[UAONCX][A-Z2-7]{56}\b`), hint: run(58, isBase32Upper)},
		// planex's own API keys (internal/authn: "pxk_" and 43 base64url
		// characters); shorter tails are still masked, a key cut in two
		// is still a key.
		{Name: "planex_api_key", RE: regexp.MustCompile(`\bpxk_[A-Za-z0-9_\-]{16,}`), hint: has("pxk_")},
		{Name: "jwt", RE: regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{16,}`), hint: has("eyJ")},
		// JWT-shaped tokens whose header is not written "eyJ" (a space or
		// a newline after the brace): three base64url parts, the first
		// decoding to a JSON object with "alg" or "typ", the second to a
		// JSON object.
		{Name: "jwt", RE: regexp.MustCompile(`\b([A-Za-z0-9_-]{10,})\.([A-Za-z0-9_-]{10,})\.[A-Za-z0-9_-]*`), Check: jwtCheck, hint: dotted(10)},
		{Name: "aws_access_key", RE: regexp.MustCompile(`\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b`), hint: has("AKIA", "ASIA", "ABIA", "ACCA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA")},
		{Name: "aws_secret_key", RE: regexp.MustCompile(`(?i)(aws_?secret_?(?:access_?)?key\s*[:=]\s*"?)[A-Za-z0-9/+=]{40}\b`), Replace: "${1}" + Mask, hint: hasFold("aws"), keyed: true},
		{Name: "github_token", RE: regexp.MustCompile(`\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b`), hint: has("gh", "github_pat_")},
		{Name: "slack_token", RE: regexp.MustCompile(`\bxox[abposre]-[A-Za-z0-9-]{10,}`), hint: has("xox")},
		{Name: "openai_key", RE: regexp.MustCompile(`\bsk-[A-Za-z0-9_\-]{16,}`), hint: has("sk-")},
		// Stripe secret and restricted keys, live and test: a test key
		// still reads and writes the account's test data.
		{Name: "stripe_key", RE: regexp.MustCompile(`\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}`), hint: has("k_live_", "k_test_")},
		// Google API keys: "AIza" and 35 characters.
		{Name: "google_api_key", RE: regexp.MustCompile(`\bAIza[A-Za-z0-9_\-]{35}`), hint: has("AIza")},
		{Name: "card", RE: regexp.MustCompile(`\b(?:\d[ .-]?){12,18}\d\b`), Replace: "[CARD]", Check: cardCheck, hint: cardDigits(13), contextual: true, keyed: true},
	}
}

// randomGroup confirms a match whose submatch group looks like a secret
// rather than a word: see LooksRandom.
func randomGroup(group, minLen int) func(string, []int) bool {
	return func(text string, loc []int) bool {
		if 2*group+1 >= len(loc) || loc[2*group] < 0 {
			return false
		}
		return LooksRandom(text[loc[2*group]:loc[2*group+1]], minLen)
	}
}

// LooksRandom reports whether v (trailing punctuation ignored) looks like
// a generated secret rather than a word: at least minLen characters and
// letters mixed with digits, or upper with lower case after the first
// character, or at least 32 characters.
func LooksRandom(v string, minLen int) bool {
	v = strings.TrimRight(v, ".!?:)]}>")
	if len(v) < minLen {
		return false
	}
	var letter, digit, upper, lower bool
	for i, c := range v {
		switch {
		case c >= '0' && c <= '9':
			digit = true
		case c >= 'a' && c <= 'z':
			letter, lower = true, true
		case c >= 'A' && c <= 'Z':
			letter = true
			if i > 0 {
				upper = true
			}
		}
	}
	return (letter && digit) || (upper && lower) || len(v) >= 32
}

// basicCheck confirms HTTP Basic credentials: the token decodes (standard
// base64) to printable "user:password", so "basic understanding" or
// "Basic Auth" is prose.
func basicCheck(text string, loc []int) bool {
	tok := text[loc[6]:loc[7]]
	raw, err := base64.StdEncoding.DecodeString(tok)
	if err != nil {
		if raw, err = base64.RawStdEncoding.DecodeString(strings.TrimRight(tok, "=")); err != nil {
			return false
		}
	}
	s := string(raw)
	if !utf8.ValidString(s) || !strings.Contains(s, ":") {
		return false
	}
	for _, c := range s {
		if unicode.IsControl(c) {
			return false
		}
	}
	return true
}

// urlPlaceholders are URL passwords that stand for one, in documentation
// and templates.
var urlPlaceholders = map[string]bool{"password": true, "pass": true, "passwd": true, "pwd": true, "pw": true, "secret": true, "redacted": true, "mask": true}

// urlPasswordCheck confirms the password of a scheme://user:password@host
// match unless it is a placeholder: a word in urlPlaceholders, a variable
// ("${DB_PASSWORD}", "$PW", "%s", "<password>", "{{ .pw }}") or only
// '*' or 'x'.
func urlPasswordCheck(text string, loc []int) bool {
	pw := text[loc[4]:loc[5]]
	switch {
	case urlPlaceholders[strings.ToLower(strings.Trim(pw, "[]"))]:
		return false
	case strings.IndexByte("$<{%[", pw[0]) >= 0:
		return false
	case strings.Trim(pw, "*xX") == "":
		return false
	}
	return true
}

// jwtCheck confirms a JWT-shaped match: its header decodes (base64url) to
// a JSON object naming "alg" or "typ", and its payload to a JSON object.
func jwtCheck(text string, loc []int) bool {
	var header map[string]json.RawMessage
	if !decodeJSONPart(text[loc[2]:loc[3]], &header) {
		return false
	}
	if _, ok := header["alg"]; !ok {
		if _, ok := header["typ"]; !ok {
			return false
		}
	}
	var payload map[string]json.RawMessage
	return decodeJSONPart(text[loc[4]:loc[5]], &payload)
}

// decodeJSONPart decodes a base64url JWT part into v.
func decodeJSONPart(part string, v any) bool {
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(part, "="))
	if err != nil {
		return false
	}
	return json.Unmarshal(raw, v) == nil
}

// notCardWords name numbers that are not payment cards when they come just
// before one.
var notCardWords = map[string]bool{
	"order": true, "invoice": true, "ticket": true, "tracking": true, "ref": true, "reference": true, "id": true,
	"phone": true, "tel": true, "account": true, "iban": true, "sku": true, "serial": true, "case": true, "shipment": true,
	"parcel": true, "booking": true, "customer": true, "policy": true, "no": true, "number": true, "#": true,
}

// cardCheck confirms a card number match: 13 to 19 digits passing the Luhn
// check, not part of a longer run of digits, grouped like a card (4-4-4-4,
// 4-6-5, ...) when separators are used, and not after a word such as
// "order" or "invoice".
func cardCheck(text string, loc []int) bool {
	start, end := loc[0], loc[1]
	m := text[start:end]
	var digits []byte
	var groups []int
	n := 0
	for i := 0; i < len(m); i++ {
		if m[i] >= '0' && m[i] <= '9' {
			digits = append(digits, m[i])
			n++
			continue
		}
		groups = append(groups, n)
		n = 0
	}
	groups = append(groups, n)
	if len(digits) < 13 || len(digits) > 19 || !Luhn(string(digits)) {
		return false
	}
	// Part of a longer number: "1 2022 2023 2024 2025" or "2024-2025.5".
	if start > 0 && (isDigit(text[start-1]) || (start > 1 && strings.IndexByte(" .-", text[start-1]) >= 0 && isDigit(text[start-2]))) {
		return false
	}
	if end < len(text) && (isDigit(text[end]) || (end+1 < len(text) && strings.IndexByte(".-", text[end]) >= 0 && isDigit(text[end+1]))) {
		return false
	}
	if len(groups) > 1 && !cardGrouping(groups) {
		return false
	}
	words := strings.Fields(strings.ToLower(text[:start]))
	if len(words) > 0 {
		w := strings.Trim(words[len(words)-1], ":.,;()")
		if notCardWords[w] || strings.HasSuffix(w, "#") {
			return false
		}
	}
	return true
}

// cardGrouping reports whether separated digit groups look like a card's:
// 4-4-4-4 (and 4-4-4-1..7 for 17-19 digits), 4-6-5 or 4-6-4.
func cardGrouping(g []int) bool {
	switch {
	case len(g) == 3 && g[0] == 4 && g[1] == 6 && (g[2] == 5 || g[2] == 4):
		return true
	case len(g) >= 4 && len(g) <= 5:
		for i, n := range g {
			if n != 4 && !(i == len(g)-1 && n >= 1 && n <= 4) {
				return false
			}
		}
		return true
	}
	return false
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// Luhn reports whether the digits pass the Luhn checksum of card numbers.
func Luhn(digits string) bool {
	sum := 0
	for i := range len(digits) {
		d := int(digits[len(digits)-1-i] - '0')
		if i%2 == 1 {
			d *= 2
			if d > 9 {
				d -= 9
			}
		}
		sum += d
	}
	return sum%10 == 0
}

// Match reports the name of the first pattern matching s, invisible
// characters (IsInvisible) ignored.
func (r *Redactor) Match(s string) (name string, ok bool) {
	if r == nil {
		return "", false
	}
	s = StripInvisible(s)
	t := &probe{s: s}
	for _, p := range r.patterns {
		if !p.mayMatch(t) {
			continue
		}
		if p.Check == nil {
			if p.RE.MatchString(s) {
				return p.Name, true
			}
			continue
		}
		for _, loc := range p.RE.FindAllStringSubmatchIndex(s, -1) {
			if p.Check(s, loc) {
				return p.Name, true
			}
		}
	}
	return "", false
}

// Redactor applies patterns to strings and masks sensitive fields.
type Redactor struct {
	patterns []Pattern
	// alone has the patterns that need no context and keyed those that
	// may take in a value's key (see Leaves); nil when they are all of
	// patterns.
	alone, keyed *Redactor
}

// New returns a Redactor with the given patterns (DefaultPatterns when
// none are given).
func New(patterns ...Pattern) *Redactor {
	if len(patterns) == 0 {
		patterns = DefaultPatterns()
	}
	r := &Redactor{patterns: patterns}
	var free, keyed []Pattern
	for _, p := range patterns {
		if !p.contextual {
			free = append(free, p)
		}
		if p.keyed || p.contextual {
			keyed = append(keyed, p)
		}
	}
	if len(free) < len(patterns) {
		r.alone = &Redactor{patterns: free}
	}
	if len(keyed) < len(patterns) {
		r.keyed = &Redactor{patterns: keyed}
	}
	return r
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

// String redacts every pattern match in s. Invisible characters
// (IsInvisible) are ignored when matching, and a match hides its whole
// original span, the invisible characters in it included.
func (r *Redactor) String(s string) string {
	if r == nil || s == "" {
		return s
	}
	norm, offs := s, []int(nil)
	invisible := hasInvisible(s)
	if invisible {
		norm, offs = normalize(s)
	}
	t := &probe{s: norm}
	for _, p := range r.patterns {
		if !p.mayMatch(t) {
			continue
		}
		repl := p.Replace
		if repl == "" {
			repl = Mask
		}
		var out string
		if invisible {
			out = p.replaceNormalized(s, norm, offs, repl)
		} else {
			out = p.replace(s, repl)
		}
		if out == s {
			continue
		}
		s, norm, offs = out, out, nil
		if invisible = hasInvisible(s); invisible {
			norm, offs = normalize(s)
		}
		t = &probe{s: norm}
	}
	return s
}

// replace replaces the confirmed matches of p in s by repl.
func (p Pattern) replace(s, repl string) string {
	if p.Check == nil {
		return p.RE.ReplaceAllString(s, repl)
	}
	locs := p.RE.FindAllStringSubmatchIndex(s, -1)
	if len(locs) == 0 {
		return s
	}
	var b strings.Builder
	last := 0
	for _, loc := range locs {
		if !p.Check(s, loc) {
			continue
		}
		b.WriteString(s[last:loc[0]])
		b.Write(p.RE.ExpandString(nil, repl, s, loc))
		last = loc[1]
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// replaceNormalized is replace for a string holding invisible characters:
// p is matched against norm, s without them (offs maps each byte of norm
// to its offset in s), and each confirmed match replaces
// its span of s, from the original offset of its first byte to that of
// its last.
func (p Pattern) replaceNormalized(s, norm string, offs []int, repl string) string {
	locs := p.RE.FindAllStringSubmatchIndex(norm, -1)
	var b strings.Builder
	last, changed := 0, false
	for _, loc := range locs {
		if loc[1] == loc[0] || (p.Check != nil && !p.Check(norm, loc)) {
			continue
		}
		start, end := offs[loc[0]], offs[loc[1]-1]+1
		b.WriteString(s[last:start])
		b.Write(p.RE.ExpandString(nil, repl, norm, loc))
		last, changed = end, true
	}
	if !changed {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
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

// Canonical renders a JSON-like value as one "path: value" line per leaf
// (map keys sorted), the form secret checks read: it never fails (NaN and
// ±Inf render as NaN, +Inf, -Inf; integral numbers without an exponent, so
// a card number given as a number is still seen), and every string is next
// to its key, so that {"password": "hunter22"} reads "password: hunter22".
func Canonical(v *structpb.Value) string {
	var b strings.Builder
	canonical(&b, "", v)
	return b.String()
}

// CanonicalStruct is Canonical of a struct (empty for nil).
func CanonicalStruct(s *structpb.Struct) string {
	if s == nil {
		return ""
	}
	return Canonical(structpb.NewStructValue(s))
}

func canonical(b *strings.Builder, path string, v *structpb.Value) {
	leaf := func(s string) {
		if path != "" {
			b.WriteString(path)
			b.WriteString(": ")
		}
		b.WriteString(s)
		b.WriteByte('\n')
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		leaf(k.StringValue)
	case *structpb.Value_NumberValue:
		f := k.NumberValue
		switch {
		case math.IsNaN(f), math.IsInf(f, 0):
			leaf(strconv.FormatFloat(f, 'g', -1, 64))
		case f == math.Trunc(f) && math.Abs(f) < 1e21:
			leaf(strconv.FormatFloat(f, 'f', -1, 64))
		default:
			leaf(strconv.FormatFloat(f, 'g', -1, 64))
		}
	case *structpb.Value_BoolValue:
		leaf(strconv.FormatBool(k.BoolValue))
	case *structpb.Value_StructValue:
		fields := k.StructValue.GetFields()
		keys := make([]string, 0, len(fields))
		for key := range fields {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		for _, key := range keys {
			p := key
			if path != "" {
				p = path + "." + key
			}
			canonical(b, p, fields[key])
		}
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			canonical(b, path, e)
		}
	default:
		leaf("null")
	}
}
