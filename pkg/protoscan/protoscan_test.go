package protoscan

import (
	"errors"
	"io"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

func TestEach(t *testing.T) {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, "a\xffb") // not UTF-8: kept byte for byte
	b = protowire.AppendTag(b, 3, protowire.VarintType)
	b = protowire.AppendVarint(b, 300)
	b = protowire.AppendTag(b, 5, protowire.Fixed32Type)
	b = protowire.AppendFixed32(b, 7)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendBytes(b, nil)
	type seen struct {
		num  protowire.Number
		v    uint64
		data string
	}
	var got []seen
	if err := Each(b, func(f Field, data []byte) error {
		got = append(got, seen{f.Num, f.V, string(data)})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []seen{{1, 0, "a\xffb"}, {3, 300, ""}, {5, 0, ""}, {2, 0, ""}}
	if len(got) != len(want) {
		t.Fatalf("fields %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("field %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	stop := errors.New("stop")
	n := 0
	if err := Each(b, func(Field, []byte) error { n++; return stop }); err != stop || n != 1 {
		t.Errorf("an error from f: %v after %d calls, want it at once", err, n)
	}
}

func TestNextErrors(t *testing.T) {
	big := protowire.AppendTag(nil, protowire.MaxValidNumber+1, protowire.VarintType)
	big = protowire.AppendVarint(big, 1)
	for _, c := range []struct {
		name string
		b    []byte
		want string
		eof  bool
	}{
		{"truncated bytes", []byte{0x0a, 0x05, 'a'}, "byte 0: field 1 (wire type 2): unexpected EOF", true},
		{"truncated tag", []byte{0x80}, "byte 0: field tag", true},
		{"varint overflow", []byte{0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, "byte 0: field 3", false},
		{"field number over protobuf's", big, "over the maximum", false},
	} {
		_, _, err := Next(c.b, 0)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
		if c.eof && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s: %v, want io.ErrUnexpectedEOF", c.name, err)
		}
	}
}

// TestStringMapRoundTrip: a map's entries go out in key order and come
// back byte for byte, strings that are not UTF-8 included.
func TestStringMapRoundTrip(t *testing.T) {
	m := map[string]string{"b": "2", "a\xff": "v\xfe", "": ""}
	b := AppendStringMap(nil, 1, m)
	got := map[string]string{}
	var order []string
	if err := Each(b, func(f Field, entry []byte) error {
		if f.Num != 1 || f.Type != protowire.BytesType {
			t.Fatalf("field %d type %d, want entries of field 1", f.Num, f.Type)
		}
		k, v, err := MapEntry(entry)
		got[k] = v
		order = append(order, k)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(m) || strings.Join(order, ",") != ",a\xff,b" {
		t.Fatalf("entries %q in order %q, want %q in key order", got, order, m)
	}
	for k, v := range m {
		if got[k] != v {
			t.Errorf("%q = %q, want %q", k, got[k], v)
		}
	}
	if _, _, err := MapEntry([]byte{0x0a, 0x05}); err == nil {
		t.Error("a truncated entry: no error")
	}
}
