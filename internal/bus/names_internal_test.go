package bus

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// The hand-written checks say what their regular expressions say, for
// edge cases and for random strings over the characters that matter.
func TestNameChecksAreTheirExpressions(t *testing.T) {
	token := regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
	tool := regexp.MustCompile(`^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$`)
	cases := []string{"", "a", "a.b", ".", "a.", ".b", "a..b", "a.b.c", "_a.b", "a._b", "a1.b2", "1a.b", "A.b", "a-b", "a\n",
		"a.b\n", "é", strings.Repeat("x", 128), strings.Repeat("x", 129), "01ABC", "run_1-x", "a b", "a>", "*"}
	const alphabet = "aZz09_-.> \nÅ"
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		var b strings.Builder
		for range r.IntN(8) {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		cases = append(cases, b.String())
	}
	for _, s := range cases {
		if got, want := ValidToken(s), token.MatchString(s); got != want {
			t.Fatalf("ValidToken(%q) = %v, the expression says %v", s, got, want)
		}
		if got, want := validTool(s), tool.MatchString(s); got != want {
			t.Fatalf("validTool(%q) = %v, the expression says %v", s, got, want)
		}
	}
}
