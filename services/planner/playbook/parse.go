package playbook

import (
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Playbook is one parsed and checked playbook.
type Playbook struct {
	// Name identifies the playbook in rationales and errors.
	Name string
	// Description says what the playbook does, in plain language.
	Description string
	// Examples are goals the playbook handles; each is checked at load
	// time to match.
	Examples []string
	// Source is "file:line" of the playbook's first line.
	Source string

	file       string
	line       int
	confidence float64
	patterns   []pattern
	params     map[string]*param
	paramOrder []string
	main       variant
	branches   []*branch
}

type pattern struct {
	re   *regexp.Regexp
	line int
}

// variant is a set of steps with the answer computed from them: the main
// steps of a playbook or the steps of one on_failure branch.
type variant struct {
	steps      []*stepDef
	answer     string
	answerLine int
	rationale  string
}

type stepDef struct {
	line             int
	id               string
	description      string
	tool             string
	args             *structpb.Struct
	dependsOn        []string
	expect           string
	expectLine       int
	requiresApproval bool
	timeout          time.Duration
}

type branch struct {
	name string
	line int
	when condition
	// fail, when set, is a CEL expression giving the message the run stops
	// with instead of replanning; such a branch has no steps.
	fail     string
	failLine int
	variant
}

type condition struct {
	steps   []string
	codes   []planexv1.ErrorCode
	message *regexp.Regexp
}

// file parses the YAML documents of one file. Problems are collected with
// their line so that one pass reports everything wrong with a file.
type file struct {
	name     string
	problems []string
}

func (f *file) errorf(line int, format string, args ...any) {
	f.problems = append(f.problems, fmt.Sprintf("%s:%d: %s", f.name, line, fmt.Sprintf(format, args...)))
}

func (f *file) err() error {
	if len(f.problems) == 0 {
		return nil
	}
	errs := make([]error, len(f.problems))
	for i, p := range f.problems {
		errs[i] = errors.New(p)
	}
	return errors.Join(errs...)
}

// parseFile parses every YAML document of r as a playbook.
func parseFile(name string, r io.Reader) ([]*Playbook, error) {
	f := &file{name: name}
	dec := yaml.NewDecoder(r)
	var books []*Playbook
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// yaml errors carry "yaml: line N: reason"; keep them whole.
			f.problems = append(f.problems, fmt.Sprintf("%s: %s", name, strings.TrimPrefix(err.Error(), "yaml: ")))
			break
		}
		if len(doc.Content) == 0 {
			continue // an empty document, e.g. a trailing "---"
		}
		if b := f.playbook(doc.Content[0]); b != nil {
			books = append(books, b)
		}
	}
	if err := f.err(); err != nil {
		return nil, err
	}
	if len(books) == 0 {
		return nil, fmt.Errorf("%s: no playbook in file", name)
	}
	return books, nil
}

var namePattern = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)

// fields iterates the key/value pairs of a mapping node, reporting keys
// that are not in allowed (listed in the message) and duplicate keys.
func (f *file) fields(n *yaml.Node, what string, allowed []string, fn func(key string, v *yaml.Node)) bool {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		f.errorf(n.Line, "%s: want a mapping, got %s", what, kindName(n))
		return false
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := k.Value
		switch {
		case !slices.Contains(allowed, key):
			f.errorf(k.Line, "%s: unknown field %q (want one of %s)", what, key, strings.Join(allowed, ", "))
		case seen[key]:
			f.errorf(k.Line, "%s: duplicate field %q", what, key)
		default:
			seen[key] = true
			fn(key, v)
		}
	}
	return true
}

func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "null"
		}
		return fmt.Sprintf("%s %q", strings.TrimPrefix(n.ShortTag(), "!!"), n.Value)
	default:
		return "an unsupported node"
	}
}

func (f *file) str(n *yaml.Node, what string) (string, bool) {
	n = resolve(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		f.errorf(n.Line, "%s: want a string, got %s", what, kindName(n))
		return "", false
	}
	return n.Value, true
}

func (f *file) boolean(n *yaml.Node, what string) bool {
	n = resolve(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
		f.errorf(n.Line, "%s: want true or false, got %s", what, kindName(n))
		return false
	}
	b, _ := strconv.ParseBool(n.Value)
	return b
}

func (f *file) number(n *yaml.Node, what string) (float64, bool) {
	n = resolve(n)
	if n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float") {
		if v, err := strconv.ParseFloat(n.Value, 64); err == nil && !math.IsNaN(v) && !math.IsInf(v, 0) {
			return v, true
		}
	}
	f.errorf(n.Line, "%s: want a number, got %s", what, kindName(n))
	return 0, false
}

// regexp compiles a regular expression, reporting a bad one.
func (f *file) regexp(n *yaml.Node, what string) *regexp.Regexp {
	s, ok := f.str(n, what)
	if !ok {
		return nil
	}
	re, err := regexp.Compile(s)
	if err != nil {
		f.errorf(resolve(n).Line, "%s: bad regular expression: %v", what, err)
		return nil
	}
	return re
}

// strs accepts a list of strings or a single string.
func (f *file) strs(n *yaml.Node, what string) []string {
	n = resolve(n)
	if n.Kind == yaml.ScalarNode {
		if s, ok := f.str(n, what); ok {
			return []string{s}
		}
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		f.errorf(n.Line, "%s: want a list of strings, got %s", what, kindName(n))
		return nil
	}
	out := make([]string, 0, len(n.Content))
	for i, c := range n.Content {
		if s, ok := f.str(c, fmt.Sprintf("%s[%d]", what, i)); ok {
			out = append(out, s)
		}
	}
	return out
}

func (f *file) playbook(n *yaml.Node) *Playbook {
	b := &Playbook{
		Source:     fmt.Sprintf("%s:%d", f.name, n.Line),
		file:       f.name,
		line:       n.Line,
		confidence: 1,
		params:     map[string]*param{},
	}
	before := len(f.problems)
	var stepsNode, failNode, paramsNode *yaml.Node
	ok := f.fields(n, "playbook", []string{"name", "description", "examples", "match", "params", "confidence", "rationale", "steps", "answer", "on_failure"}, func(key string, v *yaml.Node) {
		switch key {
		case "name":
			if s, ok := f.str(v, "name"); ok {
				if !namePattern.MatchString(s) {
					f.errorf(v.Line, "name: %q does not match %s", s, namePattern)
				}
				b.Name = s
			}
		case "description":
			b.Description, _ = f.str(v, "description")
		case "examples":
			b.Examples = f.strs(v, "examples")
		case "match":
			for i, c := range seqOrOne(v) {
				if re := f.regexp(c, fmt.Sprintf("match[%d]", i)); re != nil {
					b.patterns = append(b.patterns, pattern{re: re, line: c.Line})
				}
			}
		case "params":
			paramsNode = v
		case "confidence":
			if c, ok := f.number(v, "confidence"); ok {
				if c < 0 || c > 1 {
					f.errorf(v.Line, "confidence: must be in [0, 1], got %v", c)
				}
				b.confidence = c
			}
		case "rationale":
			b.main.rationale, _ = f.str(v, "rationale")
		case "steps":
			stepsNode = v
		case "answer":
			b.main.answer, _ = f.str(v, "answer")
			b.main.answerLine = v.Line
		case "on_failure":
			failNode = v
		}
	})
	if !ok {
		return nil
	}
	// After match: the captures are checked against the declared params.
	f.params(b, paramsNode)
	if b.Name == "" {
		f.errorf(n.Line, "playbook: missing field \"name\"")
	}
	if strings.TrimSpace(b.Description) == "" {
		f.errorf(n.Line, "playbook %s: missing field \"description\"", b.Name)
	}
	if len(b.patterns) == 0 {
		f.errorf(n.Line, "playbook %s: missing field \"match\" (a list of regular expressions)", b.Name)
	}
	if stepsNode == nil {
		f.errorf(n.Line, "playbook %s: missing field \"steps\"", b.Name)
	} else {
		b.main.steps = f.steps(stepsNode, "steps")
	}
	if failNode != nil {
		b.branches = f.branches(failNode)
	}
	if len(f.problems) > before {
		return nil
	}
	return b
}

func seqOrOne(n *yaml.Node) []*yaml.Node {
	n = resolve(n)
	if n.Kind == yaml.SequenceNode {
		return n.Content
	}
	return []*yaml.Node{n}
}

func (f *file) params(b *Playbook, n *yaml.Node) {
	if n == nil {
		n = &yaml.Node{Kind: yaml.MappingNode}
	}
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		f.errorf(n.Line, "params: want a mapping of parameter names, got %s", kindName(n))
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], resolve(n.Content[i+1])
		name := k.Value
		if !paramName.MatchString(name) {
			f.errorf(k.Line, "params: name %q does not match %s", name, paramName)
			continue
		}
		if b.params[name] != nil {
			f.errorf(k.Line, "params: duplicate parameter %q", name)
			continue
		}
		p := &param{name: name, line: k.Line, typ: "string", transforms: []string{"trim"}}
		b.params[name] = p
		b.paramOrder = append(b.paramOrder, name)
		if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null" {
			continue // "customer:" alone declares an optional string
		}
		what := "params." + name
		f.fields(v, what, []string{"description", "required", "default", "type", "transform", "lookup", "pattern", "min", "max", "hint"}, func(key string, v *yaml.Node) {
			switch key {
			case "description":
				p.description, _ = f.str(v, what+".description")
			case "hint":
				p.hint, _ = f.str(v, what+".hint")
			case "required":
				p.required = f.boolean(v, what+".required")
			case "default":
				val, err := scalarValue(v)
				if err != nil {
					f.errorf(v.Line, "%s.default: %v", what, err)
					return
				}
				p.def, p.hasDefault = val, true
			case "type":
				if s, ok := f.str(v, what+".type"); ok {
					if !slices.Contains(paramTypes, s) {
						f.errorf(v.Line, "%s.type: unknown type %q (want one of %s)", what, s, strings.Join(paramTypes, ", "))
					}
					p.typ = s
				}
			case "transform":
				p.transforms = f.strs(v, what+".transform")
				for _, t := range p.transforms {
					if !slices.Contains(transformNames, t) {
						f.errorf(v.Line, "%s.transform: unknown transform %q (want one of %s)", what, t, strings.Join(transformNames, ", "))
					}
				}
			case "lookup":
				p.lookup = f.lookup(v, what+".lookup")
			case "pattern":
				p.pattern = f.regexp(v, what+".pattern")
			case "min":
				if x, ok := f.number(v, what+".min"); ok {
					p.min = &x
				}
			case "max":
				if x, ok := f.number(v, what+".max"); ok {
					p.max = &x
				}
			}
		})
		if p.hasDefault {
			if _, err := p.convert(p.def); err != nil {
				f.errorf(v.Line, "%s.default: %v", what, err)
			}
		}
		if (p.min != nil || p.max != nil) && p.typ != "int" && p.typ != "number" {
			f.errorf(v.Line, "%s: min and max need type int or number", what)
		}
	}
	// Every named capture must be a declared parameter, so that a typo in a
	// pattern cannot silently drop a value.
	for _, pt := range b.patterns {
		for _, c := range pt.re.SubexpNames() {
			if c != "" && b.params[c] == nil {
				f.errorf(pt.line, "match: capture group %q is not declared under params", c)
			}
		}
	}
}

func (f *file) lookup(n *yaml.Node, what string) map[string]string {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		f.errorf(n.Line, "%s: want a mapping from phrase to value, got %s", what, kindName(n))
		return nil
	}
	m := make(map[string]string, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		val, ok := f.str(v, fmt.Sprintf("%s[%q]", what, k.Value))
		if !ok {
			continue
		}
		key := lookupKey(k.Value)
		if _, dup := m[key]; dup {
			f.errorf(k.Line, "%s: duplicate phrase %q", what, k.Value)
		}
		m[key] = val
	}
	return m
}

func (f *file) steps(n *yaml.Node, what string) []*stepDef {
	n = resolve(n)
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		f.errorf(n.Line, "%s: want a non-empty list of steps, got %s", what, kindName(n))
		return nil
	}
	out := make([]*stepDef, 0, len(n.Content))
	ids := map[string]int{}
	for i, c := range n.Content {
		sw := fmt.Sprintf("%s[%d]", what, i)
		s := &stepDef{line: c.Line}
		ok := f.fields(c, sw, []string{"id", "description", "tool", "args", "depends_on", "expect", "requires_approval", "timeout"}, func(key string, v *yaml.Node) {
			switch key {
			case "id":
				s.id, _ = f.str(v, sw+".id")
			case "description":
				s.description, _ = f.str(v, sw+".description")
			case "tool":
				s.tool, _ = f.str(v, sw+".tool")
				if s.tool != "" && !toolName.MatchString(s.tool) {
					f.errorf(v.Line, "%s.tool: %q is not a tool name like sql.query", sw, s.tool)
				}
			case "args":
				val, err := nodeValue(v)
				if err != nil {
					f.errorf(v.Line, "%s.args: %v", sw, err)
					return
				}
				st := val.GetStructValue()
				if st == nil {
					f.errorf(v.Line, "%s.args: want a mapping, got %s", sw, kindName(resolve(v)))
					return
				}
				s.args = st
			case "depends_on":
				s.dependsOn = f.strs(v, sw+".depends_on")
			case "expect":
				s.expect, _ = f.str(v, sw+".expect")
				s.expectLine = v.Line
			case "requires_approval":
				s.requiresApproval = f.boolean(v, sw+".requires_approval")
			case "timeout":
				if str, ok := f.str(v, sw+".timeout"); ok {
					d, err := time.ParseDuration(str)
					if err != nil || d <= 0 {
						f.errorf(v.Line, "%s.timeout: %q is not a positive duration like 30s", sw, str)
					}
					s.timeout = d
				}
			}
		})
		if !ok {
			continue
		}
		if s.id == "" {
			f.errorf(c.Line, "%s: missing field \"id\"", sw)
		} else if prev, dup := ids[s.id]; dup {
			f.errorf(c.Line, "%s: duplicate step id %q (first at line %d)", sw, s.id, prev)
		} else {
			ids[s.id] = c.Line
		}
		if s.tool == "" {
			f.errorf(c.Line, "%s: missing field \"tool\"", sw)
		}
		out = append(out, s)
	}
	return out
}

func (f *file) branches(n *yaml.Node) []*branch {
	n = resolve(n)
	if n.Kind != yaml.SequenceNode {
		f.errorf(n.Line, "on_failure: want a list of branches, got %s", kindName(n))
		return nil
	}
	var out []*branch
	for i, c := range n.Content {
		bw := fmt.Sprintf("on_failure[%d]", i)
		br := &branch{line: c.Line, name: strconv.Itoa(i)}
		var stepsNode *yaml.Node
		ok := f.fields(c, bw, []string{"name", "when", "rationale", "steps", "answer", "fail"}, func(key string, v *yaml.Node) {
			switch key {
			case "name":
				br.name, _ = f.str(v, bw+".name")
			case "when":
				f.fields(v, bw+".when", []string{"step", "code", "message"}, func(key string, v *yaml.Node) {
					switch key {
					case "step":
						br.when.steps = f.strs(v, bw+".when.step")
					case "code":
						for _, s := range f.strs(v, bw+".when.code") {
							code, ok := errorCode(s)
							if !ok {
								f.errorf(v.Line, "%s.when.code: unknown error code %q (want one of %s)", bw, s, strings.Join(errorCodeNames(), ", "))
								continue
							}
							br.when.codes = append(br.when.codes, code)
						}
					case "message":
						br.when.message = f.regexp(v, bw+".when.message")
					}
				})
			case "rationale":
				br.rationale, _ = f.str(v, bw+".rationale")
			case "steps":
				stepsNode = v
			case "answer":
				br.answer, _ = f.str(v, bw+".answer")
				br.answerLine = v.Line
			case "fail":
				br.fail, _ = f.str(v, bw+".fail")
				br.failLine = v.Line
			}
		})
		if !ok {
			continue
		}
		switch {
		case br.fail != "" && (stepsNode != nil || br.answer != ""):
			f.errorf(c.Line, "%s: a branch has either \"fail\" or \"steps\" (and \"answer\"), not both", bw)
		case br.fail != "":
		case stepsNode == nil:
			f.errorf(c.Line, "%s: missing field \"steps\" (or \"fail\")", bw)
		default:
			br.steps = f.steps(stepsNode, bw+".steps")
		}
		out = append(out, br)
	}
	return out
}

var (
	toolName  = regexp.MustCompile(`^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$`)
	paramName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)
)

func errorCode(s string) (planexv1.ErrorCode, bool) {
	s = strings.ToUpper(strings.TrimSpace(s))
	if !strings.HasPrefix(s, "ERROR_CODE_") {
		s = "ERROR_CODE_" + s
	}
	v, ok := planexv1.ErrorCode_value[s]
	if !ok || v == 0 {
		return 0, false
	}
	return planexv1.ErrorCode(v), true
}

func errorCodeNames() []string {
	var names []string
	for v := range planexv1.ErrorCode_name {
		if v != 0 {
			names = append(names, strings.TrimPrefix(planexv1.ErrorCode_name[v], "ERROR_CODE_"))
		}
	}
	slices.SortFunc(names, func(a, b string) int {
		return int(planexv1.ErrorCode_value["ERROR_CODE_"+a] - planexv1.ErrorCode_value["ERROR_CODE_"+b])
	})
	return names
}

// scalarValue converts a scalar node to a Go value by its resolved tag.
func scalarValue(n *yaml.Node) (any, error) {
	n = resolve(n)
	if n.Kind != yaml.ScalarNode {
		return nil, fmt.Errorf("want a scalar, got %s", kindName(n))
	}
	switch n.ShortTag() {
	case "!!null":
		return nil, nil
	case "!!bool":
		b, err := strconv.ParseBool(n.Value)
		if err != nil {
			return nil, fmt.Errorf("bad boolean %q", n.Value)
		}
		return b, nil
	case "!!int":
		var i int64
		if err := n.Decode(&i); err != nil {
			return nil, fmt.Errorf("bad integer %q", n.Value)
		}
		return i, nil
	case "!!float":
		var x float64
		if err := n.Decode(&x); err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("bad number %q", n.Value)
		}
		return x, nil
	default:
		// Strings, and timestamps kept as written.
		return n.Value, nil
	}
}

// nodeValue converts a YAML node to a protobuf value, keeping the scalars'
// types (a timestamp stays the string it was written as).
func nodeValue(n *yaml.Node) (*structpb.Value, error) {
	n = resolve(n)
	switch n.Kind {
	case yaml.MappingNode:
		fields := make(map[string]*structpb.Value, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := resolve(n.Content[i])
			if k.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: keys must be strings", k.Line)
			}
			if _, dup := fields[k.Value]; dup {
				return nil, fmt.Errorf("line %d: duplicate key %q", k.Line, k.Value)
			}
			v, err := nodeValue(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			fields[k.Value] = v
		}
		return structpb.NewStructValue(&structpb.Struct{Fields: fields}), nil
	case yaml.SequenceNode:
		vals := make([]*structpb.Value, len(n.Content))
		for i, c := range n.Content {
			v, err := nodeValue(c)
			if err != nil {
				return nil, err
			}
			vals[i] = v
		}
		return structpb.NewListValue(&structpb.ListValue{Values: vals}), nil
	case yaml.ScalarNode:
		v, err := scalarValue(n)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n.Line, err)
		}
		return toValue(v)
	default:
		return nil, fmt.Errorf("line %d: unsupported YAML node", n.Line)
	}
}

// toValue converts a param or scalar value to a protobuf value.
func toValue(v any) (*structpb.Value, error) {
	switch x := v.(type) {
	case nil:
		return structpb.NewNullValue(), nil
	case int64:
		return structpb.NewNumberValue(float64(x)), nil
	default:
		return structpb.NewValue(x)
	}
}
