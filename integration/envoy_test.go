package integration

import (
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rlnet "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/envoy"
	"github.com/rls-project/rls/integration/redistest"
)

// This file stands in for Envoy: it reads the route actions of the shipped
// envoy/envoy.yaml, computes the descriptors Envoy's HTTP rate limit filter
// would send for sample requests (following the semantics documented in
// Envoy's rate_limit_filter.rst and route_components.proto, for the action
// kinds the file uses), and sends them to the real rls binary serving the
// shipped config/example.yaml.

const rlFilter = "envoy.filters.http.ratelimit"

// httpRequest is what the route actions look at.
type httpRequest struct {
	path    string            // :path, query string included
	headers map[string]string // names in any case
	client  string            // the downstream address Envoy trusts (use_remote_address)
}

func (r httpRequest) header(name string) (string, bool) {
	if name == ":path" {
		return r.path, true
	}
	for k, v := range r.headers {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return "", false
}

func loadBootstrap(t testing.TB, file string) *bootstrapv3.Bootstrap {
	t.Helper()
	y, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	b, err := envoy.LoadBootstrap(y)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return b
}

// frontProxy returns envoy.yaml's front listener: its rate limit filter and
// its route configuration.
func frontProxy(t testing.TB) (*rlhttp.RateLimit, *routev3.RouteConfiguration) {
	t.Helper()
	b := loadBootstrap(t, "../envoy/envoy.yaml")
	for _, l := range b.GetStaticResources().GetListeners() {
		if l.GetName() != "front" {
			continue
		}
		hcm := &hcmv3.HttpConnectionManager{}
		if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
			t.Fatal(err)
		}
		for _, f := range hcm.GetHttpFilters() {
			if f.GetName() == rlFilter {
				rl := &rlhttp.RateLimit{}
				if err := f.GetTypedConfig().UnmarshalTo(rl); err != nil {
					t.Fatal(err)
				}
				return rl, hcm.GetRouteConfig()
			}
		}
	}
	t.Fatal("envoy.yaml: no front listener with the rate limit filter")
	return nil, nil
}

// matchRoute picks the first route of the first virtual host whose match
// fits (Envoy's order). Only the match kinds envoy.yaml uses are simulated.
func matchRoute(t testing.TB, vh *routev3.VirtualHost, req httpRequest) *routev3.Route {
	t.Helper()
	pathOnly, _, _ := strings.Cut(req.path, "?")
	for _, r := range vh.GetRoutes() {
		m := r.GetMatch()
		if len(m.GetHeaders()) > 0 || len(m.GetQueryParameters()) > 0 || m.GetCaseSensitive() != nil {
			t.Fatalf("route match %v: not simulated", m)
		}
		switch ps := m.GetPathSpecifier().(type) {
		case *routev3.RouteMatch_Prefix:
			if strings.HasPrefix(req.path, ps.Prefix) {
				return r
			}
		case *routev3.RouteMatch_Path: // the path without the query string
			if pathOnly == ps.Path {
				return r
			}
		default:
			t.Fatalf("route match %T: not simulated", ps)
		}
	}
	return nil
}

// perRoute is the route's (else the virtual host's) RateLimitPerRoute.
func perRoute(t testing.TB, vh *routev3.VirtualHost, r *routev3.Route) *rlhttp.RateLimitPerRoute {
	t.Helper()
	for _, cfg := range []map[string]*anypb.Any{r.GetTypedPerFilterConfig(), vh.GetTypedPerFilterConfig()} {
		if a, ok := cfg[rlFilter]; ok {
			pr := &rlhttp.RateLimitPerRoute{}
			if err := a.UnmarshalTo(pr); err != nil {
				t.Fatal(err)
			}
			return pr
		}
	}
	return nil
}

// policies lists the RateLimit entries Envoy applies for a route, in
// Envoy's order (Filter::populateRateLimitDescriptors): RateLimitPerRoute's
// rate_limits alone when set; otherwise the route's entries of the filter's
// stage, then the virtual host's, as vh_rate_limits says (OVERRIDE, the
// default: only when the route has none; INCLUDE: always; IGNORE: never).
func policies(t testing.TB, filter *rlhttp.RateLimit, vh *routev3.VirtualHost, r *routev3.Route) []*routev3.RateLimit {
	t.Helper()
	if filter.GetDomain() == "" || len(filter.GetRateLimits()) > 0 {
		t.Fatal("filter-level rate_limits are not simulated")
	}
	pr := perRoute(t, vh, r)
	if pr.GetDomain() != "" {
		t.Fatal("per-route domain is not simulated")
	}
	if len(pr.GetRateLimits()) > 0 {
		return pr.GetRateLimits()
	}
	stage := func(in []*routev3.RateLimit) []*routev3.RateLimit {
		var out []*routev3.RateLimit
		for _, p := range in {
			if p.GetStage().GetValue() == filter.GetStage() {
				out = append(out, p)
			}
		}
		return out
	}
	out := stage(r.GetRoute().GetRateLimits())
	opt := pr.GetVhRateLimits()
	//lint:ignore SA1019 Envoy still honours the deprecated field, so the test models it
	if r.GetRoute().GetIncludeVhRateLimits().GetValue() {
		opt = rlhttp.RateLimitPerRoute_INCLUDE
	}
	switch opt {
	case rlhttp.RateLimitPerRoute_INCLUDE:
		out = append(out, stage(vh.GetRateLimits())...)
	case rlhttp.RateLimitPerRoute_OVERRIDE:
		if len(r.GetRoute().GetRateLimits()) == 0 {
			out = append(out, stage(vh.GetRateLimits())...)
		}
	}
	return out
}

// descriptorsFor is Envoy's descriptor generation for one request: each
// RateLimit entry yields one descriptor whose entries its actions append in
// order, or none when an action cannot produce its entry.
func descriptorsFor(t testing.TB, ps []*routev3.RateLimit, req httpRequest) []*rlcommon.RateLimitDescriptor {
	t.Helper()
	var out []*rlcommon.RateLimitDescriptor
	for _, p := range ps {
		if p.GetLimit() != nil || p.GetApplyOnStreamDone() || p.GetDisableKey() != "" {
			t.Fatalf("rate limit %v: limit, apply_on_stream_done and disable_key are not simulated", p)
		}
		d := &rlcommon.RateLimitDescriptor{}
		ok := true
		for _, a := range p.GetActions() {
			e, produced := action(t, a, req)
			if !produced {
				ok = false
				break
			}
			if e != nil {
				d.Entries = append(d.Entries, e)
			}
		}
		if !ok || len(d.Entries) == 0 {
			continue
		}
		if h := p.GetHitsAddend(); h != nil {
			if h.GetFormat() != "" {
				t.Fatal("hits_addend.format is not simulated")
			}
			d.HitsAddend = wrapperspb.UInt64(h.GetNumber().GetValue())
		}
		out = append(out, d)
	}
	return out
}

// action returns the entry one action appends; produced is false when the
// action cannot produce it (the whole descriptor is then dropped). A nil
// entry with produced true is a skipped action (skip_if_absent).
func action(t testing.TB, a *routev3.RateLimit_Action, req httpRequest) (e *rlcommon.RateLimitDescriptor_Entry, produced bool) {
	t.Helper()
	entry := func(k, v string) *rlcommon.RateLimitDescriptor_Entry {
		return &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	switch x := a.GetActionSpecifier().(type) {
	case *routev3.RateLimit_Action_RequestHeaders_:
		v, ok := req.header(x.RequestHeaders.GetHeaderName())
		if !ok {
			return nil, x.RequestHeaders.GetSkipIfAbsent()
		}
		return entry(x.RequestHeaders.GetDescriptorKey(), v), true
	case *routev3.RateLimit_Action_GenericKey_:
		key := x.GenericKey.GetDescriptorKey()
		if key == "" {
			key = "generic_key"
		}
		return entry(key, x.GenericKey.GetDescriptorValue()), true
	case *routev3.RateLimit_Action_HeaderValueMatch_:
		m := x.HeaderValueMatch
		if m.GetDefaultValue() != "" {
			t.Fatal("header_value_match.default_value is not simulated")
		}
		expect := m.GetExpectMatch() == nil || m.GetExpectMatch().GetValue()
		if matchHeaders(t, m.GetHeaders(), req) != expect {
			return nil, false
		}
		key := m.GetDescriptorKey()
		if key == "" {
			key = "header_match"
		}
		return entry(key, m.GetDescriptorValue()), true
	case *routev3.RateLimit_Action_RemoteAddress_:
		ip, err := netip.ParseAddr(req.client)
		if err != nil {
			return nil, false // not an IP address (a pipe): no entry
		}
		return entry("remote_address", ip.String()), true
	default:
		t.Fatalf("action %T is not simulated", x)
		return nil, false
	}
}

// matchHeaders is true when every matcher matches (Envoy's
// HeaderUtility::matchHeaders), for the matcher kinds simulated here.
func matchHeaders(t testing.TB, ms []*routev3.HeaderMatcher, req httpRequest) bool {
	t.Helper()
	for _, m := range ms {
		v, present := req.header(m.GetName())
		if !present && m.GetTreatMissingHeaderAsEmpty() {
			v, present = "", true
		}
		var match bool
		switch s := m.GetHeaderMatchSpecifier().(type) {
		case *routev3.HeaderMatcher_PresentMatch:
			match = present == s.PresentMatch
			if m.GetInvertMatch() {
				match = !match
			}
			if !match {
				return false
			}
			continue
		case *routev3.HeaderMatcher_StringMatch:
			match = present && stringMatch(t, s.StringMatch, v)
		case *routev3.HeaderMatcher_ExactMatch:
			//lint:ignore SA1019 Envoy still honours the deprecated field, so the test models it
			match = present && v == s.ExactMatch
		case *routev3.HeaderMatcher_PrefixMatch:
			//lint:ignore SA1019 Envoy still honours the deprecated field, so the test models it
			match = present && strings.HasPrefix(v, s.PrefixMatch)
		case *routev3.HeaderMatcher_SafeRegexMatch:
			//lint:ignore SA1019 Envoy still honours the deprecated field, so the test models it
			match = present && regexp.MustCompile("^(?:"+s.SafeRegexMatch.GetRegex()+")$").MatchString(v)
		default:
			t.Fatalf("header matcher %T is not simulated", s)
		}
		if !present { // an absent header never matches, inverted or not
			return false
		}
		if match == m.GetInvertMatch() {
			return false
		}
	}
	return true
}

func stringMatch(t testing.TB, m *matcherv3.StringMatcher, v string) bool {
	t.Helper()
	fold := func(s string) string {
		if m.GetIgnoreCase() {
			return strings.ToLower(s)
		}
		return s
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return fold(v) == fold(p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(fold(v), fold(p.Prefix))
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(fold(v), fold(p.Suffix))
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(fold(v), fold(p.Contains))
	case *matcherv3.StringMatcher_SafeRegex: // RE2, whole-string match
		return regexp.MustCompile("^(?:" + p.SafeRegex.GetRegex() + ")$").MatchString(v)
	default:
		t.Fatalf("string matcher %T is not simulated", p)
		return false
	}
}

// envoyDescriptors is the whole simulation: the descriptors envoy.yaml makes
// Envoy send for req (nil: Envoy makes no rate limit call).
func envoyDescriptors(t testing.TB, req httpRequest) []*rlcommon.RateLimitDescriptor {
	t.Helper()
	filter, rc := frontProxy(t)
	vh := rc.GetVirtualHosts()[0]
	r := matchRoute(t, vh, req)
	if r == nil {
		t.Fatalf("no route for %s", req.path)
	}
	return descriptorsFor(t, policies(t, filter, vh, r), req)
}

// showDescriptors renders descriptors as "(k=v,k=v)+hits" for messages.
func showDescriptors(ds []*rlcommon.RateLimitDescriptor) string {
	var parts []string
	for _, d := range ds {
		var es []string
		for _, e := range d.GetEntries() {
			es = append(es, e.GetKey()+"="+e.GetValue())
		}
		s := "(" + strings.Join(es, ",") + ")"
		if d.GetHitsAddend() != nil {
			s += fmt.Sprintf("+%d", d.GetHitsAddend().GetValue())
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// TestEnvoyActionSemantics pins the simulator on synthetic actions, so the
// table below rests on Envoy's documented behaviour and not on itself.
func TestEnvoyActionSemantics(t *testing.T) {
	light(t)
	req := httpRequest{path: "/v1/items/42?x=1", headers: map[string]string{"X-Api-Key": "k1", "x-tier": "gold"}, client: "192.0.2.7"}
	parse := func(text string) []*routev3.RateLimit {
		vh := &routev3.VirtualHost{}
		if err := prototext.Unmarshal([]byte(text), vh); err != nil {
			t.Fatal(err)
		}
		return vh.GetRateLimits()
	}
	for _, tc := range []struct{ name, rateLimits, want string }{
		{"request_headers, case-insensitive name", `rate_limits { actions { request_headers { header_name: "x-api-key" descriptor_key: "api_key" } } }`, "(api_key=k1)"},
		{"request_headers missing: descriptor dropped", `rate_limits { actions { remote_address {} } actions { request_headers { header_name: "x-nope" descriptor_key: "n" } } }`, ""},
		{"request_headers missing, skip_if_absent: entry skipped", `rate_limits { actions { remote_address {} } actions { request_headers { header_name: "x-nope" descriptor_key: "n" skip_if_absent: true } } }`, "(remote_address=192.0.2.7)"},
		{":path keeps the query", `rate_limits { actions { request_headers { header_name: ":path" descriptor_key: "p" } } }`, "(p=/v1/items/42?x=1)"},
		{"generic_key default key", `rate_limits { actions { generic_key { descriptor_value: "v" } } }`, "(generic_key=v)"},
		{"header_value_match default key", `rate_limits { actions { header_value_match { descriptor_value: "gold" headers { name: "x-tier" string_match { exact: "gold" } } } } }`, "(header_match=gold)"},
		{"header_value_match no match: dropped", `rate_limits { actions { header_value_match { descriptor_value: "v" headers { name: ":path" string_match { prefix: "/v2/" } } } } }`, ""},
		{"header_value_match expect_match false", `rate_limits { actions { header_value_match { descriptor_key: "not_v2" descriptor_value: "y" expect_match { value: false } headers { name: ":path" string_match { prefix: "/v2/" } } } } }`, "(not_v2=y)"},
		{"header_value_match safe_regex and AND of headers", `rate_limits { actions { header_value_match { descriptor_value: "r" headers { name: ":path" string_match { safe_regex { regex: "/v1/items/[0-9]+.*" } } } headers { name: "x-tier" present_match: true } } } }`, "(header_match=r)"},
		{"header_value_match absent header never matches", `rate_limits { actions { header_value_match { descriptor_value: "r" headers { name: "x-nope" string_match { exact: "a" } invert_match: true } } } }`, ""},
		{"hits_addend", `rate_limits { actions { generic_key { descriptor_value: "v" } } hits_addend { number { value: 7 } } }`, "(generic_key=v)+7"},
		{"one descriptor per entry, in order", `rate_limits { actions { remote_address {} } } rate_limits { actions { generic_key { descriptor_key: "a" descriptor_value: "b" } } actions { request_headers { header_name: "x-tier" descriptor_key: "tier" } } }`, "(remote_address=192.0.2.7) (a=b,tier=gold)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := showDescriptors(descriptorsFor(t, parse(tc.rateLimits), req)); got != tc.want {
				t.Errorf("descriptors %q, want %q", got, tc.want)
			}
		})
	}
	v6 := req
	v6.client = "2001:db8::1"
	if got := showDescriptors(descriptorsFor(t, parse(`rate_limits { actions { remote_address {} } }`), v6)); got != "(remote_address=2001:db8::1)" {
		t.Errorf("IPv6 remote_address: %q", got)
	}

	// Precedence of per-route, route and virtual-host rate limits.
	vh := &routev3.VirtualHost{}
	if err := prototext.Unmarshal([]byte(`rate_limits { actions { generic_key { descriptor_value: "vh" } } }`), vh); err != nil {
		t.Fatal(err)
	}
	routeWith := func(routeRL string, pr *rlhttp.RateLimitPerRoute) *routev3.Route {
		r := &routev3.Route{}
		if err := prototext.Unmarshal([]byte(`route { cluster: "c" `+routeRL+` }`), r); err != nil {
			t.Fatal(err)
		}
		if pr != nil {
			a, err := anypb.New(pr)
			if err != nil {
				t.Fatal(err)
			}
			r.TypedPerFilterConfig = map[string]*anypb.Any{rlFilter: a}
		}
		return r
	}
	routeRL := `rate_limits { actions { generic_key { descriptor_value: "route" } } }`
	perRouteRL := parse(`rate_limits { actions { generic_key { descriptor_value: "per-route" } } }`)
	filter := &rlhttp.RateLimit{Domain: "d"}
	for _, tc := range []struct {
		name string
		r    *routev3.Route
		want string
	}{
		{"route without limits: the virtual host's", routeWith("", nil), "(generic_key=vh)"},
		{"route limits override the virtual host's", routeWith(routeRL, nil), "(generic_key=route)"},
		{"INCLUDE: route then virtual host", routeWith(routeRL, &rlhttp.RateLimitPerRoute{VhRateLimits: rlhttp.RateLimitPerRoute_INCLUDE}), "(generic_key=route) (generic_key=vh)"},
		{"IGNORE", routeWith("", &rlhttp.RateLimitPerRoute{VhRateLimits: rlhttp.RateLimitPerRoute_IGNORE}), ""},
		{"per-route rate_limits replace both", routeWith(routeRL, &rlhttp.RateLimitPerRoute{VhRateLimits: rlhttp.RateLimitPerRoute_INCLUDE, RateLimits: perRouteRL}), "(generic_key=per-route)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := showDescriptors(descriptorsFor(t, policies(t, filter, vh, tc.r), req)); got != tc.want {
				t.Errorf("descriptors %q, want %q", got, tc.want)
			}
		})
	}
}

// envoyCase is one sample request sent calls times through the simulated
// Envoy to rls.
type envoyCase struct {
	name string
	req  httpRequest
	want string // the descriptors envoy.yaml produces (showDescriptors)
	// limits are the current_limit names rls reports, one per descriptor
	// ("" for a descriptor no rule limits).
	limits  []string
	okCalls int // calls that must all be OK overall
	// over: after okCalls, OVER_LIMIT must come within 1+slack more calls,
	// with the status of descriptor overIdx OVER_LIMIT.
	over           bool
	slack, overIdx int
	// refill is the over limit's refill a second (a token bucket): each
	// second the calls take allows that many more before OVER_LIMIT.
	refill float64
	// shadowIdx >= 0: that status (a shadow_mode rule) has nothing left
	// after okCalls, yet it and the overall code stay OK.
	shadowIdx int
}

func envoyCases() []envoyCase {
	key := func(k string) map[string]string { return map[string]string{"x-api-key": k} }
	return []envoyCase{
		{name: "no api key: only the client address", shadowIdx: -1,
			req:  httpRequest{path: "/v1/orders", client: "10.0.0.1"},
			want: "(remote_address=10.0.0.1)", limits: []string{"per-ip"}, okCalls: 3},
		{name: "demo key on any route: 3 a minute", shadowIdx: -1,
			req:    httpRequest{path: "/v1/orders", headers: map[string]string{"X-API-Key": "demo"}, client: "10.0.0.2"},
			want:   "(api_key=demo,route=/v1/orders) (remote_address=10.0.0.2) (api_key=demo)",
			limits: []string{"", "per-ip", "demo"}, okCalls: 3, over: true, overIdx: 2},
		{name: "route from :path keeps the query", shadowIdx: -1,
			req:    httpRequest{path: "/v1/orders?page=2", headers: key("k-orders"), client: "10.0.0.3"},
			want:   "(api_key=k-orders,route=/v1/orders?page=2) (remote_address=10.0.0.3) (api_key=k-orders)",
			limits: []string{"per-route", "per-ip", "per-api-key"}, okCalls: 5},
		{name: "generic_key route: search token bucket", shadowIdx: -1,
			req:    httpRequest{path: "/v1/search?q=envoy", headers: key("k-search"), client: "10.0.0.4"},
			want:   "(api_key=k-search,route=/v1/search) (remote_address=10.0.0.4) (api_key=k-search)",
			limits: []string{"search", "per-ip", "per-api-key"}, okCalls: 10, over: true, slack: 3, overIdx: 0, refill: 5},
		{name: "header_value_match route: admin wildcard", shadowIdx: -1,
			req:    httpRequest{path: "/v1/admin/users/7", headers: key("k-admin"), client: "2001:db8::5"},
			want:   "(api_key=k-admin,route=/v1/admin/) (remote_address=2001:db8::5) (api_key=k-admin)",
			limits: []string{"admin", "per-ip", "per-api-key"}, okCalls: 3},
		{name: "hits_addend: an export costs 10 of 100 a minute", shadowIdx: -1,
			req:    httpRequest{path: "/v1/export", headers: key("k-export"), client: "10.0.0.6"},
			want:   "(remote_address=10.0.0.6) (api_key=k-export)+10",
			limits: []string{"per-ip", "per-api-key"}, okCalls: 10, over: true, overIdx: 1},
		{name: "unlimited key", shadowIdx: -1,
			req:    httpRequest{path: "/v1/orders", headers: key("internal-batch-job"), client: "10.0.0.7"},
			want:   "(api_key=internal-batch-job,route=/v1/orders) (remote_address=10.0.0.7) (api_key=internal-batch-job)",
			limits: []string{"", "per-ip", ""}, okCalls: 30},
		{name: "login: shadow mode never enforced",
			req:    httpRequest{path: "/login", client: "10.0.0.8"},
			want:   "(generic_key=login) (remote_address=10.0.0.8)",
			limits: []string{"login-trial", "per-ip"}, okCalls: 10, shadowIdx: 0},
		{name: "healthz: no descriptors, no call", shadowIdx: -1,
			req: httpRequest{path: "/healthz", headers: key("k-health"), client: "10.0.0.9"}, want: ""},
	}
}

// TestEnvoyRouteActions drives the sample requests (and envoy-tcp.yaml's
// static descriptors) against rls on the memory store and on Redis.
func TestEnvoyRouteActions(t *testing.T) {
	light(t)
	filter, _ := frontProxy(t)
	tcp := &rlnet.RateLimit{}
	if err := loadBootstrap(t, "../envoy/envoy-tcp.yaml").GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(tcp); err != nil {
		t.Fatal(err)
	}
	cases := envoyCases()
	// The descriptors first: no rls needed, and a mismatch is clearer alone.
	for _, tc := range cases {
		if got := showDescriptors(envoyDescriptors(t, tc.req)); got != tc.want {
			t.Errorf("%s: envoy.yaml makes Envoy send %q, want %q", tc.name, got, tc.want)
		}
	}
	if t.Failed() {
		return
	}
	backends := map[string]func(t *testing.T) []string{
		"memory": func(t *testing.T) []string { return nil },
		"redis": func(t *testing.T) []string {
			srv := redistest.StartServer(t)
			return []string{"--store", "redis", "--redis-url", "redis://" + srv.Addr}
		},
	}
	for _, name := range []string{"memory", "redis"} {
		t.Run(name, func(t *testing.T) {
			p := startRLS(t, "../config", backends[name](t)...)
			c := p.client()
			// envoy-tcp.yaml's network filter: static descriptors, one call
			// per new connection.
			t.Run("tcp_connection", func(t *testing.T) {
				r := should(t, c, tcp.GetDomain(), tcp.GetDescriptors()...)
				if r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					t.Fatalf("%v", r)
				}
				checkLimits(t, r, []string{"tcp-connections"})
			})
			for _, tc := range cases {
				t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
					ds := envoyDescriptors(t, tc.req)
					if len(ds) == 0 {
						return // Envoy does not call the rate limit service
					}
					began := time.Now()
					for i := 0; i < tc.okCalls; i++ {
						r := should(t, c, filter.GetDomain(), ds...)
						if r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
							t.Fatalf("call %d: %v, want OK", i+1, r)
						}
						checkLimits(t, r, tc.limits)
						if tc.shadowIdx >= 0 && r.GetStatuses()[tc.shadowIdx].GetCode() != rlsv3.RateLimitResponse_OK {
							t.Fatalf("call %d: shadow status %v before its limit", i+1, r.GetStatuses()[tc.shadowIdx])
						}
					}
					if tc.shadowIdx >= 0 {
						r := should(t, c, filter.GetDomain(), ds...)
						// Like envoyproxy/ratelimit, a shadow limit past its budget
						// answers OK with nothing remaining.
						if st := r.GetStatuses()[tc.shadowIdx]; r.GetOverallCode() != rlsv3.RateLimitResponse_OK ||
							st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 0 {
							t.Fatalf("past the shadow limit: %v, want OK with status %d's limit_remaining 0", r, tc.shadowIdx)
						}
					}
					if !tc.over {
						return
					}
					for i := 0; ; i++ {
						r := should(t, c, filter.GetDomain(), ds...)
						if r.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
							checkLimits(t, r, tc.limits)
							if st := r.GetStatuses()[tc.overIdx]; st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetDurationUntilReset().AsDuration() <= 0 {
								t.Errorf("OVER_LIMIT but status %d is %v", tc.overIdx, st)
							}
							break
						}
						if i >= tc.slack+int(tc.refill*time.Since(began).Seconds()) {
							t.Fatalf("still %v after %d calls, want OVER_LIMIT", r, tc.okCalls+i+1)
						}
					}
				})
			}
		})
	}
}

// checkLimits compares the statuses' current_limit names with want.
func checkLimits(t testing.TB, r *rlsv3.RateLimitResponse, want []string) {
	t.Helper()
	var got []string
	for _, st := range r.GetStatuses() {
		got = append(got, st.GetCurrentLimit().GetName())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("limits %q, want %q (response %v)", got, want, r)
	}
}
