package runner

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// An output is decoded into the Value protojson would give, and bad JSON
// is refused.
func TestJSONValueIsProtojsons(t *testing.T) {
	for _, in := range []string{
		`{}`, `[]`, `null`, `true`, `1`, `-0.5`, `1e300`, `"x\u00e9\ud83d\ude00"`,
		`{"a":[1,"b",null,true,{"c":{}}],"d":12345678901234567890,"e":"\u0000"}`,
	} {
		got, err := jsonValue([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		want := &structpb.Value{}
		if err := protojson.Unmarshal([]byte(in), want); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("%s: got %v, protojson gives %v", in, got, want)
		}
	}
	for _, in := range []string{`{`, `1e400`, ``, `{"a":1}x`} {
		if _, err := jsonValue([]byte(in)); err == nil {
			t.Errorf("%q: decoded, want an error", in)
		}
	}
}
