package simulate

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"
)

// TestSVG: the chart is well-formed XML whose root is <svg> in the SVG
// namespace, version 1.1, with a viewBox, and holds one <path> per
// candidate, one for the exact log and one for the limit, each with its
// id (SeriesID) and a non-empty drawing, and a legend naming each.
func TestSVG(t *testing.T) {
	tr, err := Generate("onoff:duration=5s", 50, time.Second, 1, "k")
	if err != nil {
		t.Fatal(err)
	}
	cands := Candidates(perSecond50, DefaultPrecisions, nil)
	rep, err := Run(context.Background(), tr, perSecond50, cands)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteSVG(&buf, rep); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{SeriesID("limit"): "series limit", SeriesID("exact sliding log"): "series exact"}
	for _, c := range cands {
		want[SeriesID(c.Name(perSecond50))] = "series candidate"
	}
	if len(want) != len(cands)+2 {
		t.Fatalf("series ids are not distinct: %v", want)
	}
	dec := xml.NewDecoder(&buf)
	dec.Strict = true
	var root *xml.StartElement
	seen := map[string]bool{}
	var text strings.Builder
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if root == nil {
				e := el.Copy()
				root = &e
			}
			if el.Name.Space != "http://www.w3.org/2000/svg" {
				t.Errorf("<%s> in namespace %q", el.Name.Local, el.Name.Space)
			}
			if el.Name.Local != "path" {
				continue
			}
			var id, class, d string
			for _, a := range el.Attr {
				switch a.Name.Local {
				case "id":
					id = a.Value
				case "class":
					class = a.Value
				case "d":
					d = a.Value
				}
			}
			if seen[id] {
				t.Errorf("two paths with id %q", id)
			}
			seen[id] = true
			if want[id] != class {
				t.Errorf("path %q of class %q, want %q", id, class, want[id])
			}
			if !strings.HasPrefix(d, "M") || strings.Count(d, "H") < 1 {
				t.Errorf("path %q draws %q", id, d)
			}
		case xml.CharData:
			text.Write(el)
		}
	}
	if root == nil || root.Name.Local != "svg" {
		t.Fatalf("root %v, want <svg>", root)
	}
	attrs := map[string]string{}
	for _, a := range root.Attr {
		attrs[a.Name.Local] = a.Value
	}
	if attrs["version"] != "1.1" || len(strings.Fields(attrs["viewBox"])) != 4 {
		t.Errorf("root attributes %v: want version 1.1 and a viewBox", attrs)
	}
	for id := range want {
		if !seen[id] {
			t.Errorf("no path %q", id)
		}
	}
	for _, c := range cands {
		if !strings.Contains(text.String(), c.Name(perSecond50)) {
			t.Errorf("the legend does not name %s", c.Name(perSecond50))
		}
	}
}

// TestTableAndJSON: the table has a row per candidate and the exact log,
// the JSON every report with its series.
func TestTableAndJSON(t *testing.T) {
	tr, _ := Generate("poisson:duration=3s", 50, time.Second, 1, "k")
	cands := Candidates(perSecond50, []uint64{10}, nil)
	rep, err := Run(context.Background(), tr, perSecond50, cands)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, rep); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3+len(cands) || !strings.Contains(lines[2], "exact sliding log") {
		t.Errorf("table:\n%s", buf.String())
	}
	buf.Reset()
	if err := WriteSummary(&buf, []*Report{rep, rep}); err != nil || strings.Count(buf.String(), "\n") != 3+len(cands) {
		t.Errorf("summary (%v):\n%s", err, buf.String())
	}
	buf.Reset()
	if err := WriteJSON(&buf, []*Report{rep}); err != nil {
		t.Fatal(err)
	}
	var back struct{ Traces []Report }
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil || len(back.Traces) != 1 || len(back.Traces[0].Results) != len(cands) ||
		back.Traces[0].Results[1].Precision != 10 || len(back.Traces[0].Exact.Series) == 0 {
		t.Errorf("JSON (%v): %s", err, buf.String()[:200])
	}
}
