// Package protoscan reads protobuf's wire format one field at a time, as
// proto.Unmarshal reads it, and writes string maps, without checking that
// strings are UTF-8:
// Envoy's C++ protobuf sends header bytes as they come, and Go's protobuf
// refuses such a message. Package service decodes RateLimitRequest with
// it, package rlqs RLQS usage reports, package xds walks responses before
// decoding them.
package protoscan

import (
	"fmt"
	"sort"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field is one field of a message: its number and wire type, its value
// for a varint, and for a length-delimited field the bounds of its bytes
// in the message (b[Lo:Hi]; Lo == Hi for the other types).
type Field struct {
	Num    protowire.Number
	Type   protowire.Type
	V      uint64
	Lo, Hi int
}

// Next decodes the field of b at i and returns it with the index of the
// field after it. Fixed-size fields and groups are skipped (proto.Unmarshal
// keeps them as unknown fields). A field that does not parse, or whose
// number protobuf does not allow, is an error naming the byte it starts at.
func Next(b []byte, i int) (Field, int, error) {
	num, typ, n := protowire.ConsumeTag(b[i:])
	if n < 0 {
		return Field{}, 0, fmt.Errorf("byte %d: field tag: %w", i, protowire.ParseError(n))
	}
	if num > protowire.MaxValidNumber { // ConsumeTag lets numbers up to 2^31-1 through; protobuf does not
		return Field{}, 0, fmt.Errorf("byte %d: field number %d is over the maximum %d", i, num, protowire.MaxValidNumber)
	}
	f := Field{Num: num, Type: typ}
	j := i + n
	rest := b[j:]
	switch typ {
	case protowire.VarintType:
		f.V, n = protowire.ConsumeVarint(rest)
	case protowire.BytesType:
		var l uint64
		l, n = protowire.ConsumeVarint(rest)
		if n >= 0 && l > uint64(len(rest)-n) {
			n = -1 // truncated: ParseError(-1) is io.ErrUnexpectedEOF
		}
		if n >= 0 {
			f.Lo = j + n
			f.Hi = f.Lo + int(l)
			n += int(l)
		}
	default:
		n = protowire.ConsumeFieldValue(num, typ, rest)
	}
	if n < 0 {
		return Field{}, 0, fmt.Errorf("byte %d: field %d (wire type %d): %w", i, num, typ, protowire.ParseError(n))
	}
	return f, j + n, nil
}

// Each calls f for every field of b in turn, with the field's bytes for a
// length-delimited one (nil for the others), and stops at the first error.
func Each(b []byte, f func(fl Field, data []byte) error) error {
	for i := 0; i < len(b); {
		fl, j, err := Next(b, i)
		if err != nil {
			return err
		}
		i = j
		var data []byte
		if fl.Type == protowire.BytesType {
			data = b[fl.Lo:fl.Hi]
		}
		if err := f(fl, data); err != nil {
			return err
		}
	}
	return nil
}

// AppendStringMap appends m as the map<string, string> field num (a
// BucketId's bucket), one entry per key in key order (as proto.Marshal's
// Deterministic), its strings byte for byte.
func AppendStringMap(b []byte, num protowire.Number, m map[string]string) []byte {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, k)
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, m[k])
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	return b
}

// MapEntry decodes one entry of a map<string, string> field: its key (1)
// and value (2), byte for byte.
func MapEntry(b []byte) (k, v string, err error) {
	err = Each(b, func(f Field, d []byte) error {
		switch {
		case f.Type == protowire.BytesType && f.Num == 1:
			k = string(d)
		case f.Type == protowire.BytesType && f.Num == 2:
			v = string(d)
		}
		return nil
	})
	return k, v, err
}
