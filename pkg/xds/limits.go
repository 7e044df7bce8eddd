package xds

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/protoscan"
)

// Limits bound one response, all its resources together. They are checked
// on the wire bytes of the resources before any of them is decoded, by a
// walk that allocates nothing, visits each byte once and stops at the first
// excess, so a hostile response costs no more than its own bytes: a
// descriptor nested 9,000 deep or 180,000 descriptors are refused before
// any is built. A response within them is decoded and validated by the
// YAML's parser, whose memory grows with the descriptors and values these
// bound. Zero fields take the defaults in brackets.
type Limits struct {
	// MaxDepth bounds the nesting of descriptors, and of metadata values
	// [64, the YAML's bound on descriptors].
	MaxDepth int
	// MaxDescriptors bounds the descriptors of one response [100,000, the
	// YAML's bound on one file].
	MaxDescriptors int
	// MaxValues bounds the other repeated parts: replaces entries and
	// metadata values (each field of a struct, each element of a list)
	// [100,000].
	MaxValues int
	// MaxStringBytes bounds the bytes of the strings the config will hold:
	// each string once, and a descriptor's key and value once more for
	// every descriptor below it, since the parser names each descriptor
	// by its path from the top (key=value per level) [32 MiB].
	MaxStringBytes int
	// MaxBytes bounds the resources' bytes on the wire
	// [Options.MaxRecvBytes, else 4 MiB].
	MaxBytes int
	// MaxMetadataBytes bounds one descriptor's metadata on the wire
	// [descriptors.MaxMetadataBytes, the bound of a file's].
	MaxMetadataBytes int
}

// The Limits' defaults.
const (
	DefaultMaxDepth       = 64
	DefaultMaxDescriptors = 100_000
	DefaultMaxValues      = 100_000
	DefaultMaxStringBytes = 32 << 20
	DefaultMaxBytes       = 4 << 20
)

func (l Limits) withDefaults(maxRecv int) Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	if maxRecv <= 0 {
		maxRecv = DefaultMaxBytes
	}
	def(&l.MaxDepth, DefaultMaxDepth)
	def(&l.MaxDescriptors, DefaultMaxDescriptors)
	def(&l.MaxValues, DefaultMaxValues)
	def(&l.MaxStringBytes, DefaultMaxStringBytes)
	def(&l.MaxBytes, maxRecv)
	def(&l.MaxMetadataBytes, descriptors.MaxMetadataBytes)
	return l
}

// LimitError is a response refused by one of the Limits before it was
// decoded. Its message names the limit and the resource where the walk
// stopped: "xds:deep: over the xDS depth limit: descriptors nested deeper
// than 64 levels".
type LimitError struct {
	Resource string // SpecName of the resource, "" for the response as a whole
	Limit    string // depth, descriptors, values, string bytes, bytes or metadata bytes
	Max      int
	What     string // what went over, in words
}

func (e *LimitError) Error() string {
	msg := fmt.Sprintf("over the xDS %s limit: %s", e.Limit, e.What)
	if e.Resource == "" {
		return msg
	}
	return e.Resource + ": " + msg
}

// Field numbers of ratelimit.config.ratelimit.v3 and google.protobuf.Struct.
const (
	fConfigName, fConfigDomain, fConfigDescriptors           = 1, 2, 3
	fDescKey, fDescValue, fDescRateLimit, fDescDescriptors   = 1, 2, 3, 4
	fDescMetadata                                            = 8
	fPolicyName, fPolicyReplaces                             = 4, 5
	fReplaceName                                             = 1
	fStructFields, fEntryKey, fEntryValue                    = 1, 1, 2
	fValueString, fValueStruct, fValueList, fListValueValues = 3, 5, 6, 1
)

// budget is what remains of the Limits while walking one response.
type budget struct {
	lim                        Limits
	descriptors, values, bytes int
	resource                   string // SpecName of the resource being walked
}

func newBudget(l Limits) *budget {
	return &budget{lim: l, descriptors: l.MaxDescriptors, values: l.MaxValues, bytes: l.MaxStringBytes}
}

func (b *budget) over(limit string, max int, format string, args ...any) error {
	return &LimitError{Resource: b.resource, Limit: limit, Max: max, What: fmt.Sprintf(format, args...)}
}

// malformed is the error of bytes that are not a protobuf message.
func (b *budget) malformed(what string) error {
	return fmt.Errorf("%s: %s is not a valid protobuf message", b.resource, what)
}

// strings spends n bytes of strings.
func (b *budget) strings(n int) error {
	if b.bytes -= n; b.bytes < 0 {
		return b.over("string bytes", b.lim.MaxStringBytes, "more than %d bytes of strings (paths of descriptors included) in one response", b.lim.MaxStringBytes)
	}
	return nil
}

func (b *budget) value() error {
	if b.values--; b.values < 0 {
		return b.over("values", b.lim.MaxValues, "more than %d replaces entries and metadata values in one response", b.lim.MaxValues)
	}
	return nil
}

// metadata walks a descriptor's metadata, a Struct, refusing it at once
// when its bytes are over the bound.
func (b *budget) metadata(m []byte) error {
	if len(m) > b.lim.MaxMetadataBytes {
		return b.over("metadata bytes", b.lim.MaxMetadataBytes, "a descriptor's metadata of %d bytes, more than %d", len(m), b.lim.MaxMetadataBytes)
	}
	return b.metaStruct(m, 1)
}

// checkResources walks the resources of one response against l. Their
// type URLs have been checked.
func checkResources(res []*anypb.Any, l Limits) error {
	total := 0
	for _, a := range res {
		total += len(a.GetValue()) + len(a.GetTypeUrl())
	}
	if total > l.MaxBytes {
		return &LimitError{Limit: "bytes", Max: l.MaxBytes, What: fmt.Sprintf("resources of %d bytes in one response, more than %d", total, l.MaxBytes)}
	}
	b := newBudget(l)
	for i, a := range res {
		if err := b.config(i, a.GetValue()); err != nil {
			return err
		}
	}
	return nil
}

// fieldIter iterates over the fields of a message without allocating
// (protoscan.Next). After next returns false, bad reports whether the
// bytes ended in the middle of a field.
type fieldIter struct {
	m   []byte
	i   int
	num protowire.Number
	typ protowire.Type
	v   []byte // a length-delimited field's bytes; nil for the others
	bad bool
}

func (it *fieldIter) next() bool {
	if it.i >= len(it.m) {
		return false
	}
	f, j, err := protoscan.Next(it.m, it.i)
	if err != nil {
		it.bad = true
		return false
	}
	it.i, it.num, it.typ, it.v = j, f.Num, f.Type, nil
	if f.Type == protowire.BytesType {
		it.v = it.m[f.Lo:f.Hi]
	}
	return true
}

// bytesField reports whether the field is number num, length-delimited.
func (it *fieldIter) bytesField(num protowire.Number) bool {
	return it.num == num && it.typ == protowire.BytesType
}

// config walks resource i, a RateLimitConfig.
func (b *budget) config(i int, m []byte) error {
	var name, domain []byte
	it := fieldIter{m: m}
	for it.next() {
		switch {
		case it.bytesField(fConfigName):
			name = it.v
		case it.bytesField(fConfigDomain):
			domain = it.v
		}
	}
	if it.bad {
		return fmt.Errorf("resource %d: not a valid protobuf message", i)
	}
	b.resource = specName(clip(name), clip(domain))
	if err := b.strings(len(name) + len(domain)); err != nil {
		return err
	}
	for it = (fieldIter{m: m}); it.next(); {
		if it.bytesField(fConfigDescriptors) {
			if err := b.descriptor(it.v, 1, 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// descriptor walks a RateLimitDescriptor at depth (1 for the top level)
// under a path of prefix bytes.
func (b *budget) descriptor(m []byte, depth, prefix int) error {
	if depth > b.lim.MaxDepth {
		return b.over("depth", b.lim.MaxDepth, "descriptors nested deeper than %d levels", b.lim.MaxDepth)
	}
	if b.descriptors--; b.descriptors < 0 {
		return b.over("descriptors", b.lim.MaxDescriptors, "more than %d descriptors in one response", b.lim.MaxDescriptors)
	}
	// Its own path first (key and value may come after its children):
	// the parent's, '/', key, '=', value.
	path := prefix + 2
	it := fieldIter{m: m}
	for it.next() {
		if it.bytesField(fDescKey) || it.bytesField(fDescValue) {
			path += len(it.v)
		}
	}
	if it.bad {
		return b.malformed("a descriptor")
	}
	if err := b.strings(path); err != nil {
		return err
	}
	for it = (fieldIter{m: m}); it.next(); {
		var err error
		switch {
		case it.bytesField(fDescDescriptors):
			err = b.descriptor(it.v, depth+1, path)
		case it.bytesField(fDescRateLimit):
			err = b.policy(it.v)
		case it.bytesField(fDescMetadata):
			err = b.metadata(it.v)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// policy walks a RateLimitPolicy: its name and replaces.
func (b *budget) policy(m []byte) error {
	it := fieldIter{m: m}
	for it.next() {
		var err error
		switch {
		case it.bytesField(fPolicyName):
			err = b.strings(len(it.v))
		case it.bytesField(fPolicyReplaces):
			err = b.replace(it.v)
		}
		if err != nil {
			return err
		}
	}
	if it.bad {
		return b.malformed("a rate_limit")
	}
	return nil
}

// replace walks a RateLimitReplace.
func (b *budget) replace(m []byte) error {
	if err := b.value(); err != nil {
		return err
	}
	it := fieldIter{m: m}
	for it.next() {
		if it.bytesField(fReplaceName) {
			if err := b.strings(len(it.v)); err != nil {
				return err
			}
		}
	}
	if it.bad {
		return b.malformed("a replaces entry")
	}
	return nil
}

// metaStruct walks a google.protobuf.Struct at depth.
func (b *budget) metaStruct(m []byte, depth int) error {
	it := fieldIter{m: m}
	for it.next() {
		if !it.bytesField(fStructFields) {
			continue
		}
		if err := b.value(); err != nil {
			return err
		}
		entry := fieldIter{m: it.v}
		for entry.next() {
			var err error
			switch {
			case entry.bytesField(fEntryKey):
				err = b.strings(len(entry.v))
			case entry.bytesField(fEntryValue):
				err = b.metaValue(entry.v, depth)
			}
			if err != nil {
				return err
			}
		}
		if entry.bad {
			return b.malformed("a metadata field")
		}
	}
	if it.bad {
		return b.malformed("metadata")
	}
	return nil
}

// metaValue walks a google.protobuf.Value at depth.
func (b *budget) metaValue(m []byte, depth int) error {
	if depth > b.lim.MaxDepth {
		return b.over("depth", b.lim.MaxDepth, "metadata nested deeper than %d levels", b.lim.MaxDepth)
	}
	it := fieldIter{m: m}
	for it.next() {
		var err error
		switch {
		case it.bytesField(fValueString):
			err = b.strings(len(it.v))
		case it.bytesField(fValueStruct):
			err = b.metaStruct(it.v, depth+1)
		case it.bytesField(fValueList):
			err = b.metaList(it.v, depth+1)
		}
		if err != nil {
			return err
		}
	}
	if it.bad {
		return b.malformed("a metadata value")
	}
	return nil
}

// metaList walks a google.protobuf.ListValue at depth.
func (b *budget) metaList(m []byte, depth int) error {
	it := fieldIter{m: m}
	for it.next() {
		if !it.bytesField(fListValueValues) {
			continue
		}
		if err := b.value(); err != nil {
			return err
		}
		if err := b.metaValue(it.v, depth); err != nil {
			return err
		}
	}
	if it.bad {
		return b.malformed("a metadata list")
	}
	return nil
}

// maxNameInError bounds a resource's name or domain in an error message.
const maxNameInError = 128

// clip returns b as a string of at most maxNameInError bytes, cut at a
// rune boundary.
func clip(b []byte) string {
	if len(b) <= maxNameInError {
		return string(b)
	}
	n := maxNameInError
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return string(b[:n]) + "..."
}
