package envoy_test

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlqshttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	rlhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rlnet "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ratelimit/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"gopkg.in/yaml.v3"

	"github.com/rls-project/rls/envoy"
)

// envoyFiles are the Envoy bootstrap files in this directory.
func envoyFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"envoy.yaml", "envoy-tcp.yaml"} {
		if !slices.Contains(files, want) {
			t.Fatalf("%s missing from envoy/ (found %v)", want, files)
		}
	}
	return files
}

func load(t *testing.T, file string) *bootstrapv3.Bootstrap {
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

// TestBootstrapFilesValid: every Envoy YAML in envoy/ decodes into Envoy's
// Bootstrap with no unknown field, every typed_config resolves, and
// protoc-gen-validate's rules hold on the bootstrap and every packed message.
func TestBootstrapFilesValid(t *testing.T) {
	for _, f := range envoyFiles(t) {
		t.Run(f, func(t *testing.T) {
			b := load(t, f)
			rls := cluster(t, b, "rls")
			checkRLSCluster(t, rls)
		})
	}
}

func cluster(t *testing.T, b *bootstrapv3.Bootstrap, name string) *clusterv3.Cluster {
	t.Helper()
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == name {
			return c
		}
	}
	t.Fatalf("no cluster %q", name)
	return nil
}

// checkRLSCluster: gRPC needs HTTP/2, and Envoy health-checks rls with
// grpc.health.v1 on the RateLimitService name rls answers for.
func checkRLSCluster(t *testing.T, c *clusterv3.Cluster) {
	t.Helper()
	a, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if !ok {
		t.Fatal("rls cluster: no HttpProtocolOptions")
	}
	po := &upstreamhttpv3.HttpProtocolOptions{}
	if err := a.UnmarshalTo(po); err != nil {
		t.Fatal(err)
	}
	if po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Error("rls cluster does not speak HTTP/2")
	}
	if len(c.GetHealthChecks()) == 0 || c.GetHealthChecks()[0].GetGrpcHealthCheck() == nil {
		t.Fatal("rls cluster has no gRPC health check")
	}
	if s := c.GetHealthChecks()[0].GetGrpcHealthCheck().GetServiceName(); s != "envoy.service.ratelimit.v3.RateLimitService" {
		t.Errorf("gRPC health check service %q", s)
	}
	ep := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	if ep.GetPortValue() != 8081 {
		t.Errorf("rls endpoint port %d, want 8081", ep.GetPortValue())
	}
}

// TestFrontProxyFilter pins what the front proxy needs of envoy.yaml's HTTP filter.
func TestFrontProxyFilter(t *testing.T) {
	b := load(t, "envoy.yaml")
	hcm := &hcmv3.HttpConnectionManager{}
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	var names []string
	var rl *rlhttp.RateLimit
	for _, f := range hcm.GetHttpFilters() {
		names = append(names, f.GetName())
		if f.GetName() == "envoy.filters.http.ratelimit" {
			rl = &rlhttp.RateLimit{}
			if err := f.GetTypedConfig().UnmarshalTo(rl); err != nil {
				t.Fatal(err)
			}
		}
	}
	if rl == nil || names[len(names)-1] != "envoy.filters.http.router" {
		t.Fatalf("http filters %v: want the rate limit filter and the router last", names)
	}
	if rl.GetDomain() != "example" || rl.GetFailureModeDeny() || rl.GetTimeout().AsDuration() != 20*time.Millisecond ||
		rl.GetEnableXRatelimitHeaders() != rlhttp.RateLimit_DRAFT_VERSION_03 ||
		rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName() != "rls" {
		t.Errorf("rate limit filter %v", rl)
	}
	// Each route's per-filter config is the filter's RateLimitPerRoute.
	for _, r := range hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes() {
		if a, ok := r.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"]; ok {
			if err := a.UnmarshalTo(&rlhttp.RateLimitPerRoute{}); err != nil {
				t.Errorf("route %v: %v", r.GetMatch(), err)
			}
		}
	}
}

// TestTCPProxyFilter pins envoy-tcp.yaml's network filter.
func TestTCPProxyFilter(t *testing.T) {
	b := load(t, "envoy-tcp.yaml")
	f := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0]
	rl := &rlnet.RateLimit{}
	if f.GetName() != "envoy.filters.network.ratelimit" {
		t.Fatalf("first network filter %q", f.GetName())
	}
	if err := f.GetTypedConfig().UnmarshalTo(rl); err != nil {
		t.Fatal(err)
	}
	if rl.GetDomain() != "example" || len(rl.GetDescriptors()) == 0 || rl.GetFailureModeDeny() {
		t.Errorf("network rate limit filter %v", rl)
	}
}

// TestIstioEnvoyFiltersValid: every EnvoyFilter patch value in istio/ is a
// valid Envoy message of the type its applyTo names, and the filter points at
// the Istio outbound cluster of the rls Service (deploy/chart_test.go checks
// that the chart with istio/values.yaml makes that Service).
func TestIstioEnvoyFiltersValid(t *testing.T) {
	files, err := filepath.Glob("istio/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var patches []envoy.EnvoyFilterPatch
	for _, f := range files {
		y, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := envoy.ValidateEnvoyFilters(y)
		if err != nil {
			t.Errorf("%s: %v", f, err)
		}
		patches = append(patches, ps...)
	}
	kinds := map[string]int{}
	for _, p := range patches {
		kinds[p.ApplyTo]++
		if p.ApplyTo == "HTTP_FILTER" {
			rl := &rlhttp.RateLimit{}
			if err := p.Value.(*hcmv3.HttpFilter).GetTypedConfig().UnmarshalTo(rl); err != nil {
				t.Fatal(err)
			}
			if rl.GetDomain() != "example" {
				t.Errorf("istio filter domain %q", rl.GetDomain())
			}
			if got, want := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(), "outbound|8081||rls.rls.svc.cluster.local"; got != want {
				t.Errorf("istio filter cluster %q, want %q (Service rls, namespace rls, port 8081)", got, want)
			}
		}
		if p.ApplyTo == "VIRTUAL_HOST" && len(p.Value.(*routev3.VirtualHost).GetRateLimits()) == 0 {
			t.Error("VIRTUAL_HOST patch sets no rate_limits")
		}
	}
	if kinds["HTTP_FILTER"] != 1 || kinds["VIRTUAL_HOST"] == 0 || kinds["HTTP_ROUTE"] == 0 {
		t.Errorf("patches by applyTo %v: want one HTTP_FILTER, VIRTUAL_HOST and HTTP_ROUTE", kinds)
	}
}

// k8sDocs decodes a multi-document manifest into generic maps.
func k8sDocs(t *testing.T, file string) []map[string]any {
	t.Helper()
	y, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var docs []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(y))
	for {
		var d map[string]any
		if err := dec.Decode(&d); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		docs = append(docs, d)
	}
	return docs
}

// get walks a generic YAML value by map keys and list indexes.
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// TestIstioManifests checks what envoy/istio/ applies besides the chart (the
// chart's objects with istio/values.yaml are checked by deploy/chart_test.go):
// the namespace with sidecar injection on, and the demo Redis.
func TestIstioManifests(t *testing.T) {
	byKind := map[string]map[string]any{}
	for _, f := range []string{"istio/namespace.yaml", "istio/redis.yaml"} {
		for _, d := range k8sDocs(t, f) {
			byKind[d["kind"].(string)+"/"+get(d, "metadata", "name").(string)] = d
		}
	}
	if get(byKind["Namespace/rls"], "metadata", "labels", "istio-injection") != "enabled" {
		t.Error("namespace rls without istio-injection: enabled (the gateway reaches rls over mTLS through its sidecar)")
	}
	if byKind["Service/redis"] == nil || byKind["Deployment/redis"] == nil {
		t.Error("no Redis Deployment and Service for the demo")
	}
	if get(byKind["Service/redis"], "spec", "ports", 0, "port") != 6379 {
		t.Error("the demo Redis Service does not listen on 6379")
	}
}

// TestValidatorCatchesMistakes feeds the validator broken copies of the
// shipped files: each must be rejected.
func TestValidatorCatchesMistakes(t *testing.T) {
	good, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	break1 := func(old, new string) []byte {
		t.Helper()
		if !bytes.Contains(good, []byte(old)) {
			t.Fatalf("envoy.yaml no longer contains %q", old)
		}
		return bytes.Replace(good, []byte(old), []byte(new), 1)
	}
	cases := []struct {
		name, wantErr string
		y             []byte
	}{
		{"unknown field in the filter", "failure_mode_denny",
			break1("failure_mode_deny: false", "failure_mode_denny: false")},
		{"unknown field in a route action", "descriptorkey",
			break1("descriptor_key: api_key", "descriptorkey: api_key")},
		{"wrong type URL", "RateLimitt",
			break1("type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit\n",
				"type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitt\n")},
		{"unknown enum name", "DRAFT_VERSION_3",
			break1("DRAFT_VERSION_03", "DRAFT_VERSION_3")},
		{"validation rule inside a typed_config (empty domain)", "Domain",
			break1("domain: example", `domain: ""`)},
		{"validation rule on a route action (empty descriptor_value)", "DescriptorValue",
			break1("descriptor_value: login", `descriptor_value: ""`)},
		{"validation rule in a per-route config (hits_addend over 1e9)", "Number",
			break1("hits_addend: { number: 10 }", "hits_addend: { number: 2000000000 }")},
		{"duplicate key", "already defined",
			break1("stat_prefix: front\n", "stat_prefix: front\n          stat_prefix: again\n")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := envoy.LoadBootstrap(tc.y)
			if err == nil {
				t.Fatal("accepted")
			}
			t.Logf("rejected: %v", err)
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not mention %q", err, tc.wantErr)
			}
		})
	}

	ef, err := os.ReadFile("istio/envoyfilter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, old, new, wantErr string }{
		{"EnvoyFilter: wrong type URL", "ratelimit.v3.RateLimit\n", "ratelimit.v3.RateLimitt\n", "RateLimitt"},
		{"EnvoyFilter: unknown field in a MERGE", "header_name: x-api-key", "header: x-api-key", "header"},
		{"EnvoyFilter: invalid value in a MERGE", "vh_rate_limits: INCLUDE", "vh_rate_limits: INCLUDED", "INCLUDED"},
		{"EnvoyFilter: validation rule in an INSERT", "domain: example", `domain: ""`, "Domain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !bytes.Contains(ef, []byte(tc.old)) {
				t.Fatalf("envoyfilter.yaml no longer contains %q", tc.old)
			}
			_, err := envoy.ValidateEnvoyFilters(bytes.Replace(ef, []byte(tc.old), []byte(tc.new), 1))
			if err == nil {
				t.Fatal("accepted")
			}
			t.Logf("rejected: %v", err)
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not mention %q", err, tc.wantErr)
			}
		})
	}
}

// TestReadmeSnippets: the YAML that the README's "Use with Envoy" and
// "Kubernetes and Istio" sections, docs/envoy.md and docs/kubernetes.md show
// is cut from the files validated above or the chart's values files, so it
// cannot drift from them.
func TestReadmeSnippets(t *testing.T) {
	md, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(md)
	start := strings.Index(s, "\n## Use with Envoy\n")
	if start < 0 {
		t.Fatal(`README.md has no "## Use with Envoy" section`)
	}
	end := strings.Index(s[start+1:], "\n## Kubernetes and Istio\n")
	if end < 0 {
		t.Fatal(`README.md has no "## Kubernetes and Istio" section after "## Use with Envoy"`)
	}
	next := strings.Index(s[start+1+end+1:], "\n## ")
	if next < 0 {
		next = len(s) - (start + 1 + end + 1)
	}
	sections := s[start : start+1+end+1+next]
	for _, page := range []string{"../docs/envoy.md", "../docs/kubernetes.md"} {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		sections += "\n" + string(b)
	}
	var shipped []string
	for _, glob := range []string{"*.yaml", "istio/*.yaml", "../deploy/helm/rls/values*.yaml"} {
		files, _ := filepath.Glob(glob)
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			shipped = append(shipped, string(b))
		}
	}
	n := 0
	for _, block := range strings.Split(sections, "```yaml\n")[1:] {
		snippet, _, ok := strings.Cut(block, "```")
		if !ok {
			t.Fatal("unterminated yaml block in the README")
		}
		n++
		found := false
		for _, f := range shipped {
			if strings.Contains(f, snippet) {
				found = true
			}
		}
		if !found {
			t.Errorf("README yaml block is not a verbatim excerpt of envoy/*.yaml, envoy/istio/*.yaml or the chart's values files:\n%s", snippet)
		}
	}
	if n < 4 {
		t.Errorf("found %d yaml blocks in the README's Envoy and Kubernetes sections and docs/envoy.md, docs/kubernetes.md, want 4 or more", n)
	}
}

// TestDockerCompose: the compose file runs the validated envoy.yaml, whose
// rls cluster is the compose service rls, and rls uses the compose Redis;
// the Dockerfile builds a static binary that runs as non-root.
func TestDockerCompose(t *testing.T) {
	y, err := os.ReadFile("../docker-compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Image   string   `yaml:"image"`
			Build   any      `yaml:"build"`
			Command []string `yaml:"command"`
			Volumes []string `yaml:"volumes"`
			Ports   []string `yaml:"ports"`
			Depends []string `yaml:"depends_on"`
		} `yaml:"services"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(y))
	dec.KnownFields(true)
	if err := dec.Decode(&compose); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"envoy", "rls", "redis"} {
		if _, ok := compose.Services[name]; !ok {
			t.Fatalf("docker-compose.yaml has no service %q", name)
		}
	}
	for name, svc := range compose.Services {
		for _, v := range svc.Volumes {
			host, _, _ := strings.Cut(v, ":")
			if _, err := os.Stat(filepath.Join("..", host)); err != nil {
				t.Errorf("service %s mounts %s: %v", name, host, err)
			}
		}
	}
	if !slices.Contains(compose.Services["envoy"].Volumes, "./envoy/envoy.yaml:/etc/envoy/envoy.yaml:ro") {
		t.Errorf("envoy service does not mount envoy/envoy.yaml: %v", compose.Services["envoy"].Volumes)
	}
	rlsCmd := strings.Join(compose.Services["rls"].Command, " ")
	if !strings.Contains(rlsCmd, "--store redis --redis-url redis://redis:6379") {
		t.Errorf("rls command %q does not use the compose Redis", rlsCmd)
	}
	ep := cluster(t, load(t, "envoy.yaml"), "rls").GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	if ep.GetAddress() != "rls" {
		t.Errorf("envoy.yaml's rls cluster points at %q, not the compose service rls", ep.GetAddress())
	}

	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"FROM --platform=$BUILDPLATFORM golang:", "CGO_ENABLED=0", "FROM gcr.io/distroless/static", "USER nonroot", "EXPOSE 8080 8081", `ENTRYPOINT ["/usr/local/bin/rls", "serve"`} {
		if !strings.Contains(string(df), want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
}

// TestIstioInstallSteps: docs/kubernetes.md's Istio commands and the ones in
// istio/values.yaml's header are the same, and in an order that works: the
// namespace (with its injection label) before anything in it, the chart
// installed into that namespace with istio/values.yaml, then the
// EnvoyFilters; every file of istio/ is used and every file named exists.
func TestIstioInstallSteps(t *testing.T) {
	md, err := os.ReadFile("../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(md), "\n## Use with Istio\n")
	if !ok {
		t.Fatal(`docs/kubernetes.md has no "## Use with Istio" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, block, ok := strings.Cut(section, "```sh\n")
	if !ok {
		t.Fatal("the README's Istio section has no sh block")
	}
	block, _, _ = strings.Cut(block, "```")
	readme := installSteps(block)

	v, err := os.ReadFile("istio/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var header strings.Builder
	for _, line := range strings.Split(string(v), "\n") {
		if rest, ok := strings.CutPrefix(line, "#   "); ok {
			header.WriteString(rest + "\n")
		}
	}
	if got := installSteps(header.String()); !slices.Equal(got, readme) {
		t.Errorf("istio/values.yaml's header says\n%s\nthe README says\n%s", strings.Join(got, "\n"), strings.Join(readme, "\n"))
	}

	ns := ""
	for _, d := range k8sDocs(t, "istio/namespace.yaml") {
		ns = get(d, "metadata", "name").(string)
	}
	used := map[string]bool{}
	created := map[string]bool{"istio-system": true}
	installed := false
	for _, step := range readme {
		words := strings.Fields(step)
		switch {
		case len(words) > 2 && words[0] == "kubectl" && words[1] == "apply":
			var files []string
			for i, w := range words {
				if w == "-f" && i+1 < len(words) {
					files = append(files, words[i+1])
				}
			}
			for _, f := range files {
				used[f] = true
				docs := k8sDocs(t, filepath.Join("..", f))
				for _, d := range docs {
					if d["kind"] == "Namespace" {
						created[get(d, "metadata", "name").(string)] = true
					}
				}
				for _, d := range docs {
					if n, _ := get(d, "metadata", "namespace").(string); n != "" && !created[n] {
						t.Errorf("%q: %s %v goes into namespace %q before it is created", step, d["kind"], get(d, "metadata", "name"), n)
					}
					if d["kind"] == "EnvoyFilter" && !installed {
						t.Errorf("%q: the EnvoyFilter is applied before rls is installed", step)
					}
				}
			}
		case len(words) > 3 && words[0] == "helm" && words[1] == "install":
			if _, err := os.Stat(filepath.Join("..", words[3], "Chart.yaml")); err != nil {
				t.Errorf("%q: no chart at %s: %v", step, words[3], err)
			}
			i := slices.Index(words, "-n")
			if i < 0 || i+1 >= len(words) || words[i+1] != ns {
				t.Errorf("%q: want -n %s, the namespace of istio/namespace.yaml", step, ns)
			} else if !created[ns] {
				t.Errorf("%q: installs into %s before namespace.yaml creates it (helm's --create-namespace would not label it for injection)", step, ns)
			}
			i = slices.Index(words, "-f")
			if i < 0 || i+1 >= len(words) || words[i+1] != "envoy/istio/values.yaml" {
				t.Errorf("%q: want -f envoy/istio/values.yaml", step)
			}
			used["envoy/istio/values.yaml"] = true
			installed = true
		default:
			t.Errorf("unexpected install step %q", step)
		}
	}
	if !installed {
		t.Error("no helm install step")
	}
	files, _ := filepath.Glob("istio/*.yaml")
	for _, f := range files {
		if !used["envoy/"+f] {
			t.Errorf("envoy/%s is not used by any install step", f)
		}
	}
}

// installSteps returns the kubectl and helm commands of a shell snippet,
// one a line, with comments and continuation lines folded.
func installSteps(sh string) []string {
	var steps []string
	sh = strings.ReplaceAll(sh, "\\\n", " ")
	for _, line := range strings.Split(sh, "\n") {
		line, _, _ = strings.Cut(line, "#")
		line = strings.Join(strings.Fields(line), " ")
		if strings.HasPrefix(line, "kubectl apply") || strings.HasPrefix(line, "helm ") {
			steps = append(steps, line)
		}
	}
	return steps
}

// TestRLQSFilter pins envoy-rlqs.yaml's rate_limit_quota filter: it points
// at rls, in the example domain, and every bucket has the fallbacks
// docs/rlqs.md asks for (deny before the first assignment, a token bucket
// on expiry); the validator refuses the file without a bucket's required
// reporting_interval.
func TestRLQSFilter(t *testing.T) {
	b := load(t, "envoy-rlqs.yaml")
	hcm := &hcmv3.HttpConnectionManager{}
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	f := hcm.GetHttpFilters()[0]
	if f.GetName() != "envoy.filters.http.rate_limit_quota" {
		t.Fatalf("first HTTP filter %q", f.GetName())
	}
	cfg := &rlqshttp.RateLimitQuotaFilterConfig{}
	if err := f.GetTypedConfig().UnmarshalTo(cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.GetDomain() != "example" || cfg.GetRlqsServer().GetEnvoyGrpc().GetClusterName() != "rls" {
		t.Errorf("filter config %v", cfg)
	}
	ms := cfg.GetBucketMatchers().GetMatcherList().GetMatchers()
	if len(ms) != 2 {
		t.Fatalf("%d bucket matchers, want 2", len(ms))
	}
	for _, m := range ms {
		s := &rlqshttp.RateLimitQuotaBucketSettings{}
		if err := m.GetOnMatch().GetAction().GetTypedConfig().UnmarshalTo(s); err != nil {
			t.Fatal(err)
		}
		ids := s.GetBucketIdBuilder().GetBucketIdBuilder()
		if ids["api_key"].GetCustomValue() == nil || ids["route"] == nil {
			t.Errorf("bucket %s: BucketId %v, want api_key from a header and route", m.GetOnMatch().GetAction().GetName(), ids)
		}
		if s.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
			t.Errorf("bucket %s: no_assignment_behavior %v, want DENY_ALL", m.GetOnMatch().GetAction().GetName(), s.GetNoAssignmentBehavior())
		}
		tb := s.GetExpiredAssignmentBehavior().GetFallbackRateLimit().GetTokenBucket()
		if tb == nil || tb.GetTokensPerFill() == nil || tb.GetFillInterval().GetNanos() != 0 {
			t.Errorf("bucket %s: expired fallback %v, want a whole-second token bucket", m.GetOnMatch().GetAction().GetName(), tb)
		}
	}
	y, err := os.ReadFile("envoy-rlqs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(y), "reporting_interval: 5s", "", 1)
	if _, err := envoy.LoadBootstrap([]byte(bad)); err == nil || !strings.Contains(strings.ToLower(err.Error()), "reporting") {
		t.Errorf("without reporting_interval: %v, want a validation error naming it", err)
	}
}
