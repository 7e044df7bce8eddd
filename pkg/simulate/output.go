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
func leftCell(s string) string { return s + strings.Repeat(" ", max(0, 36-len(s))) }

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
	c := newChart(rep)
	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", svgWidth, svgHeight, svgWidth, svgHeight)
	fmt.Fprintf(&b, "<title>%s</title>\n", esc(fmt.Sprintf("rls simulate: %s, limit %d per %s", traceTitle(rep), rep.Limit, rep.Window)))
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>`+"\n", svgWidth, svgHeight)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="15">%s</text>`+"\n", svgLeft, esc(fmt.Sprintf("%s: admitted per trailing %s, limit %d", traceTitle(rep), rep.Window, rep.Limit)))
	c.writeAxes(&b, rep)
	lines := c.lines(rep)
	writePaths(&b, lines)
	writeLegend(&b, rep, lines)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteSVG's canvas and margins; the legend is in the right margin.
const (
	svgWidth, svgHeight                  = 1040, 560
	svgLeft, svgRight, svgTop, svgBottom = 64, 300, 48, 56
)

// chart is WriteSVG's plot area and scales: seconds from the origin
// across, admitted hits up, with grid steps of 1, 2 or 5 times a power of
// ten.
type chart struct {
	pw, ph      float64 // the plot's width and height
	xmax, xstep float64
	ymax, ystep float64
}

// newChart scales the plot to rep: the whole trace across, the limit and
// every series' highest point (with a tenth more) up.
func newChart(rep *Report) chart {
	c := chart{pw: float64(svgWidth - svgLeft - svgRight), ph: float64(svgHeight - svgTop - svgBottom), xmax: rep.Duration}
	if n := len(rep.Exact.Series); n > 1 {
		c.xmax = max(c.xmax, rep.Exact.Series[n-1][0]+(rep.Exact.Series[1][0]-rep.Exact.Series[0][0]))
	}
	if c.xmax <= 0 {
		c.xmax = 1
	}
	ytop := float64(rep.Limit)
	for _, r := range append([]Result{rep.Exact}, rep.Results...) {
		for _, p := range r.Series {
			ytop = max(ytop, p[1])
		}
	}
	c.ystep = niceStep(ytop * 1.1 / 6)
	c.ymax = math.Ceil(ytop*1.1/c.ystep) * c.ystep
	c.xstep = niceStep(c.xmax / 10)
	return c
}

func (c *chart) x(s float64) float64 { return float64(svgLeft) + s/c.xmax*c.pw }
func (c *chart) y(v float64) float64 { return float64(svgTop) + c.ph - v/c.ymax*c.ph }

// writeAxes writes the grid and the axes' labels.
func (c *chart) writeAxes(b *strings.Builder, rep *Report) {
	b.WriteString(`<g id="axes" stroke="#dddddd" stroke-width="1">` + "\n")
	for v := 0.0; v <= c.ymax+c.ystep/2; v += c.ystep {
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`+"\n", svgLeft, c.y(v), svgLeft+int(c.pw), c.y(v))
	}
	for s := 0.0; s <= c.xmax*(1+1e-9); s += c.xstep {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`+"\n", c.x(s), svgTop, c.x(s), svgTop+int(c.ph))
	}
	b.WriteString("</g>\n")
	b.WriteString(`<g id="labels" fill="#333333">` + "\n")
	for v := 0.0; v <= c.ymax+c.ystep/2; v += c.ystep {
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", svgLeft-6, c.y(v)+4, trimFloat(v))
	}
	for s := 0.0; s <= c.xmax*(1+1e-9); s += c.xstep {
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", c.x(s), svgTop+int(c.ph)+18, trimFloat(s))
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", float64(svgLeft)+c.pw/2, svgHeight-12, esc(fmt.Sprintf("seconds from %s", trimFloat(rep.Origin))))
	fmt.Fprintf(b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">%s</text>`+"\n", float64(svgTop)+c.ph/2, float64(svgTop)+c.ph/2, esc("admitted in the trailing "+rep.Window))
	b.WriteString("</g>\n")
}

// svgLine is one line of the chart and its legend entry.
type svgLine struct {
	name, class, color, dash string
	width                    float64
	d                        string // the path
}

// dashAttr is the line's stroke-dasharray attribute, "" for a solid line.
func (l *svgLine) dashAttr() string {
	if l.dash == "" {
		return ""
	}
	return fmt.Sprintf(` stroke-dasharray="%s"`, l.dash)
}

// lines returns the chart's lines: the limit, the exact log, then the
// candidates in rep's order.
func (c *chart) lines(rep *Report) []svgLine {
	lines := []svgLine{
		{name: fmt.Sprintf("limit (%d)", rep.Limit), class: "series limit", color: "#d62728", dash: "6 4", width: 1.5,
			d: fmt.Sprintf("M%.1f %.1fH%.1f", c.x(0), c.y(float64(rep.Limit)), c.x(c.xmax))},
		{name: rep.Exact.Name, class: "series exact", color: "#000000", width: 2.5, d: c.step(rep.Exact.Series)},
	}
	for i, r := range rep.Results {
		lines = append(lines, svgLine{name: r.Name, class: "series candidate", color: palette[i%len(palette)], width: 1.2, d: c.step(r.Series)})
	}
	return lines
}

// step is series' path: a step function held to the chart's right edge.
func (c *chart) step(series [][2]float64) string {
	var d strings.Builder
	for i, p := range series {
		if i == 0 {
			fmt.Fprintf(&d, "M%.1f %.1f", c.x(p[0]), c.y(p[1]))
		} else {
			fmt.Fprintf(&d, "H%.1fV%.1f", c.x(p[0]), c.y(p[1]))
		}
	}
	if n := len(series); n > 0 {
		fmt.Fprintf(&d, "H%.1f", c.x(c.xmax))
	}
	return d.String()
}

// writePaths writes one <path> per line, with a unique id from SeriesID:
// the candidates first, then the exact log and the limit on top.
func writePaths(b *strings.Builder, lines []svgLine) {
	ids := map[string]bool{}
	b.WriteString(`<g id="series" fill="none" stroke-linejoin="round">` + "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := &lines[i]
		id := SeriesID(strings.SplitN(l.name, " (", 2)[0])
		for ids[id] {
			id += "_"
		}
		ids[id] = true
		fmt.Fprintf(b, `<path id="%s" class="%s" stroke="%s" stroke-width="%g"%s d="%s"><title>%s</title></path>`+"\n",
			id, l.class, l.color, l.width, l.dashAttr(), l.d, esc(l.name))
	}
	b.WriteString("</g>\n")
}

// writeLegend writes the legend: each line with its peak/L, '*' marking
// the rule's own candidate.
func writeLegend(b *strings.Builder, rep *Report, lines []svgLine) {
	lx := svgWidth - svgRight + 20
	b.WriteString(`<g id="legend">` + "\n")
	fmt.Fprintf(b, `<text x="%d" y="%d" font-weight="bold">peak / L</text>`+"\n", lx, svgTop+4)
	for i := range lines {
		l := &lines[i]
		ly := svgTop + 24 + i*20
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="%g"%s/>`+"\n", lx, ly-4, lx+24, ly-4, l.color, max(l.width, 2), l.dashAttr())
		fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`+"\n", lx+30, ly, esc(legendLabel(rep, i, l.name)))
	}
	b.WriteString("</g>\n")
}

// legendLabel is the legend's text for line i, named name: the limit's
// name alone, the others' peak/L before it.
func legendLabel(rep *Report, i int, name string) string {
	switch {
	case i == 1:
		return fmt.Sprintf("%.2f  %s", rep.Exact.PeakRatio, name)
	case i >= 2:
		r := rep.Results[i-2]
		label := fmt.Sprintf("%.2f  %s", r.PeakRatio, name)
		if r.Own {
			label += " *"
		}
		return label
	}
	return name
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
