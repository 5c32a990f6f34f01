package plan

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"google.golang.org/protobuf/types/known/structpb"
)

var structValueType = reflect.TypeFor[*structpb.Value]()

// toJSON converts a CEL value to a JSON-like Go value: nil, bool, int64,
// float64, string, []any or map[string]any. Ints stay int64; bytes become
// base64, timestamps RFC 3339 and durations "1.5s" strings, as in protojson.
func toJSON(v ref.Val) (any, error) {
	switch v := v.(type) {
	case types.Null:
		return nil, nil
	case types.Bool:
		return bool(v), nil
	case types.Int:
		return int64(v), nil
	case types.Uint:
		if v <= math.MaxInt64 {
			return int64(v), nil
		}
		return float64(v), nil
	case types.Double:
		f := float64(v)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%v is not a JSON number", f)
		}
		return f, nil
	case types.String:
		return string(v), nil
	case types.Bytes:
		return base64.StdEncoding.EncodeToString(v), nil
	case types.Timestamp, types.Duration:
		return toJSON(v.ConvertToType(types.StringType))
	case *types.Optional:
		if !v.HasValue() {
			return nil, nil
		}
		return toJSON(v.GetValue())
	case *types.Err:
		return nil, v
	case *types.Unknown:
		return nil, errors.New("value is unknown")
	case traits.Lister:
		n, ok := v.Size().(types.Int)
		if !ok {
			return nil, errors.New("list without size")
		}
		out := make([]any, 0, int(n))
		for i := types.Int(0); i < n; i++ {
			e, err := toJSON(v.Get(i))
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			out = append(out, e)
		}
		return out, nil
	case traits.Mapper:
		out := make(map[string]any)
		for it := v.Iterator(); it.HasNext() == types.True; {
			k := it.Next()
			ks, ok := k.(types.String)
			if !ok {
				if ks, ok = k.ConvertToType(types.StringType).(types.String); !ok {
					return nil, fmt.Errorf("map key %v cannot be a JSON object key", k)
				}
			}
			e, err := toJSON(v.Get(k))
			if err != nil {
				return nil, fmt.Errorf("[%q]: %w", string(ks), err)
			}
			out[string(ks)] = e
		}
		return out, nil
	}
	// Protobuf messages and other CEL objects: let CEL produce JSON.
	native, err := v.ConvertToNative(structValueType)
	if err != nil {
		return nil, fmt.Errorf("%s value has no JSON form: %w", v.Type().TypeName(), err)
	}
	pv, ok := native.(*structpb.Value)
	if !ok {
		return nil, fmt.Errorf("%s value has no JSON form", v.Type().TypeName())
	}
	return pv.AsInterface(), nil
}

// jsonText renders v for interpolation: strings as they are, everything else
// as compact JSON without HTML escaping.
func jsonText(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case nil:
		return "null", nil
	case bool:
		return strconv.FormatBool(v), nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return string(bytes.TrimSuffix(b.Bytes(), []byte("\n"))), nil
}

// valueToAny converts a Value to a JSON-like Go value like AsInterface, but
// treats nil values as null instead of panicking on them.
func valueToAny(v *structpb.Value) any {
	switch k := v.GetKind().(type) {
	case *structpb.Value_BoolValue:
		return k.BoolValue
	case *structpb.Value_NumberValue:
		return k.NumberValue
	case *structpb.Value_StringValue:
		return k.StringValue
	case *structpb.Value_StructValue:
		return structToAny(k.StructValue)
	case *structpb.Value_ListValue:
		vals := k.ListValue.GetValues()
		out := make([]any, len(vals))
		for i, e := range vals {
			out[i] = valueToAny(e)
		}
		return out
	}
	return nil
}

// structToAny converts a Struct to map[string]any; nil gives an empty map.
func structToAny(s *structpb.Struct) map[string]any {
	fields := s.GetFields()
	out := make(map[string]any, len(fields))
	for k, v := range fields {
		out[k] = valueToAny(v)
	}
	return out
}

// renderValue quotes a JSON-like value for a message, shortened to keep
// messages readable: string "x", number 3, object {"a":1}.
func renderValue(v any) string {
	const maxLen = 64
	text, err := json.Marshal(v)
	if err != nil {
		text = []byte(fmt.Sprint(v))
	}
	s := string(text)
	if len(s) > maxLen {
		s = s[:maxLen] + "…"
	}
	return jsonType(v) + " " + s
}

// jsonType names the JSON type of a JSON-like Go value.
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case float64, int64, int, json.Number:
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}
