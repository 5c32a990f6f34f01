package runlog

import (
	"crypto/sha256"
	"encoding"
	"hash"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// digest is a node's version 2 digest, or a node's salt below the root.
type digest = [sha256.Size]byte

// hasher computes the version 2 digest of a subtree whose salt is known:
// every append hashes each event it emits this way, so it is written not
// to allocate per node (walker, which also checks commitments by path,
// hands it every subtree with a salt). The encodings hashed are built in
// one scratch buffer used as a stack: a node appends its encoding past
// its parent's, hashes it and truncates the buffer back. The digests are
// those of the definitions at the top of commit.go, byte for byte
// (TestVersion2HashIsStable, TestHasherIsTheDefinition).
type hasher struct {
	buf []byte
	// states is a stack of saved SHA-256 states, two per prepared kdf on
	// the path being hashed (prepare); a node truncates it back when done.
	states []byte
	// mac is the SHA-256 that derives the salts of a node with several
	// children from its HMAC pad states (prepare), as state restores and
	// saves.
	mac      hash.Hash
	restore  encoding.BinaryUnmarshaler
	snapshot encoding.BinaryAppender
	// msg and inner are macPrepared's message and its inner digest, kept
	// here: what goes through mac's interface must not be on the stack
	// (it would escape, an allocation per salt).
	msg   []byte
	inner []byte
}

// hasherPool keeps hashers' scratch buffers across events.
var hasherPool = sync.Pool{New: func() any {
	mac := sha256.New()
	return &hasher{buf: make([]byte, 0, 1024), states: make([]byte, 0, 16*sha256StateSize), mac: mac,
		msg: make([]byte, 0, 64), inner: make([]byte, 0, sha256.Size),
		restore: mac.(encoding.BinaryUnmarshaler), snapshot: mac.(encoding.BinaryAppender)}
}}

// hashMessage returns the digest of m, whose salt is salt (at the root,
// the event: its hash field and its salt are left out).
func hashMessage(m protoreflect.Message, salt []byte, root bool) digest {
	h := hasherPool.Get().(*hasher)
	k := newKDF(salt)
	d := h.message(m, &k, root)
	h.release()
	return d
}

// hashCollection returns the digest of list or map field fd of value v,
// whose salt is salt.
func hashCollection(fd protoreflect.FieldDescriptor, v protoreflect.Value, salt []byte) digest {
	h := hasherPool.Get().(*hasher)
	k := newKDF(salt)
	d := h.collection(fd, v, &k)
	h.release()
	return d
}

// release returns h to the pool, unless an event grew its buffer large.
func (h *hasher) release() {
	if cap(h.buf) <= 64<<10 {
		h.buf, h.states = h.buf[:0], h.states[:0]
		hasherPool.Put(h)
	}
}

func (h *hasher) sum(start int) digest {
	d := sha256.Sum256(h.buf[start:])
	h.buf = h.buf[:start]
	return d
}

// message is the digest of m, whose salt's kdf is k.
func (h *hasher) message(m protoreflect.Message, k *kdf, root bool) digest {
	start := len(h.buf)
	defer h.unprepare(k, len(h.states))
	h.buf = append(h.buf, tagMessage...)
	var stack [16]protoreflect.FieldDescriptor
	fds := populatedFields(m, root, stack[:0])
	if len(fds) > 1 {
		h.prepare(k)
	}
	for _, fd := range fds {
		d := h.field(fd, m.Get(fd), h.childDigest(k, 'f', uint64(fd.Number())))
		h.buf = append(protowire.AppendVarint(h.buf, uint64(fd.Number())), d[:]...)
	}
	mark := len(h.buf)
	if root {
		h.buf = appendWithoutSalt(h.buf, m.GetUnknown())
	} else {
		h.buf = append(h.buf, m.GetUnknown()...)
	}
	if len(h.buf) > mark {
		// The unknown fields (at the root, without the salt) are a bytes
		// leaf after the fields: no field has number 0.
		ud := h.leafBytes(h.childDigest(k, 'u', 0), protoreflect.BytesKind, mark, len(h.buf))
		h.buf = append(protowire.AppendVarint(h.buf, 0), ud[:]...)
	}
	return h.sum(start)
}

// prepare saves the SHA-256 states after k's HMAC pad blocks, so that
// each child's salt costs two compressions instead of four (the pad
// blocks are hashed once for the node); for a node with several children.
func (h *hasher) prepare(k *kdf) {
	if !k.ok || k.prepared {
		return
	}
	at := len(h.states)
	if !h.saveState(k.ipad[:]) || !h.saveState(k.opad[:]) {
		h.states = h.states[:at] // a crypto/sha256 of another layout: derive without
		return
	}
	k.prepared, k.states = true, at
}

// unprepare drops the states a node pushed (h.states back to n) when it
// is done: its kdf derives without them from then on.
func (h *hasher) unprepare(k *kdf, n int) {
	h.states = h.states[:n]
	k.prepared = false
}

// saveState pushes on h.states the SHA-256 state after block; it reports
// false when the state does not have the size it expects.
func (h *hasher) saveState(block []byte) bool {
	h.mac.Reset()
	h.msg = append(h.msg[:0], block...) // block is on the stack: not through the interface
	h.mac.Write(h.msg)
	n := len(h.states)
	b, err := h.snapshot.AppendBinary(h.states)
	if err != nil || len(b)-n != sha256StateSize {
		return false
	}
	h.states = b
	return true
}

// childDigest is k.childDigest, from k's saved pad states when prepared.
func (h *hasher) childDigest(k *kdf, tag byte, n uint64) digest {
	if !k.prepared {
		return k.childDigest(tag, n)
	}
	h.msg = protowire.AppendVarint(append(h.msg[:0], tag), n)
	return h.macPrepared(k)
}

// keyDigest is k.keyDigest, from k's saved pad states when prepared.
func (h *hasher) keyDigest(k *kdf, key string) digest {
	if !k.prepared {
		return k.keyDigest(key)
	}
	h.msg = append(append(h.msg[:0], 'k'), key...)
	return h.macPrepared(k)
}

// macPrepared is HMAC(salt, h.msg) from a prepared kdf's pad states.
func (h *hasher) macPrepared(k *kdf) (d digest) {
	inner := h.states[k.states : k.states+sha256StateSize]
	outer := h.states[k.states+sha256StateSize : k.states+2*sha256StateSize]
	if h.restore.UnmarshalBinary(inner) != nil {
		return k.mac(h.msg)
	}
	h.mac.Write(h.msg)
	h.inner = h.mac.Sum(h.inner[:0])
	if h.restore.UnmarshalBinary(outer) != nil {
		return k.mac(h.msg)
	}
	h.mac.Write(h.inner)
	h.inner = h.mac.Sum(h.inner[:0])
	copy(d[:], h.inner)
	return d
}

// field is the digest of field fd of value v, whose salt is salt.
func (h *hasher) field(fd protoreflect.FieldDescriptor, v protoreflect.Value, salt digest) digest {
	if fd.IsList() || fd.IsMap() {
		k := newKDF(salt[:])
		return h.collection(fd, v, &k)
	}
	return h.elem(fd, v, salt)
}

// collection is the digest of list or map field fd of value v, whose
// salt's kdf is k.
func (h *hasher) collection(fd protoreflect.FieldDescriptor, v protoreflect.Value, k *kdf) digest {
	start := len(h.buf)
	defer h.unprepare(k, len(h.states))
	if fd.IsList() {
		l := v.List()
		h.buf = protowire.AppendVarint(append(h.buf, tagList...), uint64(l.Len()))
		if l.Len() > 1 {
			h.prepare(k)
		}
		for i := range l.Len() {
			d := h.elem(fd, l.Get(i), h.childDigest(k, 'i', uint64(i)))
			h.buf = append(h.buf, d[:]...)
		}
		return h.sum(start)
	}
	mp := v.Map()
	entries := make([]mapEntry, 0, mp.Len())
	mp.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
		entries = append(entries, mapEntry{k.String(), v})
		return true
	})
	slices.SortFunc(entries, func(a, b mapEntry) int { return strings.Compare(a.k, b.k) })
	h.buf = append(h.buf, tagMap...)
	vfd := fd.MapValue()
	if len(entries) > 1 {
		h.prepare(k)
	}
	for _, e := range entries {
		d := h.elem(vfd, e.v, h.keyDigest(k, e.k))
		h.buf = append(append(protowire.AppendVarint(h.buf, uint64(len(e.k))), e.k...), d[:]...)
	}
	return h.sum(start)
}

// mapEntry is a map field's entry, sorted by its key's text.
type mapEntry struct {
	k string
	v protoreflect.Value
}

func (h *hasher) elem(fd protoreflect.FieldDescriptor, v protoreflect.Value, salt digest) digest {
	if isMessage(fd) {
		k := newKDF(salt[:])
		return h.message(v.Message(), &k, false)
	}
	return h.leaf(salt[:], fd.Kind(), v)
}

// leaf is leafDigest built in the scratch buffer.
func (h *hasher) leaf(salt []byte, kind protoreflect.Kind, v protoreflect.Value) digest {
	start := len(h.buf)
	h.buf = appendLeaf(h.buf, salt, kind, v)
	return h.sum(start)
}

// leafBytes is the digest of a bytes leaf whose value is h.buf[from:to],
// the last thing in the buffer; the buffer is truncated back to from.
func (h *hasher) leafBytes(salt digest, kind protoreflect.Kind, from, to int) digest {
	// The leaf's prefix goes after the value, then the value is copied
	// after the prefix: the encoding is prefix || value.
	h.buf = append(append(append(h.buf, tagLeaf...), salt[:]...), byte(kind))
	h.buf = append(h.buf, h.buf[from:to]...)
	d := sha256.Sum256(h.buf[to:])
	h.buf = h.buf[:from]
	return d
}

// populatedFields appends to fds the fields of m the hash covers (those
// Range visits, the hash field of the event left out), by number, without
// Range's callback (which allocates). A descriptor with extension ranges
// falls back to Range.
func populatedFields(m protoreflect.Message, root bool, fds []protoreflect.FieldDescriptor) []protoreflect.FieldDescriptor {
	shape := shapeOf(m.Descriptor())
	if shape == nil {
		return populated(m, root)
	}
	for _, fd := range shape.plain {
		if m.Has(fd) && (!root || fd.Number() != hashField) {
			fds = append(fds, fd)
		}
	}
	for _, od := range shape.oneofs {
		if fd := m.WhichOneof(od); fd != nil && (!root || fd.Number() != hashField) {
			fds = append(fds, fd)
		}
	}
	if len(shape.oneofs) > 0 {
		slices.SortFunc(fds, func(a, b protoreflect.FieldDescriptor) int { return int(a.Number()) - int(b.Number()) })
	}
	return fds
}

// shape is what populatedFields needs of a message type: its fields
// outside real oneofs by number, and its real oneofs.
type shape struct {
	plain  []protoreflect.FieldDescriptor
	oneofs []protoreflect.OneofDescriptor
}

var shapes sync.Map // protoreflect.MessageDescriptor → *shape (nil: use Range)

func shapeOf(md protoreflect.MessageDescriptor) *shape {
	if s, ok := shapes.Load(md); ok {
		return s.(*shape)
	}
	var s *shape
	if md.ExtensionRanges().Len() == 0 {
		s = &shape{}
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
				continue
			}
			s.plain = append(s.plain, fd)
		}
		slices.SortFunc(s.plain, func(a, b protoreflect.FieldDescriptor) int { return int(a.Number()) - int(b.Number()) })
		oneofs := md.Oneofs()
		for i := range oneofs.Len() {
			if od := oneofs.Get(i); !od.IsSynthetic() {
				s.oneofs = append(s.oneofs, od)
			}
		}
	}
	shapes.Store(md, s)
	return s
}

// appendWithoutSalt appends raw unknown fields without the salt field to
// dst (withoutSaltField into a given buffer).
func appendWithoutSalt(dst, raw []byte) []byte {
	for len(raw) > 0 {
		num, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return append(dst, raw...)
		}
		m := protowire.ConsumeFieldValue(num, typ, raw[n:])
		if m < 0 {
			return append(dst, raw...)
		}
		if num != saltField {
			dst = append(dst, raw[:n+m]...)
		}
		raw = raw[n+m:]
	}
	return dst
}
