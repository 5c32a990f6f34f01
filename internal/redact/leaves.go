package redact

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
)

// Leaves masks pattern matches in every leaf of a JSON-like value (what
// encoding/json decodes into an any: maps, lists, strings, float64 or
// json.Number numbers, booleans, nil) and returns the masked copy and
// whether anything changed; v itself is never modified, and unchanged
// parts of it are shared.
//
// Each leaf is read next to its key, as Canonical renders it, so that
// {"password": "hunter22"} is seen as "password: hunter22" and
// {"order": 4111111111111111} as an order number rather than a card. In
// a table — a map with "columns" (names, or objects with a "name") and
// "rows" (lists of cells), as sql.query returns — each cell is read next
// to its column's name. A
// match inside the value masks that part of it; a match that takes in the
// key masks the whole value. A number that matches (a card number stored
// as an integer) becomes the masked string. Map keys are masked like
// strings. A nil Redactor changes nothing.
func (r *Redactor) Leaves(v any) (any, bool) {
	if r == nil {
		return v, false
	}
	return r.leaves(v, "")
}

func (r *Redactor) leaves(v any, key string) (any, bool) {
	switch t := v.(type) {
	case string:
		return r.leaf(key, t)
	case float64:
		if red, ok := r.leaf(key, formatNumber(t)); ok {
			return red, true
		}
	case json.Number:
		if red, ok := r.leaf(key, t.String()); ok {
			return red, true
		}
	case map[string]any:
		var out map[string]any
		cols := columnNames(t)
		for k, x := range t {
			rk := r.String(k)
			var red any
			var changed bool
			if k == "rows" && cols != nil {
				red, changed = r.tableRows(x, cols)
			} else {
				red, changed = r.leaves(x, rk)
			}
			if !changed && rk == k {
				continue
			}
			if out == nil {
				out = make(map[string]any, len(t))
				for k2, x2 := range t {
					out[k2] = x2
				}
			}
			if rk != k {
				delete(out, k)
				rk = freeKey(rk, func(c string) bool { _, a := out[c]; _, b := t[c]; return a || b })
			}
			out[rk] = red
		}
		if out != nil {
			return out, true
		}
	case []any:
		var out []any
		for i, x := range t {
			red, changed := r.leaves(x, key)
			if !changed {
				continue
			}
			if out == nil {
				out = append([]any(nil), t...)
			}
			out[i] = red
		}
		if out != nil {
			return out, true
		}
	}
	return v, false
}

// columnNames returns the column names of a table-shaped map (see
// Leaves), or nil.
func columnNames(m map[string]any) []string {
	cols, ok := m["columns"].([]any)
	if _, rows := m["rows"].([]any); !ok || !rows {
		return nil
	}
	names := make([]string, len(cols))
	for i, c := range cols {
		switch c := c.(type) {
		case string:
			names[i] = c
		case map[string]any:
			names[i], _ = c["name"].(string)
		}
	}
	return names
}

// tableRows masks a table's rows, each cell next to its column's name.
func (r *Redactor) tableRows(v any, cols []string) (any, bool) {
	rows, ok := v.([]any)
	if !ok {
		return r.leaves(v, "rows")
	}
	var out []any
	for i, row := range rows {
		cells, ok := row.([]any)
		var red any
		var changed bool
		if !ok {
			red, changed = r.leaves(row, "rows")
		} else {
			var masked []any
			for j, c := range cells {
				key := "rows"
				if j < len(cols) && cols[j] != "" {
					key = r.String(cols[j])
				}
				rc, ch := r.leaves(c, key)
				if !ch {
					continue
				}
				if masked == nil {
					masked = append([]any(nil), cells...)
				}
				masked[j] = rc
			}
			red, changed = masked, masked != nil
		}
		if !changed {
			continue
		}
		if out == nil {
			out = append([]any(nil), rows...)
		}
		out[i] = red
	}
	if out == nil {
		return v, false
	}
	return out, true
}

// freeKey returns k, or k with a "#n" suffix when k is taken (two keys
// masked to the same text).
func freeKey(k string, taken func(string) bool) string {
	if !taken(k) {
		return k
	}
	for n := 2; ; n++ {
		if c := k + "#" + strconv.Itoa(n); !taken(c) {
			return c
		}
	}
}

// leaf masks s, alone and then read as "key: s", and reports whether it
// changed. Both readings are needed: a value may hold a whole credential
// ("password: hunter22"), which its key in front would hide from the
// pattern, or only the secret of one ("hunter22" under "password").
// Patterns that read the words before a match (card numbers) apply only
// to the keyed reading, so that {"order": 4111111111111111} stays.
func (r *Redactor) leaf(key, s string) (string, bool) {
	if s == "" {
		return s, false
	}
	if key == "" {
		red := r.String(s)
		return red, red != s
	}
	red := s
	if r.alone != nil {
		red = r.alone.String(s)
	} else {
		red = r.String(s)
	}
	prefix := key + ": "
	text := prefix + red
	kr := r.keyed
	if kr == nil {
		kr = r
	}
	keyed := kr.String(text)
	switch {
	case keyed == text:
		return red, red != s
	case strings.HasPrefix(keyed, prefix):
		return keyed[len(prefix):], true
	default:
		return Mask, true
	}
}

// formatNumber renders a number as Canonical does: integral values without
// an exponent, so that a card number stored as a number is seen.
func formatNumber(f float64) string {
	if !math.IsNaN(f) && !math.IsInf(f, 0) && f == math.Trunc(f) && math.Abs(f) < 1e21 {
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// LeavesValue is Leaves for a protobuf Value: v itself when nothing
// changed (v is never modified), a new Value sharing v's unchanged parts
// otherwise.
func (r *Redactor) LeavesValue(v *structpb.Value) (*structpb.Value, bool) {
	if r == nil || v == nil {
		return v, false
	}
	return r.leavesValue(v, "")
}

// LeavesStruct is LeavesValue for a Struct.
func (r *Redactor) LeavesStruct(s *structpb.Struct) (*structpb.Struct, bool) {
	if r == nil || s == nil {
		return s, false
	}
	return r.leavesStruct(s)
}

func (r *Redactor) leavesValue(v *structpb.Value, key string) (*structpb.Value, bool) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		if red, ok := r.leaf(key, k.StringValue); ok {
			return structpb.NewStringValue(red), true
		}
	case *structpb.Value_NumberValue:
		if red, ok := r.leaf(key, formatNumber(k.NumberValue)); ok {
			return structpb.NewStringValue(red), true
		}
	case *structpb.Value_StructValue:
		if s, ok := r.leavesStruct(k.StructValue); ok {
			return structpb.NewStructValue(s), true
		}
	case *structpb.Value_ListValue:
		var out []*structpb.Value
		for i, x := range k.ListValue.GetValues() {
			red, changed := r.leavesValue(x, key)
			if !changed {
				continue
			}
			if out == nil {
				out = append([]*structpb.Value(nil), k.ListValue.GetValues()...)
			}
			out[i] = red
		}
		if out != nil {
			return structpb.NewListValue(&structpb.ListValue{Values: out}), true
		}
	}
	return v, false
}

func (r *Redactor) leavesStruct(s *structpb.Struct) (*structpb.Struct, bool) {
	var out map[string]*structpb.Value
	fields := s.GetFields()
	cols := columnNamesPB(fields)
	for k, x := range fields {
		rk := r.String(k)
		var red *structpb.Value
		var changed bool
		if k == "rows" && cols != nil {
			red, changed = r.tableRowsPB(x, cols)
		} else {
			red, changed = r.leavesValue(x, rk)
		}
		if !changed && rk == k {
			continue
		}
		if out == nil {
			out = make(map[string]*structpb.Value, len(fields))
			for k2, x2 := range fields {
				out[k2] = x2
			}
		}
		if rk != k {
			delete(out, k)
			rk = freeKey(rk, func(c string) bool { _, a := out[c]; _, b := fields[c]; return a || b })
		}
		out[rk] = red
	}
	if out == nil {
		return s, false
	}
	return &structpb.Struct{Fields: out}, true
}

// columnNamesPB is columnNames for a Struct's fields.
func columnNamesPB(fields map[string]*structpb.Value) []string {
	cols := fields["columns"].GetListValue()
	if cols == nil || fields["rows"].GetListValue() == nil {
		return nil
	}
	names := make([]string, len(cols.GetValues()))
	for i, c := range cols.GetValues() {
		if n, ok := c.GetKind().(*structpb.Value_StringValue); ok {
			names[i] = n.StringValue
		} else {
			names[i] = c.GetStructValue().GetFields()["name"].GetStringValue()
		}
	}
	return names
}

// tableRowsPB is tableRows for a protobuf Value.
func (r *Redactor) tableRowsPB(v *structpb.Value, cols []string) (*structpb.Value, bool) {
	var out []*structpb.Value
	rows := v.GetListValue().GetValues()
	for i, row := range rows {
		var red *structpb.Value
		var changed bool
		if cells := row.GetListValue(); cells == nil {
			red, changed = r.leavesValue(row, "rows")
		} else {
			var masked []*structpb.Value
			for j, c := range cells.GetValues() {
				key := "rows"
				if j < len(cols) && cols[j] != "" {
					key = r.String(cols[j])
				}
				rc, ch := r.leavesValue(c, key)
				if !ch {
					continue
				}
				if masked == nil {
					masked = append([]*structpb.Value(nil), cells.GetValues()...)
				}
				masked[j] = rc
			}
			if masked != nil {
				red, changed = structpb.NewListValue(&structpb.ListValue{Values: masked}), true
			}
		}
		if !changed {
			continue
		}
		if out == nil {
			out = append([]*structpb.Value(nil), rows...)
		}
		out[i] = red
	}
	if out == nil {
		return v, false
	}
	return structpb.NewListValue(&structpb.ListValue{Values: out}), true
}
