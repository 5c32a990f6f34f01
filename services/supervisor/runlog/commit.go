package runlog

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	planexv1 "github.com/planex-dev/planex/gen/planex/v1"
	"github.com/planex-dev/planex/internal/redact"
)

// Event hashes, version 2: per-field commitments.
//
// A version 1 hash (events appended before version 2) is SHA-256 over
// prev_hash and the deterministic encoding of the whole event, so an
// export that masks one field cannot be checked at all: the hash needs
// every byte. A version 2 event carries a random 32-byte salt, stored with
// the event (protobuf field saltField, unknown to the generated code, never
// in protojson) and its hash is the root of a tree over the event's fields:
//
//   - every node — the event, a message, a list, a map, an element, a
//     scalar — has a salt: the event's salt at the root, and
//     HMAC-SHA256(parent salt, tag || segment) for a child (tag 'f' and the
//     field number, 'i' and the list index, 'k' and the map key, 'u' for
//     unknown fields);
//   - a scalar's digest is SHA-256 of a domain tag, its salt, its kind and
//     its value; a message's, list's or map's is SHA-256 of a domain tag
//     and its children's digests in canonical order (field number, index,
//     sorted key), so it needs no salt of its own;
//   - the event's hash is SHA-256("planex/runlog/v2\x00" || root digest),
//     the field hash left out.
//
// An export then shows what it may and proves the rest (see [Commitment]):
// for a subtree it shows unchanged it discloses that subtree's salt, from
// which the verifier recomputes every digest below it; for a masked
// subtree it gives the digest alone. Salts flow down only (HMAC is one
// way), so a disclosed salt reveals nothing about the masked siblings, and
// a masked value's digest is keyed by a salt the export never holds: it
// cannot be tested against guesses, however few values it may take. (The
// version 1 hash of a redacted event can be; a verifier reports such an
// event unchecked.)

// saltField is the protobuf field number of a version 2 event's salt,
// stored in RunEvent's unknown fields (planex.v1.RunEvent declares no such
// field; it should reserve this number).
const saltField protowire.Number = 4096

// saltLen is the length of an event's salt.
const saltLen = 32

// hashField is RunEvent.hash, which the hash does not cover.
const hashField protowire.Number = 5

// unknownSegment names a message's unknown fields in a commitment path.
const unknownSegment = "?unknown"

var (
	tagEvent   = []byte("planex/runlog/v2\x00")
	tagLeaf    = []byte("planex/runlog/v2/leaf\x00")
	tagMessage = []byte("planex/runlog/v2/message\x00")
	tagList    = []byte("planex/runlog/v2/list\x00")
	tagMap     = []byte("planex/runlog/v2/map\x00")
)

// newSalt returns a fresh random salt.
func newSalt() ([]byte, error) {
	s := make([]byte, saltLen)
	if _, err := rand.Read(s); err != nil {
		return nil, fmt.Errorf("event salt: %w", err)
	}
	return s, nil
}

// eventSalt returns the salt of a version 2 event, or nil for a version 1
// event.
func eventSalt(ev *planexv1.RunEvent) []byte {
	raw := ev.ProtoReflect().GetUnknown()
	for len(raw) > 0 {
		num, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return nil
		}
		m := protowire.ConsumeFieldValue(num, typ, raw[n:])
		if m < 0 {
			return nil
		}
		if num == saltField && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(raw[n:])
			return v
		}
		raw = raw[n+m:]
	}
	return nil
}

// withoutSaltField returns raw unknown fields without the salt field.
func withoutSaltField(raw []byte) []byte { return appendWithoutSalt(nil, raw) }

// setSalt stores salt in ev (replacing any), making it a version 2 event.
func setSalt(ev *planexv1.RunEvent, salt []byte) {
	m := ev.ProtoReflect()
	raw := withoutSaltField(m.GetUnknown())
	raw = protowire.AppendTag(raw, saltField, protowire.BytesType)
	raw = protowire.AppendBytes(raw, salt)
	m.SetUnknown(raw)
}

// stripSalt removes ev's salt, in place: a masked copy must not carry it,
// or its hash could be tested against guesses of the masked values.
func stripSalt(ev *planexv1.RunEvent) {
	m := ev.ProtoReflect()
	if raw := m.GetUnknown(); len(raw) > 0 {
		m.SetUnknown(withoutSaltField(raw))
	}
}

// hashV2 computes the version 2 hash of ev, whose salt is salt.
func hashV2(ev *planexv1.RunEvent, salt []byte) ([]byte, error) {
	root := hashMessage(ev.ProtoReflect(), salt, true)
	return eventHash(root[:]), nil
}

func eventHash(root []byte) []byte {
	var stack [64]byte
	d := sha256.Sum256(append(append(stack[:0], tagEvent...), root...))
	return d[:]
}

// Commitment is what an export gives for an event it redacted, so that
// the event's version 2 hash can be recomputed from the export alone: the
// salts of the subtrees it shows unchanged, and the digests of the
// subtrees it masked. Paths are proto field names, list indexes and map
// keys from the event down ([] is the whole event; "?unknown" names a
// message's unknown fields).
type Commitment struct {
	// Version is the event hash version (2).
	Version int `json:"version"`
	// Revealed are the salts of the subtrees shown as appended.
	Revealed []RevealedSalt `json:"revealed,omitempty"`
	// Masked are the digests of the subtrees the export changed.
	Masked []MaskedDigest `json:"masked,omitempty"`
}

// RevealedSalt is the salt of a subtree an export shows unchanged.
type RevealedSalt struct {
	// Path is where the subtree is.
	Path []string `json:"path"`
	// Salt is its salt.
	Salt []byte `json:"salt"`
}

// MaskedDigest is the digest of a subtree an export masked.
type MaskedDigest struct {
	// Path is where the subtree is.
	Path []string `json:"path"`
	// Digest is its digest.
	Digest []byte `json:"digest"`
}

// fullCommitment is the commitment of an event shown whole: its salt.
func fullCommitment(salt []byte) *Commitment {
	return &Commitment{Version: 2, Revealed: []RevealedSalt{{Path: []string{}, Salt: salt}}}
}

// rootSalt returns the salt a commitment reveals for the whole event.
func (c *Commitment) rootSalt() []byte {
	if c == nil || len(c.Masked) > 0 || len(c.Revealed) != 1 || len(c.Revealed[0].Path) != 0 {
		return nil
	}
	return c.Revealed[0].Salt
}

// shownForm returns ev as a reader of an export sees it: through protojson
// (which drops unknown fields, the salt among them).
func shownForm(ev *planexv1.RunEvent) (*planexv1.RunEvent, error) {
	b, err := protojson.Marshal(ev)
	if err != nil {
		return nil, err
	}
	out := &planexv1.RunEvent{}
	if err := protojson.Unmarshal(b, out); err != nil {
		return nil, err
	}
	return out, nil
}

// commit builds the commitment of orig (a version 2 event with salt
// salt) as an export shows it (shown, masked): subtrees equal in both are
// revealed, subtrees whose shape differs (or scalars that differ) masked.
func commit(orig *planexv1.RunEvent, salt []byte, shown *planexv1.RunEvent) (*Commitment, error) {
	c := &Commitment{Version: 2}
	d := differ{c: c}
	if err := d.message(orig.ProtoReflect(), shown.ProtoReflect(), nil, salt, true); err != nil {
		return nil, fmt.Errorf("commit event %d: %w", orig.GetSequence(), err)
	}
	return c, nil
}

// differ walks an event and its shown form together, filling c.
type differ struct {
	c *Commitment
	w walker
}

func (d *differ) reveal(path []string, salt []byte) {
	d.c.Revealed = append(d.c.Revealed, RevealedSalt{Path: slices.Clone(path), Salt: salt})
}

func (d *differ) mask(path []string, digest []byte) {
	d.c.Masked = append(d.c.Masked, MaskedDigest{Path: slices.Clone(path), Digest: digest})
}

// populated lists the fields of m the hash covers, by number.
func populated(m protoreflect.Message, root bool) []protoreflect.FieldDescriptor {
	var fds []protoreflect.FieldDescriptor
	m.Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if !root || fd.Number() != hashField {
			fds = append(fds, fd)
		}
		return true
	})
	slices.SortFunc(fds, func(a, b protoreflect.FieldDescriptor) int { return int(a.Number()) - int(b.Number()) })
	return fds
}

func unknownOf(m protoreflect.Message, root bool) []byte {
	raw := m.GetUnknown()
	if root {
		raw = withoutSaltField(raw)
	}
	return raw
}

func (d *differ) message(o, s protoreflect.Message, path []string, salt []byte, root bool) error {
	of, sf := populated(o, root), populated(s, root)
	ou, su := unknownOf(o, root), unknownOf(s, root)
	sameFields := slices.EqualFunc(of, sf, func(a, b protoreflect.FieldDescriptor) bool { return a.Number() == b.Number() })
	if !sameFields || o.Descriptor().FullName() != s.Descriptor().FullName() {
		if root {
			return errors.New("the shown event does not have the fields of the event")
		}
		digest, err := d.w.message(o, path, salt, false)
		if err != nil {
			return err
		}
		d.mask(path, digest)
		return nil
	}
	equal := bytes.Equal(ou, su)
	for _, fd := range of {
		if !o.Get(fd).Equal(s.Get(fd)) {
			equal = false
			break
		}
	}
	if equal {
		d.reveal(path, salt)
		return nil
	}
	for _, fd := range of {
		if err := d.field(fd, o.Get(fd), s.Get(fd), append(path, string(fd.Name())), derive(salt, 'f', uint64(fd.Number()))); err != nil {
			return err
		}
	}
	if len(ou) > 0 {
		p := append(path, unknownSegment)
		d.mask(p, leafDigest(derive(salt, 'u', 0), protoreflect.BytesKind, protoreflect.ValueOfBytes(ou)))
	}
	return nil
}

func (d *differ) field(fd protoreflect.FieldDescriptor, o, s protoreflect.Value, path []string, salt []byte) error {
	if o.Equal(s) {
		d.reveal(path, salt)
		return nil
	}
	switch {
	case fd.IsList():
		ol, sl := o.List(), s.List()
		if ol.Len() != sl.Len() {
			break
		}
		for i := range ol.Len() {
			if err := d.elem(fd, ol.Get(i), sl.Get(i), append(path, strconv.Itoa(i)), derive(salt, 'i', uint64(i))); err != nil {
				return err
			}
		}
		return nil
	case fd.IsMap():
		om, sm := o.Map(), s.Map()
		if om.Len() != sm.Len() {
			break
		}
		same := true
		om.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
			same = sm.Has(k)
			return same
		})
		if !same {
			break
		}
		var err error
		om.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			err = d.elem(fd.MapValue(), v, sm.Get(k), append(path, k.String()), deriveKey(salt, k.String()))
			return err == nil
		})
		return err
	default:
		return d.elem(fd, o, s, path, salt)
	}
	digest, err := d.w.field(fd, o, path, salt)
	if err != nil {
		return err
	}
	d.mask(path, digest)
	return nil
}

func (d *differ) elem(fd protoreflect.FieldDescriptor, o, s protoreflect.Value, path []string, salt []byte) error {
	if o.Equal(s) {
		d.reveal(path, salt)
		return nil
	}
	if isMessage(fd) {
		return d.message(o.Message(), s.Message(), path, salt, false)
	}
	d.mask(path, leafDigest(salt, fd.Kind(), o))
	return nil
}

func isMessage(fd protoreflect.FieldDescriptor) bool {
	return fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind
}

// derive returns a child's salt (nil when the parent's is unknown).
func derive(salt []byte, tag byte, n uint64) []byte { k := newKDF(salt); return k.child(tag, n) }

// deriveKey returns a map value's salt.
func deriveKey(salt []byte, key string) []byte { k := newKDF(salt); return k.key(key) }

// kdf derives the salts of one node's children: HMAC-SHA256 keyed by the
// node's salt (RFC 2104), computed over stack buffers with sha256.Sum256
// (crypto/hmac allocated two digests and their pads per node: a third of
// what an append spent hashing). The zero kdf (a node whose salt is
// unknown) derives nil salts.
type kdf struct {
	ok         bool
	ipad, opad [sha256.BlockSize]byte
	// prepared: the hasher's states stack holds, from index states, the
	// SHA-256 states after the ipad and the opad blocks (hasher.prepare).
	prepared bool
	states   int
}

// sha256StateSize is the size of crypto/sha256's saved state
// (AppendBinary): a 4-byte magic, 8 words, a block and a length.
const sha256StateSize = 4 + 8*4 + sha256.BlockSize + 8

func newKDF(salt []byte) (k kdf) {
	if salt == nil {
		return k
	}
	key := salt
	if len(key) > sha256.BlockSize {
		d := sha256.Sum256(key)
		key = d[:]
	}
	k.ok = true
	copy(k.ipad[:], key)
	copy(k.opad[:], key)
	for i := range k.ipad {
		k.ipad[i] ^= 0x36
		k.opad[i] ^= 0x5c
	}
	return k
}

// mac returns HMAC(salt, msg).
func (k *kdf) mac(msg []byte) digest {
	var inner [sha256.BlockSize + 64]byte
	in := sha256.Sum256(append(append(inner[:0], k.ipad[:]...), msg...))
	var outer [sha256.BlockSize + sha256.Size]byte
	return sha256.Sum256(append(append(outer[:0], k.opad[:]...), in[:]...))
}

// child returns the salt of the child tag n (a field number, an index),
// or nil when the node's salt is unknown.
func (k *kdf) child(tag byte, n uint64) []byte {
	if !k.ok {
		return nil
	}
	d := k.childDigest(tag, n)
	return d[:]
}

// childDigest is child for a node whose salt is known.
func (k *kdf) childDigest(tag byte, n uint64) digest {
	var b [11]byte
	return k.mac(protowire.AppendVarint(append(b[:0], tag), n))
}

// key returns the salt of a map value, or nil when the map's salt is
// unknown.
func (k *kdf) key(key string) []byte {
	if !k.ok {
		return nil
	}
	d := k.keyDigest(key)
	return d[:]
}

// keyDigest is key for a map whose salt is known.
func (k *kdf) keyDigest(key string) digest {
	var b [64]byte
	return k.mac(append(append(b[:0], 'k'), key...))
}

// leafDigest is a scalar's digest.
func leafDigest(salt []byte, kind protoreflect.Kind, v protoreflect.Value) []byte {
	var stack [128]byte
	d := sha256.Sum256(appendLeaf(stack[:0], salt, kind, v))
	return d[:]
}

// appendLeaf appends what a scalar's digest hashes: the leaf tag, its
// salt, its kind and its value.
func appendLeaf(b, salt []byte, kind protoreflect.Kind, v protoreflect.Value) []byte {
	b = append(append(append(b, tagLeaf...), salt...), byte(kind))
	switch kind {
	case protoreflect.BoolKind:
		if v.Bool() {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
	case protoreflect.EnumKind:
		b = binary.BigEndian.AppendUint64(b, uint64(v.Enum()))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		b = binary.BigEndian.AppendUint64(b, uint64(v.Int()))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		b = binary.BigEndian.AppendUint64(b, v.Uint())
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		f := v.Float()
		bits := math.Float64bits(f)
		if math.IsNaN(f) {
			bits = 0x7ff8000000000001 // one NaN: protojson keeps none of their payloads
		}
		b = binary.BigEndian.AppendUint64(b, bits)
	case protoreflect.StringKind:
		b = append(b, v.String()...)
	case protoreflect.BytesKind:
		b = append(b, v.Bytes()...)
	}
	return b
}

// walker computes digests. With a salt it computes a subtree's digest
// from its content; without (in a commitment's check) it takes a node's
// digest or salt from the commitment, by path.
type walker struct {
	revealed map[string][]byte
	masked   map[string][]byte
	used     map[string]bool
	// maskedPaths collects the masked paths met, for the report.
	maskedPaths []string
}

// uncommittedError is a node of a shown event the commitment neither
// reveals nor masks.
type uncommittedError struct{ path []string }

func (e *uncommittedError) Error() string {
	return "no commitment covers " + PathString(e.path)
}

// PathString writes a commitment path for people, as a JSON pointer
// (RFC 6901) into the event's proto fields: "/plan_revised/plan/steps/0/args/fields/sql".
func PathString(path []string) string {
	if len(path) == 0 {
		return "the event"
	}
	var b strings.Builder
	for _, p := range path {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(p))
	}
	return b.String()
}

// sub is path's child seg, when the walk needs paths (a commitment's
// check); hashing a whole event builds none.
func (w *walker) sub(path []string, seg string) []string {
	if w.revealed == nil && w.masked == nil {
		return nil
	}
	return append(path[:len(path):len(path)], seg)
}

func pathKey(path []string) string { return strings.Join(path, "\x00") + "\x01" }

func (w *walker) lookup(path []string, salt []byte) (digest, newSalt []byte, err error) {
	if salt != nil || (w.revealed == nil && w.masked == nil) {
		return nil, salt, nil
	}
	k := pathKey(path)
	d, isMasked := w.masked[k]
	s, isRevealed := w.revealed[k]
	switch {
	case isMasked && isRevealed:
		return nil, nil, fmt.Errorf("%s is both revealed and masked", PathString(path))
	case isMasked:
		w.used[k] = true
		w.maskedPaths = append(w.maskedPaths, PathString(path))
		return d, nil, nil
	case isRevealed:
		w.used[k] = true
		return nil, s, nil
	}
	return nil, nil, nil
}

func (w *walker) message(m protoreflect.Message, path []string, salt []byte, root bool) ([]byte, error) {
	d, salt, err := w.lookup(path, salt)
	if d != nil || err != nil {
		return d, err
	}
	if salt != nil {
		sum := hashMessage(m, salt, root)
		return sum[:], nil
	}
	var stack [512]byte
	b := append(stack[:0], tagMessage...)
	k := newKDF(salt)
	for _, fd := range populated(m, root) {
		d, err := w.field(fd, m.Get(fd), w.sub(path, string(fd.Name())), k.child('f', uint64(fd.Number())))
		if err != nil {
			return nil, err
		}
		b = append(protowire.AppendVarint(b, uint64(fd.Number())), d...)
	}
	unknown := unknownOf(m, root)
	var ud []byte
	if salt != nil {
		if len(unknown) > 0 {
			ud = leafDigest(k.child('u', 0), protoreflect.BytesKind, protoreflect.ValueOfBytes(unknown))
		}
	} else {
		p := append(path, unknownSegment)
		if ud, _, err = w.lookup(p, nil); err != nil {
			return nil, err
		}
		if ud == nil && len(unknown) > 0 {
			return nil, &uncommittedError{path: p}
		}
	}
	if ud != nil {
		b = append(protowire.AppendVarint(b, 0), ud...) // after the fields: no field has number 0
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

func (w *walker) field(fd protoreflect.FieldDescriptor, v protoreflect.Value, path []string, salt []byte) ([]byte, error) {
	if (fd.IsList() || fd.IsMap()) && salt != nil {
		sum := hashCollection(fd, v, salt)
		return sum[:], nil
	}
	switch {
	case fd.IsList():
		d, salt, err := w.lookup(path, salt)
		if d != nil || err != nil {
			return d, err
		}
		l := v.List()
		var stack [512]byte
		b := protowire.AppendVarint(append(stack[:0], tagList...), uint64(l.Len()))
		k := newKDF(salt)
		for i := range l.Len() {
			d, err := w.elem(fd, l.Get(i), w.sub(path, strconv.Itoa(i)), k.child('i', uint64(i)))
			if err != nil {
				return nil, err
			}
			b = append(b, d...)
		}
		sum := sha256.Sum256(b)
		return sum[:], nil
	case fd.IsMap():
		d, salt, err := w.lookup(path, salt)
		if d != nil || err != nil {
			return d, err
		}
		mp := v.Map()
		type entry struct {
			k string
			v protoreflect.Value
		}
		entries := make([]entry, 0, mp.Len())
		mp.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			entries = append(entries, entry{k.String(), v})
			return true
		})
		slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.k, b.k) })
		var stack [512]byte
		b := append(stack[:0], tagMap...)
		k := newKDF(salt)
		for _, e := range entries {
			d, err := w.elem(fd.MapValue(), e.v, w.sub(path, e.k), k.key(e.k))
			if err != nil {
				return nil, err
			}
			b = append(append(protowire.AppendVarint(b, uint64(len(e.k))), e.k...), d...)
		}
		sum := sha256.Sum256(b)
		return sum[:], nil
	}
	return w.elem(fd, v, path, salt)
}

func (w *walker) elem(fd protoreflect.FieldDescriptor, v protoreflect.Value, path []string, salt []byte) ([]byte, error) {
	if isMessage(fd) {
		return w.message(v.Message(), path, salt, false)
	}
	d, salt, err := w.lookup(path, salt)
	if d != nil || err != nil {
		return d, err
	}
	if salt == nil {
		return nil, &uncommittedError{path: path}
	}
	return leafDigest(salt, fd.Kind(), v), nil
}

// maskable reports whether an export may mask the node at path of shown:
// a string (credentials are redacted by pattern anywhere), a structured
// value (google.protobuf.Struct, Value or ListValue: arguments, inputs,
// outputs, results) or anything inside one, or a message's unknown
// fields. A commitment masking anything else (the event, a sequence, a
// plan step's tool) is refused, so that a tampered export cannot pass off
// a changed field as a masked one.
func maskable(shown protoreflect.Message, path []string) bool {
	if len(path) == 0 {
		return false
	}
	if path[len(path)-1] == unknownSegment {
		return true
	}
	n, ok := resolve(shown, path)
	if !ok {
		return false
	}
	if n.structured {
		return true
	}
	if n.whole { // a list or map field of a planex message
		return false
	}
	if isMessage(n.fd) {
		return isStructured(n.fd.Message().FullName())
	}
	return n.fd.Kind() == protoreflect.StringKind
}

// node is what a path leads to in a message.
type node struct {
	// fd is the field the node belongs to (its element's, for an element).
	fd protoreflect.FieldDescriptor
	// v is the node's value.
	v protoreflect.Value
	// whole reports a list or map field as a whole (not one element).
	whole bool
	// structured reports a node inside a structured value.
	structured bool
}

// resolve follows path (field names, list indexes, map keys) from m.
func resolve(m protoreflect.Message, path []string) (node, bool) {
	var n node
	msg := m
	for i := 0; i < len(path); i++ {
		if isStructured(msg.Descriptor().FullName()) {
			n.structured = true
		}
		fd := msg.Descriptor().Fields().ByName(protoreflect.Name(path[i]))
		if fd == nil || !msg.Has(fd) {
			return node{}, false
		}
		n.fd, n.v, n.whole = fd, msg.Get(fd), fd.IsList() || fd.IsMap()
		if n.whole && i+1 < len(path) {
			i++
			if fd.IsList() {
				idx, err := strconv.Atoi(path[i])
				if err != nil || idx < 0 || idx >= n.v.List().Len() {
					return node{}, false
				}
				n.v = n.v.List().Get(idx)
			} else {
				if fd.MapKey().Kind() != protoreflect.StringKind {
					return node{}, false
				}
				key := protoreflect.ValueOfString(path[i]).MapKey()
				if !n.v.Map().Has(key) {
					return node{}, false
				}
				n.v, n.fd = n.v.Map().Get(key), fd.MapValue()
			}
			n.whole = false
		}
		if i+1 < len(path) {
			if n.whole || !isMessage(n.fd) {
				return node{}, false
			}
			msg = n.v.Message()
		}
	}
	return n, true
}

func isStructured(name protoreflect.FullName) bool {
	switch name {
	case "google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue":
		return true
	}
	return false
}

// marks are the texts an export puts where it masked something.
var marks = []string{redact.Mask, "[CARD]", "[EMAIL]"}

// showsMark reports whether the node at path of shown (a string, or a
// structured value with its keys) holds a redaction mark: where an export
// masked a value, it says so.
func showsMark(v any) bool {
	switch x := v.(type) {
	case string:
		for _, m := range marks {
			if strings.Contains(x, m) {
				return true
			}
		}
	case map[string]any:
		for k, e := range x {
			if showsMark(k) || showsMark(e) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if showsMark(e) {
				return true
			}
		}
	}
	return false
}

// errNotMaskable wraps what a commitment may not mask.
var errNotMaskable = errors.New("an export never masks it")

// check recomputes the hash of shown (an exported event) from c. It
// returns the hash and the masked paths, or an error naming what does not
// add up (a node neither revealed nor masked, a disclosure left over, a
// masked node an export never masks or that shows no redaction mark).
func (c *Commitment) check(shown *planexv1.RunEvent) ([]byte, []string, error) {
	if c.Version != 2 {
		return nil, nil, fmt.Errorf("commitment version %d is not one this planex reads (2)", c.Version)
	}
	w := walker{revealed: map[string][]byte{}, masked: map[string][]byte{}, used: map[string]bool{}}
	sm := shown.ProtoReflect()
	for _, r := range c.Revealed {
		if len(r.Salt) != saltLen {
			return nil, nil, fmt.Errorf("the salt revealed for %s is not %d bytes", PathString(r.Path), saltLen)
		}
		k := pathKey(r.Path)
		if _, dup := w.revealed[k]; dup {
			return nil, nil, fmt.Errorf("%s is revealed twice", PathString(r.Path))
		}
		w.revealed[k] = r.Salt
	}
	for _, m := range c.Masked {
		if len(m.Digest) != sha256.Size {
			return nil, nil, fmt.Errorf("the digest of masked %s is not %d bytes", PathString(m.Path), sha256.Size)
		}
		if !maskable(sm, m.Path) {
			return nil, nil, fmt.Errorf("the commitment masks %s: %w", PathString(m.Path), errNotMaskable)
		}
		if m.Path[len(m.Path)-1] != unknownSegment && !showsMark(shownAt(sm, m.Path)) {
			return nil, nil, fmt.Errorf("masked %s shows no redaction mark (%s)", PathString(m.Path), redact.Mask)
		}
		k := pathKey(m.Path)
		if _, dup := w.masked[k]; dup {
			return nil, nil, fmt.Errorf("%s is masked twice", PathString(m.Path))
		}
		w.masked[k] = m.Digest
	}
	root, err := w.message(sm, nil, nil, true)
	if err != nil {
		return nil, nil, err
	}
	for _, r := range c.Revealed {
		if !w.used[pathKey(r.Path)] {
			return nil, nil, fmt.Errorf("the salt revealed for %s covers nothing the event shows", PathString(r.Path))
		}
	}
	for _, m := range c.Masked {
		if !w.used[pathKey(m.Path)] {
			return nil, nil, fmt.Errorf("masked %s is not a node the event shows", PathString(m.Path))
		}
	}
	return eventHash(root), w.maskedPaths, nil
}

// shownAt returns the node at path of m as JSON-like values (strings,
// maps, lists; other scalars as nil), or nil.
func shownAt(m protoreflect.Message, path []string) any {
	n, ok := resolve(m, path)
	if !ok {
		return nil
	}
	return jsonOf(n.fd, n.v, n.whole)
}

// jsonOf returns v as JSON-like values: strings, maps and lists.
func jsonOf(fd protoreflect.FieldDescriptor, v protoreflect.Value, whole bool) any {
	switch {
	case whole && fd.IsList():
		var out []any
		for i := range v.List().Len() {
			out = append(out, jsonOf(fd, v.List().Get(i), false))
		}
		return out
	case whole && fd.IsMap():
		out := map[string]any{}
		v.Map().Range(func(k protoreflect.MapKey, x protoreflect.Value) bool {
			out[k.String()] = jsonOf(fd.MapValue(), x, false)
			return true
		})
		return out
	case isMessage(fd):
		out := map[string]any{}
		v.Message().Range(func(f protoreflect.FieldDescriptor, x protoreflect.Value) bool {
			out[string(f.Name())] = jsonOf(f, x, true)
			return true
		})
		return out
	case fd.Kind() == protoreflect.StringKind:
		return v.String()
	}
	return nil
}
