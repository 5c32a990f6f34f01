package bus

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Reply subjects of both forms parse as nats.go parses them; anything else
// is not a JetStream message.
func TestPulledMetadata(t *testing.T) {
	for _, tc := range []struct {
		reply string
		want  jetstream.MsgMetadata
	}{
		{"$JS.ACK.S.C.3.10.7.1700000000000000000.5", jetstream.MsgMetadata{Stream: "S", Consumer: "C", NumDelivered: 3, NumPending: 5,
			Sequence: jetstream.SequencePair{Stream: 10, Consumer: 7}, Timestamp: time.Unix(0, 1700000000000000000)}},
		{"$JS.ACK._.HASH.S.C.1.2.3.1700000000000000000.0.tok", jetstream.MsgMetadata{Stream: "S", Consumer: "C", NumDelivered: 1,
			Sequence: jetstream.SequencePair{Stream: 2, Consumer: 3}, Timestamp: time.Unix(0, 1700000000000000000)}},
		{"$JS.ACK.hub.HASH.S.C.1.2.3.1700000000000000000.0", jetstream.MsgMetadata{Domain: "hub", Stream: "S", Consumer: "C", NumDelivered: 1,
			Sequence: jetstream.SequencePair{Stream: 2, Consumer: 3}, Timestamp: time.Unix(0, 1700000000000000000)}},
	} {
		md, err := (&pulled{msg: &nats.Msg{Reply: tc.reply}}).Metadata()
		if err != nil {
			t.Fatalf("%s: %v", tc.reply, err)
		}
		if *md != tc.want {
			t.Fatalf("%s: %+v, want %+v", tc.reply, *md, tc.want)
		}
	}
	for _, reply := range []string{"", "_INBOX.x", "$JS.ACK.S.C.1.2.3", "$JS.ACK.a.b.S.C.1.2.3.4", "$JS.API.S.C.3.10.7.1.5"} {
		if _, err := (&pulled{msg: &nats.Msg{Reply: reply}}).Metadata(); !errors.Is(err, jetstream.ErrNotJSMessage) {
			t.Fatalf("%q: %v, want ErrNotJSMessage", reply, err)
		}
	}
}
