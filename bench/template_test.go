package main

import "testing"

func TestTemplate(t *testing.T) {
	var tmpls []descTemplate
	for _, s := range append(defaultDescriptors, "generic_key=100%%;x=a%nb", "user=%k-%k") {
		d, err := parseTemplate(s)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		tmpls = append(tmpls, d)
	}
	rs := newRequestSet("bench", "k", 3, tmpls, 70000)
	want := "[api_key=k65793] [api_key=k65793, route=/v1/search] [remote_address=10.1.1.1] [generic_key=login] [generic_key=100%, x=a65793b] [user=k65793-k65793]"
	if got := rs.describe(65793); got != want {
		t.Fatalf("describe:\n got %s\nwant %s", got, want)
	}
	req := rs.get(65793)
	if req.Domain != "bench" || req.HitsAddend != 3 || len(req.Descriptors) != 6 {
		t.Fatalf("request %v", req)
	}
	if rs.get(65793) != req {
		t.Fatal("prebuilt requests should be reused")
	}
	if v := rs.get(2).Descriptors[0].Entries[0].Value; v != "k2" {
		t.Fatalf("key 2: %q", v)
	}
	// Beyond maxPrebuilt, requests are built on the fly.
	big := newRequestSet("d", "p", 0, tmpls[:1], maxPrebuilt+1)
	if big.prebuilt != nil || big.get(maxPrebuilt).Descriptors[0].Entries[0].Value != "p131072" {
		t.Fatal("on-the-fly build")
	}
	// Key-independent templates build one request.
	fixed := newRequestSet("d", "p", 0, tmpls[3:4], 1000)
	if len(fixed.prebuilt) != 1 || fixed.get(999) != fixed.get(0) {
		t.Fatal("key-independent template should share one request")
	}
}

func TestTemplateErrors(t *testing.T) {
	for _, s := range []string{"", "  ", "api_key", "=x", "a=b;", "a=%", "a=%q", "%k=1"} {
		if _, err := parseTemplate(s); err == nil {
			t.Errorf("%q: want an error", s)
		}
	}
	d, err := parseTemplate("a=")
	if err != nil || len(d) != 1 || d[0].key != "a" {
		t.Errorf("empty value should parse: %v %v", d, err)
	}
}
