package simulate

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// WriteTable writes rep as the table `rls simulate` prints: one row for
// the exact log and one per candidate ('*' marks the rule's own).
func WriteTable(w io.Writer, rep *Report) error {
	fmt.Fprintf(w, "%s: %s over %.1fs, limit %d per %s\n", traceTitle(rep), plural(rep.Requests, "request"), rep.Duration, rep.Limit, rep.Window)
	if rep.Keys > 1 {
		fmt.Fprintf(w, "%d keys; the peak is the busiest key's, the chart follows %q\n", rep.Keys, rep.ChartKey)
	}
	if rep.Skipped > 0 {
		fmt.Fprintf(w, "%s of the trace skipped: another rule's or none\n", plural(rep.Skipped, "row"))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, leftCell("candidate")+"\tpeak/L\tpeak\tadmitted\twrongly admitted\twrongly denied\tredis calls\tredis cmds\tbytes/key\t\n")
	e := rep.Exact
	fmt.Fprintf(tw, "%s\t%.2f\t%d\t%d\t-\t-\t-\t-\t-\t\n", leftCell(e.Name), e.PeakRatio, e.Peak, e.Admitted)
	for _, r := range rep.Results {
		name := r.Name
		if r.Own {
			name += " *"
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%d\t%d\t%d (%s)\t%d (%s)\t%g\t%.2f\t%d\t\n", leftCell(name), r.PeakRatio, r.Peak, r.Admitted,
			r.WronglyAdmitted, percent(r.WronglyAdmittedShare), r.WronglyDenied, percent(r.WronglyDeniedShare),
			r.RedisCalls, r.RedisCommands, r.RedisBytes)
	}
	return tw.Flush()
}

// leftCell pads a name so that the right-aligned table shows it left
// aligned: tabwriter aligns every column alike.
func leftCell(s string) string { return s + strings.Repeat(" ", max(0, 30-len(s))) }

func traceTitle(rep *Report) string {
	if rep.Seed != 0 {
		return fmt.Sprintf("%s (seed %d)", rep.Trace, rep.Seed)
	}
	return rep.Trace
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func percent(f float64) string {
	switch {
	case f == 0:
		return "0%"
	case f < 0.001:
		return "<0.1%"
	}
	return fmt.Sprintf("%.1f%%", 100*f)
}

// WriteSummary writes, for several reports of the same candidates, one row
// per candidate: its peak/L and wrongly denied share on each trace, and
// its Redis bytes per key.
func WriteSummary(w io.Writer, reps []*Report) error {
	if len(reps) == 0 {
		return nil
	}
	fmt.Fprintf(w, "peak/L and wrongly denied, per trace (limit %d per %s):\n", reps[0].Limit, reps[0].Window)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, leftCell("candidate"))
	for _, r := range reps {
		fmt.Fprintf(tw, "\t%s", r.Trace)
	}
	fmt.Fprint(tw, "\tbytes/key\t\n")
	fmt.Fprint(tw, leftCell(reps[0].Exact.Name))
	for _, r := range reps {
		fmt.Fprintf(tw, "\t%.2f", r.Exact.PeakRatio)
	}
	fmt.Fprint(tw, "\t-\t\n")
	for i, c := range reps[0].Results {
		name := c.Name
		if c.Own {
			name += " *"
		}
		fmt.Fprint(tw, leftCell(name))
		for _, r := range reps {
			if i >= len(r.Results) || r.Results[i].Name != c.Name {
				return fmt.Errorf("traces %s and %s compare different candidates", reps[0].Trace, r.Trace)
			}
			fmt.Fprintf(tw, "\t%.2f %6s", r.Results[i].PeakRatio, percent(r.Results[i].WronglyDeniedShare))
		}
		fmt.Fprintf(tw, "\t%d\t\n", c.RedisBytes)
	}
	return tw.Flush()
}

// WriteJSON writes the reports as one JSON document.
func WriteJSON(w io.Writer, reps []*Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Traces []*Report `json:"traces"`
	}{reps})
}

// SeriesID returns the id of a series' path in the SVG: "series-" and the
// name with every character but letters, digits and '_' made '-':
// "series-sliding_window-precision-10", "series-exact-sliding-log",
// "series-limit".
func SeriesID(name string) string {
	var b strings.Builder
	b.WriteString("series-")
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	return b.String()
}

// palette colours the candidates' series in order.
var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a"}

// WriteSVG draws rep's series as a self-contained SVG 1.1 chart: admitted
// hits per trailing window over time on the chart key, one <path> per
// candidate (class "series candidate"), the exact log (class "series
// exact") and the limit (class "series limit"), each with an id from
// SeriesID and a <title> naming it, and a legend.
func WriteSVG(w io.Writer, rep *Report) error {
	const (
		width, height            = 1040, 560
		left, right, top, bottom = 64, 300, 48, 56 // margins; the legend is in the right one
	)
	pw, ph := float64(width-left-right), float64(height-top-bottom)
	xmax := rep.Duration
	if n := len(rep.Exact.Series); n > 1 {
		xmax = max(xmax, rep.Exact.Series[n-1][0]+(rep.Exact.Series[1][0]-rep.Exact.Series[0][0]))
	}
	if xmax <= 0 {
		xmax = 1
	}
	ytop := float64(rep.Limit)
	for _, r := range append([]Result{rep.Exact}, rep.Results...) {
		for _, p := range r.Series {
			ytop = max(ytop, p[1])
		}
	}
	ystep := niceStep(ytop * 1.1 / 6)
	ymax := math.Ceil(ytop*1.1/ystep) * ystep
	xstep := niceStep(xmax / 10)
	x := func(s float64) float64 { return float64(left) + s/xmax*pw }
	y := func(v float64) float64 { return float64(top) + ph - v/ymax*ph }

	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, "<title>%s</title>\n", esc(fmt.Sprintf("rls simulate: %s, limit %d per %s", traceTitle(rep), rep.Limit, rep.Window)))
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="15">%s</text>`+"\n", left, esc(fmt.Sprintf("%s: admitted per trailing %s, limit %d", traceTitle(rep), rep.Window, rep.Limit)))
	// Grid and axes.
	b.WriteString(`<g id="axes" stroke="#dddddd" stroke-width="1">` + "\n")
	for v := 0.0; v <= ymax+ystep/2; v += ystep {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`+"\n", left, y(v), left+int(pw), y(v))
	}
	for s := 0.0; s <= xmax*(1+1e-9); s += xstep {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`+"\n", x(s), top, x(s), top+int(ph))
	}
	b.WriteString("</g>\n")
	b.WriteString(`<g id="labels" fill="#333333">` + "\n")
	for v := 0.0; v <= ymax+ystep/2; v += ystep {
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, trimFloat(v))
	}
	for s := 0.0; s <= xmax*(1+1e-9); s += xstep {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(s), top+int(ph)+18, trimFloat(s))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", float64(left)+pw/2, height-12, esc(fmt.Sprintf("seconds from %s", trimFloat(rep.Origin))))
	fmt.Fprintf(&b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">%s</text>`+"\n", float64(top)+ph/2, float64(top)+ph/2, esc("admitted in the trailing "+rep.Window))
	b.WriteString("</g>\n")

	type entry struct {
		name, class, color, dash string
		width                    float64
		d                        string
	}
	var entries []entry
	step := func(series [][2]float64) string {
		var d strings.Builder
		for i, p := range series {
			if i == 0 {
				fmt.Fprintf(&d, "M%.1f %.1f", x(p[0]), y(p[1]))
			} else {
				fmt.Fprintf(&d, "H%.1fV%.1f", x(p[0]), y(p[1]))
			}
		}
		if n := len(series); n > 0 {
			fmt.Fprintf(&d, "H%.1f", x(xmax))
		}
		return d.String()
	}
	entries = append(entries, entry{name: fmt.Sprintf("limit (%d)", rep.Limit), class: "series limit", color: "#d62728", dash: "6 4", width: 1.5,
		d: fmt.Sprintf("M%.1f %.1fH%.1f", x(0), y(float64(rep.Limit)), x(xmax))})
	entries = append(entries, entry{name: rep.Exact.Name, class: "series exact", color: "#000000", width: 2.5, d: step(rep.Exact.Series)})
	for i, r := range rep.Results {
		entries = append(entries, entry{name: r.Name, class: "series candidate", color: palette[i%len(palette)], width: 1.2, d: step(r.Series)})
	}
	ids := map[string]bool{}
	b.WriteString(`<g id="series" fill="none" stroke-linejoin="round">` + "\n")
	// The candidates first, then the exact log and the limit on top.
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		id := SeriesID(strings.SplitN(e.name, " (", 2)[0])
		for ids[id] {
			id += "_"
		}
		ids[id] = true
		dash := ""
		if e.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, e.dash)
		}
		fmt.Fprintf(&b, `<path id="%s" class="%s" stroke="%s" stroke-width="%g"%s d="%s"><title>%s</title></path>`+"\n",
			id, e.class, e.color, e.width, dash, e.d, esc(e.name))
	}
	b.WriteString("</g>\n")
	// Legend.
	lx := width - right + 20
	b.WriteString(`<g id="legend">` + "\n")
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">peak / L</text>`+"\n", lx, top+4)
	for i, e := range entries {
		ly := top + 24 + i*20
		dash := ""
		if e.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, e.dash)
		}
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="%g"%s/>`+"\n", lx, ly-4, lx+24, ly-4, e.color, max(e.width, 2), dash)
		label := e.name
		switch {
		case i == 1:
			label = fmt.Sprintf("%.2f  %s", rep.Exact.PeakRatio, e.name)
		case i >= 2:
			r := rep.Results[i-2]
			label = fmt.Sprintf("%.2f  %s", r.PeakRatio, e.name)
			if r.Own {
				label += " *"
			}
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", lx+30, ly, esc(label))
	}
	b.WriteString("</g>\n</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceStep returns 1, 2 or 5 times a power of ten, at least raw.
func niceStep(raw float64) float64 {
	if raw <= 0 || math.IsNaN(raw) || math.IsInf(raw, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(f float64) string {
	s := fmt.Sprintf("%.3f", f)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

// esc escapes text for XML character data and attribute values.
func esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&apos;")
	return r.Replace(s)
}
