package plan

import (
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
)

// Catalog looks tools up by name. Implementations must be safe for
// concurrent use and must not modify a ToolSpec once they returned it.
type Catalog interface {
	// Tool returns the spec of the named tool and whether it exists.
	Tool(name string) (*planexv1.ToolSpec, bool)
}

// MapCatalog is a [Catalog] backed by a map from tool name to spec.
type MapCatalog map[string]*planexv1.ToolSpec

// Tool implements [Catalog]; a nil MapCatalog holds no tools.
func (c MapCatalog) Tool(name string) (*planexv1.ToolSpec, bool) {
	s, ok := c[name]
	return s, ok && s != nil
}

// NewCatalog indexes specs by name; nil specs are skipped and a later spec
// replaces an earlier one with the same name.
func NewCatalog(specs []*planexv1.ToolSpec) MapCatalog {
	c := make(MapCatalog, len(specs))
	for _, s := range specs {
		if s != nil {
			c[s.GetName()] = s
		}
	}
	return c
}

// defaultSchemaLimit bounds a SchemaCache whose limit is not set.
const defaultSchemaLimit = 1024

// SchemaCache compiles the argument schemas of tools once and keeps them,
// keyed by tool name and checked against the schema they were compiled
// from, so a tool whose schema changes is recompiled. The zero value is
// ready to use; it is safe for concurrent use.
type SchemaCache struct {
	// Limit bounds the number of cached tools; 0 means 1024. Set it before
	// the first use.
	Limit int

	mu      sync.RWMutex
	entries map[string]*schemaEntry
}

type schemaEntry struct {
	src *structpb.Struct // the schema the entry was compiled from
	sch *jsonschema.Schema
	err error
}

// schemas backs Validate and ValidateArgs.
var schemas SchemaCache

// ValidateArgs checks resolved arguments against the tool's args_schema
// before a tool runs, using a shared [SchemaCache]. Strings are taken
// literally: a leftover "${{" is not a reference any more. It returns a
// [*ValidationError] matching [ErrInvalidArgs] whose problems name the field
// path (args.to[1]) and the value, or another error when the schema itself
// does not compile.
func ValidateArgs(spec *planexv1.ToolSpec, args *structpb.Struct) error {
	return schemas.Validate(spec, args)
}

// Validate is [ValidateArgs] backed by this cache.
func (c *SchemaCache) Validate(spec *planexv1.ToolSpec, args *structpb.Struct) error {
	if spec == nil {
		return errors.New("validate args: no tool spec")
	}
	sch, err := c.schema(spec)
	if err != nil {
		return err
	}
	if sch == nil {
		return nil
	}
	inst := structToAny(args)
	problems := schemaProblems(sch, inst, nil)
	if len(problems) == 0 {
		return nil
	}
	return &ValidationError{Problems: problems, kind: ErrInvalidArgs}
}

// schema returns the compiled args schema of spec, or nil when the tool has
// none (any arguments are accepted).
func (c *SchemaCache) schema(spec *planexv1.ToolSpec) (*jsonschema.Schema, error) {
	src := spec.GetArgsSchema()
	if src == nil {
		return nil, nil
	}
	name := spec.GetName()
	c.mu.RLock()
	e := c.entries[name]
	c.mu.RUnlock()
	switch {
	case e != nil && e.src == src:
	case e != nil && proto.Equal(e.src, src):
		// Same schema in a new message (a re-read catalog): remember the new
		// pointer so the next lookup takes the fast path.
		e = &schemaEntry{src: src, sch: e.sch, err: e.err}
		c.store(name, e)
	default:
		e = &schemaEntry{src: src}
		e.sch, e.err = compileSchema(src)
		if e.err != nil {
			e.err = fmt.Errorf("tool %q: args schema: %s", name, oneLine(e.err.Error()))
		}
		c.store(name, e)
	}
	return e.sch, e.err
}

func (c *SchemaCache) store(name string, e *schemaEntry) {
	limit := c.Limit
	if limit <= 0 {
		limit = defaultSchemaLimit
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = make(map[string]*schemaEntry)
	}
	if _, ok := c.entries[name]; !ok && len(c.entries) >= limit {
		// Evict an arbitrary entry; catalogs are far smaller than the limit,
		// so this only bounds memory against churn.
		for k := range c.entries {
			delete(c.entries, k)
			break
		}
	}
	c.entries[name] = e
}

// schemaURL names the one resource each compiler holds.
const schemaURL = "urn:planex:tool-args"

// refuseLoader keeps schemas from reading files or the network through
// $ref; the draft meta-schemas are built into the library.
type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("external schema %q is not allowed", url)
}

func compileSchema(src *structpb.Struct) (*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(refuseLoader{})
	if err := c.AddResource(schemaURL, structToAny(src)); err != nil {
		return nil, err
	}
	return c.Compile(schemaURL)
}

// refKind is how a string argument uses references.
type refKind uint8

const (
	// refWhole: the string is one reference and may become any JSON value.
	refWhole refKind = iota + 1
	// refText: the string interpolates references and stays a string.
	refText
)

// refSet records where references sit in an argument instance, keyed by
// JSON pointer.
type refSet struct {
	at        map[string]refKind
	ancestors map[string]bool // strict ancestors of a reference
}

func (r *refSet) add(tokens []string, k refKind) {
	if r.at == nil {
		r.at = make(map[string]refKind)
		r.ancestors = make(map[string]bool)
	}
	r.at[pointer(tokens)] = k
	for i := range tokens {
		r.ancestors[pointer(tokens[:i])] = true
	}
}

// pointer encodes tokens as an RFC 6901 JSON pointer.
func pointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		t = strings.ReplaceAll(t, "~", "~0")
		b.WriteString(strings.ReplaceAll(t, "/", "~1"))
	}
	return b.String()
}

var printer = message.NewPrinter(language.English)

// schemaProblems validates inst and turns the errors into problems, sorted
// by field. Errors that a reference could make go away are dropped: see
// schemaFilter.
func schemaProblems(sch *jsonschema.Schema, inst any, refs *refSet) []Problem {
	err := sch.Validate(inst)
	if err == nil {
		return nil
	}
	var verr *jsonschema.ValidationError
	if !errors.As(err, &verr) {
		return []Problem{{Field: "args", Message: err.Error()}}
	}
	f := schemaFilter{inst: inst, refs: refs}
	if f.refs == nil {
		f.refs = &refSet{}
	}
	problems := f.collect(verr)
	slices.SortStableFunc(problems, func(a, b Problem) int {
		return strings.Compare(a.Field, b.Field)
	})
	return problems
}

// schemaFilter converts jsonschema errors into problems. The value of a
// whole-string reference is unknown, so every error at its location is
// dropped; an interpolated string is a string of unknown content, so only a
// type error that rules out strings stays. Errors of alternatives (anyOf,
// oneOf, contains) are dropped when one alternative failed only because of
// references, and a few errors about a container that holds a reference
// (const, enum, not, uniqueItems) are dropped because they depend on the
// reference's value. Everything else is still reported.
type schemaFilter struct {
	inst any
	refs *refSet
}

func (f *schemaFilter) collect(e *jsonschema.ValidationError) []Problem {
	switch e.ErrorKind.(type) {
	case *kind.AnyOf, *kind.OneOf, *kind.Contains, *kind.MinContains:
		if len(e.Causes) == 0 {
			return f.leaf(e)
		}
		field, _ := f.locate(e.InstanceLocation)
		var details []string
		for _, cause := range e.Causes {
			ps := f.collect(cause)
			if len(ps) == 0 {
				return nil
			}
			for _, p := range ps {
				if p.Field != field {
					p.Message = p.Field + ": " + p.Message
				}
				details = append(details, p.Message)
			}
		}
		return []Problem{{
			Field:   field,
			Message: keyword(e.ErrorKind) + " failed: " + strings.Join(details, "; "),
		}}
	case *kind.PropertyNames:
		return f.leaf(e)
	}
	if len(e.Causes) > 0 {
		var out []Problem
		for _, cause := range e.Causes {
			out = append(out, f.collect(cause)...)
		}
		return out
	}
	return f.leaf(e)
}

func (f *schemaFilter) leaf(e *jsonschema.ValidationError) []Problem {
	ptr := pointer(e.InstanceLocation)
	if rk, ok := f.refs.at[ptr]; ok {
		t, isType := e.ErrorKind.(*kind.Type)
		if rk == refWhole || !isType || slices.Contains(t.Want, "string") {
			return nil
		}
	}
	if f.refs.ancestors[ptr] {
		switch e.ErrorKind.(type) {
		case *kind.Const, *kind.Enum, *kind.Not, *kind.UniqueItems, *kind.OneOf:
			return nil
		}
	}
	return f.describe(e)
}

// keyword names the schema keyword behind an error kind.
func keyword(k jsonschema.ErrorKind) string {
	if p := k.KeywordPath(); len(p) > 0 {
		return p[len(p)-1]
	}
	return "schema"
}

// describe words an error as "expected array, got string "x"", naming the
// offending value.
func (f *schemaFilter) describe(e *jsonschema.ValidationError) []Problem {
	field, val := f.locate(e.InstanceLocation)
	var want string
	switch k := e.ErrorKind.(type) {
	case *kind.Required:
		out := make([]Problem, 0, len(k.Missing))
		for _, m := range k.Missing {
			out = append(out, Problem{Field: field + fieldSuffix(m), Message: "missing required field"})
		}
		return out
	case *kind.AdditionalProperties:
		out := make([]Problem, 0, len(k.Properties))
		obj, _ := val.(map[string]any)
		for _, p := range k.Properties {
			out = append(out, Problem{Field: field + fieldSuffix(p), Message: "field not allowed by the schema, got " + renderValue(obj[p])})
		}
		return out
	case *kind.Type:
		want = strings.Join(k.Want, " or ")
	case *kind.Enum:
		want = "one of " + compactJSON(k.Want)
	case *kind.Const:
		want = compactJSON(k.Want)
	case *kind.Format:
		want = fmt.Sprintf("format %q (%v)", k.Want, k.Err)
	case *kind.UniqueItems:
		want = fmt.Sprintf("unique items ([%d] and [%d] are equal)", k.Duplicates[0], k.Duplicates[1])
	case *kind.FalseSchema:
		return []Problem{{Field: field, Message: "not allowed by the schema, got " + renderValue(val)}}
	default:
		var ok bool
		if want, ok = boundWant(e.ErrorKind); !ok {
			return []Problem{{Field: field, Message: e.ErrorKind.LocalizedString(printer) + " (value " + renderValue(val) + ")"}}
		}
	}
	return []Problem{{Field: field, Message: "expected " + want + ", got " + renderValue(val)}}
}

// bounds words the keywords whose error kinds carry the schema's bound in a
// Want field (an int, a *big.Rat or a pattern string).
var bounds = map[string]string{
	"minLength":        "at least %s characters",
	"maxLength":        "at most %s characters",
	"minItems":         "at least %s items",
	"maxItems":         "at most %s items",
	"minProperties":    "at least %s fields",
	"maxProperties":    "at most %s fields",
	"minimum":          ">= %s",
	"maximum":          "<= %s",
	"exclusiveMinimum": "> %s",
	"exclusiveMaximum": "< %s",
	"multipleOf":       "a multiple of %s",
	"pattern":          "a string matching %s",
}

// boundWant words a bound error ("at least 3 characters") from the kind's
// keyword and its Want field.
func boundWant(k jsonschema.ErrorKind) (string, bool) {
	format, ok := bounds[keyword(k)]
	if !ok {
		return "", false
	}
	rv := reflect.ValueOf(k)
	if rv.Kind() == reflect.Pointer {
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return "", false
	}
	w := rv.FieldByName("Want")
	if !w.IsValid() || !w.CanInterface() {
		return "", false
	}
	var text string
	switch v := w.Interface().(type) {
	case *big.Rat:
		text = ratString(v)
	case string:
		text = strconv.Quote(v)
	default:
		text = fmt.Sprint(v)
	}
	return fmt.Sprintf(format, text), true
}

// ratString renders a schema number: 1000, 0.5.
func ratString(r *big.Rat) string {
	if r == nil {
		return "?"
	}
	if r.IsInt() {
		return r.Num().String()
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// locate turns an instance location into a field path (args.to[1].name)
// and the value found there (nil when there is none).
func (f *schemaFilter) locate(tokens []string) (string, any) {
	var b strings.Builder
	b.WriteString("args")
	cur := f.inst
	for _, t := range tokens {
		switch c := cur.(type) {
		case []any:
			b.WriteString("[" + t + "]")
			cur = nil
			if i, err := strconv.Atoi(t); err == nil && i >= 0 && i < len(c) {
				cur = c[i]
			}
		case map[string]any:
			b.WriteString(fieldSuffix(t))
			cur = c[t]
		default:
			b.WriteString(fieldSuffix(t))
			cur = nil
		}
	}
	return b.String(), cur
}

// compactJSON renders v as compact JSON for messages.
func compactJSON(v any) string {
	s, err := jsonText(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return s
}

// oneLine folds the indented multi-line errors of the jsonschema library
// into one line.
func oneLine(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(strings.TrimSpace(l), "- ")
	}
	return strings.Join(lines, "; ")
}
