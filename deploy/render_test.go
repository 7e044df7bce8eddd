package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "helm/rls"

// release is one rendering of the chart: every object, decoded.
type release struct {
	name, namespace string
	objects         []object
	notes           string
}

// object is one rendered manifest: where it came from, its kind and name,
// and its value as the Kubernetes type of its kind.
type object struct {
	source, kind, name, namespace string
	value                         any
}

// render renders the chart as `helm install NAME chartDir -n NAMESPACE -f
// FILE... ` would, with set merged last (like --set), in strict mode (a
// template reading a value that does not exist is an error).
func render(t *testing.T, name, namespace string, files []string, set map[string]any) (*release, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	user := map[string]any{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		user = mergeValues(user, v)
	}
	user = mergeValues(user, set)
	top, err := chartutil.ToRenderValues(ch, user, chartutil.ReleaseOptions{
		Name: name, Namespace: namespace, Revision: 1, IsInstall: true,
	}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	out, err := engine.Engine{Strict: true}.Render(ch, top)
	if err != nil {
		return nil, err
	}
	r := &release{name: name, namespace: namespace}
	var sources []string
	for s := range out {
		sources = append(sources, s)
	}
	sort.Strings(sources)
	for _, src := range sources {
		if strings.HasSuffix(src, "NOTES.txt") {
			r.notes = out[src]
			continue
		}
		for i, doc := range splitYAML(out[src]) {
			o, err := decode(doc)
			if err != nil {
				t.Fatalf("%s (document %d): %v\n%s", src, i, err, doc)
			}
			o.source = src
			r.objects = append(r.objects, o)
		}
	}
	return r, nil
}

// mustRender renders and fails the test on a template error.
func mustRender(t *testing.T, files []string, set map[string]any) *release {
	t.Helper()
	r, err := render(t, "rls", "rls", files, set)
	if err != nil {
		t.Fatalf("render %v %v: %v", files, set, err)
	}
	return r
}

// mergeValues merges b into a as helm merges -f files and --set: maps
// deeply, anything else replaced.
func mergeValues(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if bm, ok := v.(map[string]any); ok {
			if am, ok := out[k].(map[string]any); ok {
				out[k] = mergeValues(am, bm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// splitYAML splits a rendered template into its non-empty documents.
func splitYAML(s string) []string {
	var docs []string
	for _, d := range docSep.Split(s, -1) {
		var v any
		if err := yaml.Unmarshal([]byte(d), &v); err == nil && v == nil {
			continue // only comments or blank
		}
		docs = append(docs, d)
	}
	return docs
}

// kinds maps each apiVersion/kind the chart may render to its Go type. A
// kind not listed here fails the test: add it with its type.
var kinds = map[string]func() any{
	"v1/ConfigMap":                           func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                              func() any { return &corev1.Secret{} },
	"v1/Service":                             func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                      func() any { return &corev1.ServiceAccount{} },
	"apps/v1/Deployment":                     func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget":          func() any { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler": func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"networking.k8s.io/v1/NetworkPolicy":     func() any { return &networkingv1.NetworkPolicy{} },
	// Prometheus Operator's kinds are not in k8s.io/api: local types below.
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &serviceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &prometheusRule{} },
}

// decode decodes one manifest into the type of its kind with unknown fields
// rejected (sigs.k8s.io/yaml's strict mode: YAML to JSON, then
// encoding/json with DisallowUnknownFields, and no duplicate keys).
func decode(doc string) (object, error) {
	var tm struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        metav1.ObjectMeta `json:"metadata"`
	}
	if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
		return object{}, err
	}
	newV, ok := kinds[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return object{}, fmt.Errorf("apiVersion %q kind %q: not a kind the test knows", tm.APIVersion, tm.Kind)
	}
	v := newV()
	if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
		return object{}, fmt.Errorf("%s %s: %v", tm.Kind, tm.Metadata.Name, err)
	}
	if tm.Metadata.Name == "" {
		return object{}, fmt.Errorf("%s without a name", tm.Kind)
	}
	return object{kind: tm.Kind, name: tm.Metadata.Name, namespace: tm.Metadata.Namespace, value: v}, nil
}

// all returns the objects of type T.
func all[T any](r *release) []T {
	var out []T
	for _, o := range r.objects {
		if v, ok := o.value.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// one returns the only object of type T, failing when there is not one.
func one[T any](t *testing.T, r *release) T {
	t.Helper()
	vs := all[T](r)
	if len(vs) != 1 {
		var zero T
		t.Fatalf("want one %T, rendered %d", zero, len(vs))
	}
	return vs[0]
}

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor
// the chart uses; strict decoding rejects any other field, so a field the
// chart adds must be added here, spelled as the Operator's CRD spells it.
type serviceMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// prometheusRule is monitoring.coreos.com/v1 PrometheusRule (its spec is a
// Prometheus rule file).
type prometheusRule struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            ruleFile          `json:"spec"`
}

type ruleFile struct {
	Groups []struct {
		Name     string            `json:"name"`
		Interval string            `json:"interval,omitempty"`
		Labels   map[string]string `json:"labels,omitempty"`
		Rules    []struct {
			Alert         string            `json:"alert,omitempty"`
			Record        string            `json:"record,omitempty"`
			Expr          string            `json:"expr"`
			For           string            `json:"for,omitempty"`
			KeepFiringFor string            `json:"keep_firing_for,omitempty"`
			Labels        map[string]string `json:"labels,omitempty"`
			Annotations   map[string]string `json:"annotations,omitempty"`
		} `json:"rules"`
	} `json:"groups"`
}

// The rls binary, built once for the package's tests (TestMain).
var rlsBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rls-deploy-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rlsBin = filepath.Join(dir, "rls")
	build := exec.Command("go", "build", "-o", rlsBin, "./cmd/rls")
	build.Dir = ".." // rls's own module
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./cmd/rls: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runRLS runs the rls binary with exactly this environment.
func runRLS(env []string, args ...string) (stdout, stderr string, err error) {
	cmd := exec.Command(rlsBin, args...)
	cmd.Env = env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// dockerEntrypoint returns the Dockerfile's ENTRYPOINT (exec form) and the
// path the binary is copied to in the final stage.
func dockerEntrypoint(t *testing.T) (entrypoint []string, binary string) {
	t.Helper()
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "ENTRYPOINT "); ok {
			if err := json.Unmarshal([]byte(rest), &entrypoint); err != nil {
				t.Fatalf("Dockerfile ENTRYPOINT %s: %v (want the exec form)", rest, err)
			}
		}
		if f := strings.Fields(line); len(f) == 4 && f[0] == "COPY" && f[1] == "--from=build" && strings.HasSuffix(f[2], "/rls") {
			binary = f[3]
		}
	}
	if len(entrypoint) == 0 || binary == "" {
		t.Fatalf("Dockerfile: ENTRYPOINT %v, rls copied to %q: want both", entrypoint, binary)
	}
	return entrypoint, binary
}
