package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// watchedMetrics are the rls counters whose change over the measured phase
// the report shows: they tell whether the decisions were the store's.
var watchedMetrics = []string{
	"rls_fallback_decisions_total", // decided without the store (it could not answer)
	"rls_local_cache_hits_total",   // denied by the local over-limit cache
	"rls_store_errors_total",
}

// parseMetrics sums, per watched metric name, every sample of a Prometheus
// text exposition (all label sets together).
func parseMetrics(r io.Reader, names []string) (map[string]float64, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		if !want[name] {
			continue
		}
		rest := line[len(name):]
		if strings.HasPrefix(rest, "{") {
			j := strings.LastIndexByte(rest, '}')
			if j < 0 {
				return nil, fmt.Errorf("metrics: malformed line %q", line)
			}
			rest = rest[j+1:]
		}
		f := strings.Fields(rest) // value [timestamp]
		if len(f) == 0 {
			return nil, fmt.Errorf("metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil || math.IsNaN(v) {
			return nil, fmt.Errorf("metrics: bad value in %q", line)
		}
		out[name] += v
	}
	return out, sc.Err()
}

// checkMetricsURL refuses a URL whose host is not loopback.
func checkMetricsURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("-metrics-url %q: want http://host:port/metrics", s)
	}
	hp := u.Host
	if u.Port() == "" {
		hp = u.Host + ":80"
	}
	return checkLoopback("metrics-url", hp)
}

func fetchMetrics(ctx context.Context, u string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("-metrics-url: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("-metrics-url %s: %s", u, resp.Status)
	}
	return parseMetrics(resp.Body, watchedMetrics)
}

// metricDeltas is after minus before for each watched metric.
func metricDeltas(before, after map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for _, n := range watchedMetrics {
		d[n] = after[n] - before[n]
	}
	return d
}
