package rlqs

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestBindNamesDomainsPrintably: a report for another domain ends the
// stream InvalidArgument naming both domains, quoted and escaped once, so
// the message stays UTF-8 (gRPC's status messages must be) whatever bytes
// a client sent.
func TestBindNamesDomainsPrintably(t *testing.T) {
	st := ledgerStream(time.Unix(0, 0))
	if err := st.bind(""); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a first report without a domain: %v, want InvalidArgument", err)
	}
	if err := st.bind("a\xffb"); err != nil {
		t.Fatalf("binding: %v", err)
	}
	if err := st.bind(""); err != nil {
		t.Errorf("a later report may omit the domain: %v", err)
	}
	err := st.bind("other\x00")
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.InvalidArgument || !utf8.ValidString(msg) ||
		!strings.Contains(msg, `"other\x00"`) || !strings.Contains(msg, `"a\xffb"`) {
		t.Errorf("another domain: %v (%q), want InvalidArgument naming \"other\\x00\" and \"a\\xffb\"", err, msg)
	}
}
