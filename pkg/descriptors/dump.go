package descriptors

import (
	"fmt"
	"io"
	"strings"
)

// Dump writes c as text, its hash and domains first, then one rule a line
// with its source (file:line, or the xDS resource): what rls's /rlconfig
// shows. It returns the first write error.
func (c *Config) Dump(w io.Writer) error {
	if _, err := fmt.Fprintf(w, "# config %s, domains %v\n", c.Hash(), c.Domains()); err != nil {
		return err
	}
	for _, r := range c.Rules() {
		if _, err := io.WriteString(w, r.dumpLine()); err != nil {
			return err
		}
	}
	return nil
}

// dumpLine is r's line of Dump.
func (r *Rule) dumpLine() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", r.Domain, r.Path)
	if r.Name != "" {
		fmt.Fprintf(&b, " name=%q", r.Name)
	}
	if r.Unlimited {
		b.WriteString(" unlimited")
	} else {
		if r.UnitMultiplier > 1 {
			fmt.Fprintf(&b, " %d/%d %s %s", r.RequestsPerUnit, r.UnitMultiplier, r.Unit, r.Algorithm)
		} else {
			fmt.Fprintf(&b, " %d/%s %s", r.RequestsPerUnit, r.Unit, r.Algorithm)
		}
		if r.Precision >= 2 {
			fmt.Fprintf(&b, " precision=%d", r.Precision)
		}
		if r.Strict {
			b.WriteString(" strict")
		}
		if r.Burst > 0 {
			fmt.Fprintf(&b, " burst=%d", r.Burst)
		}
		if r.Split > 1 {
			fmt.Fprintf(&b, " split=%d", r.Split)
		}
		if r.OnError != OnErrorDefault {
			fmt.Fprintf(&b, " on_error=%s", r.OnError)
		}
		if r.NoReserve {
			b.WriteString(" reserve=false")
		}
		if r.Global {
			b.WriteString(" scope=global")
		}
	}
	if r.ShadowMode {
		b.WriteString(" shadow_mode")
	}
	if r.DetailedMetric {
		b.WriteString(" detailed_metric")
	}
	if len(r.Replaces) > 0 {
		fmt.Fprintf(&b, " replaces=%v", r.Replaces)
	}
	if r.Line > 0 {
		fmt.Fprintf(&b, " (%s:%d)\n", r.File, r.Line)
	} else {
		fmt.Fprintf(&b, " (%s)\n", r.File) // from xDS: the resource
	}
	return b.String()
}
