package playbook

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// param is a declared playbook parameter.
type param struct {
	name        string
	line        int
	description string
	required    bool
	def         any
	hasDefault  bool
	typ         string
	transforms  []string
	lookup      map[string]string
	pattern     *regexp.Regexp
	min, max    *float64
	// hint says what a valid value looks like; it ends the message of a
	// rejected value.
	hint string
}

var (
	paramTypes     = []string{"string", "int", "number", "bool"}
	transformNames = []string{"trim", "lower", "upper", "title", "collapse_spaces"}
)

// maxParamLen bounds a bound parameter value, so that a goal cannot smuggle
// a large blob into a plan.
const maxParamLen = 512

// bind computes the value of p from a capture (captured reports whether the
// group took part in the match), the run's inputs and the default. present
// is false when no source provided a value and p is optional.
func (p *param) bind(capture string, captured bool, inputs map[string]any) (v any, present bool, err error) {
	var raw any
	switch in, ok := inputs[p.name]; {
	case captured && strings.TrimSpace(capture) != "":
		raw = capture
	case ok && in != nil:
		raw = in
	case p.hasDefault:
		raw = p.def
	case p.required:
		return nil, false, fmt.Errorf("%s: required, but the goal and the inputs give no value", p.name)
	default:
		return nil, false, nil
	}
	if s, ok := raw.(string); ok {
		raw = p.normalize(s)
	}
	v, err = p.convert(raw)
	if err != nil {
		if p.hint != "" {
			return nil, false, fmt.Errorf("%s: %w; want %s", p.name, err, p.hint)
		}
		return nil, false, fmt.Errorf("%s: %w", p.name, err)
	}
	return v, true, nil
}

// normalize applies the transforms, then the lookup table, to a string.
func (p *param) normalize(s string) string {
	for _, t := range p.transforms {
		switch t {
		case "trim":
			s = strings.TrimSpace(s)
		case "lower":
			s = strings.ToLower(s)
		case "upper":
			s = strings.ToUpper(s)
		case "title":
			s = titleCase(s)
		case "collapse_spaces":
			s = strings.Join(strings.Fields(s), " ")
		}
	}
	if v, ok := p.lookup[lookupKey(s)]; ok {
		s = v
	}
	return s
}

// convert checks and converts a value to the param's type, then applies
// the range and pattern checks.
func (p *param) convert(raw any) (any, error) {
	var v any
	switch p.typ {
	case "int", "number":
		n, err := p.number(raw)
		if err != nil {
			return nil, err
		}
		v = n
	case "bool":
		b, err := toBool(raw)
		if err != nil {
			return nil, err
		}
		v = b
	default:
		s, ok := raw.(string)
		if !ok {
			s = fmt.Sprint(raw)
		}
		if !utf8.ValidString(s) {
			return nil, fmt.Errorf("value is not valid UTF-8")
		}
		if len(s) > maxParamLen {
			return nil, fmt.Errorf("value is %d bytes long, limit is %d", len(s), maxParamLen)
		}
		// The engine would evaluate it as an expression; there is no escape.
		if strings.Contains(s, "${{") {
			return nil, fmt.Errorf("value %q contains \"${{\", which is not allowed in a parameter", s)
		}
		v = s
	}
	if p.pattern != nil {
		if s := fmt.Sprint(v); !p.pattern.MatchString(s) {
			if p.hint != "" {
				return nil, fmt.Errorf("%q is not valid", s)
			}
			return nil, fmt.Errorf("value %q does not match %s", s, p.pattern)
		}
	}
	return v, nil
}

// number converts to int64 or float64 by the param's type and checks the
// range.
func (p *param) number(raw any) (any, error) {
	x, err := toNumber(raw)
	var v any = x
	if p.typ == "int" {
		var n int64
		n, err = toInt(raw)
		x, v = float64(n), n
	}
	if err != nil {
		return nil, err
	}
	return v, p.inRange(x)
}

func (p *param) inRange(x float64) error {
	switch {
	case (p.min == nil || x >= *p.min) && (p.max == nil || x <= *p.max):
		return nil
	case p.min != nil && p.max != nil:
		return fmt.Errorf("%v is out of range: must be from %v to %v", x, *p.min, *p.max)
	case p.min != nil:
		return fmt.Errorf("%v is out of range: must be at least %v", x, *p.min)
	default:
		return fmt.Errorf("%v is out of range: must be at most %v", x, *p.max)
	}
}

// numberWords lets goals say "top five" as well as "top 5".
var numberWords = map[string]int64{
	"zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
	"seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
	"thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16,
	"seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20,
	"a dozen": 12, "dozen": 12,
}

func toInt(raw any) (int64, error) {
	x, err := toNumber(raw)
	if err != nil || x != math.Trunc(x) || math.Abs(x) > 1<<53 {
		return 0, fmt.Errorf("value %s is not an integer", show(raw))
	}
	return int64(x), nil
}

func toNumber(raw any) (float64, error) {
	switch x := raw.(type) {
	case int64:
		return float64(x), nil
	case int:
		return float64(x), nil
	case float64:
		return x, nil
	case string:
		s := strings.ToLower(strings.TrimSpace(x))
		if n, ok := numberWords[s]; ok {
			return float64(n), nil
		}
		f, err := strconv.ParseFloat(strings.ReplaceAll(s, ",", ""), 64)
		if err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
			return f, nil
		}
	}
	return 0, fmt.Errorf("value %s is not a number", show(raw))
}

// show quotes strings and prints other values as they are.
func show(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

func toBool(raw any) (bool, error) {
	switch x := raw.(type) {
	case bool:
		return x, nil
	case string:
		switch strings.ToLower(strings.TrimSpace(x)) {
		case "true", "yes", "y", "on", "1":
			return true, nil
		case "false", "no", "n", "off", "0":
			return false, nil
		}
	}
	return false, fmt.Errorf("value %v is not a boolean", raw)
}

// titleCase upper-cases the first letter of every word and lower-cases the
// rest: "acme CORP" becomes "Acme Corp".
func titleCase(s string) string {
	var b strings.Builder
	start := true
	for _, r := range s {
		switch {
		case unicode.IsSpace(r) || r == '-':
			start = true
		case start:
			r = unicode.ToUpper(r)
			start = false
		default:
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// lookupKey is how lookup phrases compare: without case, surrounding space
// or repeated spaces.
func lookupKey(s string) string {
	return strings.Join(strings.Fields(strings.ToLower(s)), " ")
}

// zero is a stand-in value of the param's type, used to check expressions
// at load time.
func (p *param) zero() any {
	switch p.typ {
	case "int":
		return int64(0)
	case "number":
		return float64(0)
	case "bool":
		return false
	default:
		return ""
	}
}
