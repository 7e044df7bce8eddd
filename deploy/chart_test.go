package deploy

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// The values files the repository ships, each rendered and checked whole.
var shipped = []struct {
	name  string
	files []string
}{
	{"default values", nil},
	{"values-cluster.yaml", []string{chartDir + "/values-cluster.yaml"}},
	{"envoy/istio/values.yaml", []string{"../envoy/istio/values.yaml"}},
}

// TestShippedValues renders the chart with each shipped values file and
// checks the workload, its Service, PDB, autoscaler, monitoring objects and
// network policy against each other, then runs the container command it
// makes through the real rls binary.
func TestShippedValues(t *testing.T) {
	for _, s := range shipped {
		t.Run(s.name, func(t *testing.T) {
			r := mustRender(t, s.files, nil)
			checkRelease(t, r)
			out := dryRun(t, r)
			t.Logf("%s", out)
		})
	}
}

// TestDefaultValues: a plain `helm install` is one replica on the memory
// store serving config/example.yaml, with nothing that needs a CRD.
func TestDefaultValues(t *testing.T) {
	r := mustRender(t, nil, nil)
	dep := one[*appsv1.Deployment](t, r)
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
		t.Errorf("replicas %v, want 1 (store: memory counts per replica)", dep.Spec.Replicas)
	}
	if a := flagValue(containerCommand(t, dep), "store"); a != "memory" {
		t.Errorf("--store=%s, want memory", a)
	}
	cm := configMapOf(t, r, dep)
	want, err := os.ReadFile("../config/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(cm.Data) != 1 || cm.Data["example.yaml"] != string(want) {
		t.Errorf("the chart's example config is not config/example.yaml (keys %v): copy it into files/example.yaml again", keys(cm.Data))
	}
	for _, o := range r.objects {
		if slices.Contains([]string{"ServiceMonitor", "PrometheusRule", "NetworkPolicy", "HorizontalPodAutoscaler", "Secret"}, o.kind) {
			t.Errorf("default values render %s %s: optional objects must be off by default", o.kind, o.name)
		}
	}
	if dashboardConfigMap(t, r) != nil {
		t.Error("default values render the Grafana dashboard ConfigMap: optional objects must be off by default")
	}
	if !strings.Contains(r.notes, "rls.rls.svc:8081") {
		t.Errorf("NOTES.txt does not give the gRPC address:\n%s", r.notes)
	}
}

// TestClusterValues: values-cluster.yaml is Redis Cluster mode with the
// password from the named existing Secret, an autoscaled fleet whose least
// size is --min-fleet-size, and every optional object on.
func TestClusterValues(t *testing.T) {
	r := mustRender(t, []string{chartDir + "/values-cluster.yaml"}, nil)
	dep := one[*appsv1.Deployment](t, r)
	cmd := containerCommand(t, dep)
	if flagValue(cmd, "store") != "redis-cluster" {
		t.Errorf("command %v: want --store=redis-cluster", cmd)
	}
	hpa := one[*autoscalingv2.HorizontalPodAutoscaler](t, r)
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 2 {
		t.Errorf("HPA minReplicas %v: a Cluster fleet of fewer than 2", hpa.Spec.MinReplicas)
	}
	ref := envVar(t, dep, "RLS_REDIS_PASSWORD").ValueFrom
	if ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "redis-cluster" || ref.SecretKeyRef.Key != "redis-password" {
		t.Errorf("RLS_REDIS_PASSWORD %+v: want Secret redis-cluster's key redis-password", ref)
	}
	if len(all[*corev1.Secret](r)) != 0 {
		t.Error("the chart creates a Secret although values-cluster.yaml names an existing one")
	}
	for _, k := range []string{"ServiceMonitor", "PrometheusRule", "NetworkPolicy"} {
		if !slices.ContainsFunc(r.objects, func(o object) bool { return o.kind == k }) {
			t.Errorf("values-cluster.yaml renders no %s", k)
		}
	}
	dash := dashboardConfigMap(t, r)
	if dash == nil {
		t.Error("values-cluster.yaml renders no Grafana dashboard ConfigMap")
	}
	if out := dryRun(t, r); !strings.Contains(out, "store redis (cluster, redis://redis-cluster:6379)") {
		t.Errorf("rls serve --dry-run said %q: want the Cluster URL from the env", out)
	}
}

// TestIstioValues: envoy/istio/values.yaml makes the Service the
// EnvoyFilter's cluster names (whatever the release is called), in the
// namespace of envoy/istio/namespace.yaml, on the Redis of redis.yaml.
func TestIstioValues(t *testing.T) {
	ns := manifestName(t, "../envoy/istio/namespace.yaml", "Namespace")
	r, err := render(t, "ratelimit", ns, []string{"../envoy/istio/values.yaml"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	svc := one[*corev1.Service](t, r)
	var grpcPort int32
	for _, p := range svc.Spec.Ports {
		if strings.HasPrefix(p.Name, "grpc-") {
			grpcPort = p.Port
		}
	}
	ef, err := os.ReadFile("../envoy/istio/envoyfilter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	host := fmt.Sprintf("%s.%s.svc.cluster.local", svc.Name, r.namespace)
	for _, want := range []string{
		fmt.Sprintf("cluster_name: outbound|%d||%s\n", grpcPort, host),
		fmt.Sprintf("authority: %s\n", host),
	} {
		if !strings.Contains(string(ef), want) {
			t.Errorf("envoy/istio/envoyfilter.yaml lacks %q: the chart's Service is %s port %d", strings.TrimSpace(want), host, grpcPort)
		}
	}
	dep := one[*appsv1.Deployment](t, r)
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
		t.Errorf("replicas %v, want 2 or more sharing counters in Redis", dep.Spec.Replicas)
	}
	redisSvc := manifestName(t, "../envoy/istio/redis.yaml", "Service")
	u, err := url.Parse(envVar(t, dep, "RLS_REDIS_URL").Value)
	if err != nil || u.Hostname() != redisSvc || u.Port() != "6379" {
		t.Errorf("RLS_REDIS_URL %q (%v): want the demo Redis, Service %s port 6379", envVar(t, dep, "RLS_REDIS_URL").Value, err, redisSvc)
	}
	if cm := configMapOf(t, r, dep); !slices.Contains(keys(cm.Data), "example.yaml") {
		t.Errorf("the Istio rendering's config has %v, want example.yaml (domain example, as the EnvoyFilter sends)", keys(cm.Data))
	}
}

// TestRedisSecret: a chart-made Secret, an existing Secret's password key,
// and an existing Secret holding the whole URL each reach rls as RLS_* env
// (never as an argument), and rls accepts them.
func TestRedisSecret(t *testing.T) {
	redis := func(m map[string]any) map[string]any {
		return map[string]any{"store": "redis", "replicaCount": 3, "redis": m}
	}
	t.Run("chart-made", func(t *testing.T) {
		r := mustRender(t, nil, redis(map[string]any{"password": "s3cret"}))
		sec := one[*corev1.Secret](t, r)
		if string(sec.Data["password"]) != "s3cret" {
			t.Errorf("Secret %s data %v", sec.Name, sec.Data)
		}
		dep := one[*appsv1.Deployment](t, r)
		ref := envVar(t, dep, "RLS_REDIS_PASSWORD").ValueFrom
		if ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != sec.Name || ref.SecretKeyRef.Key != "password" {
			t.Errorf("RLS_REDIS_PASSWORD %+v: want Secret %s key password", ref, sec.Name)
		}
		if got := flagValue(containerCommand(t, dep), "min-fleet-size"); got != "3" {
			t.Errorf("--min-fleet-size=%s, want replicaCount 3", got)
		}
		checkRelease(t, r)
		dryRun(t, r)
	})
	t.Run("existing, URL in it", func(t *testing.T) {
		r := mustRender(t, nil, redis(map[string]any{"existingSecret": "my-redis", "existingSecretURLKey": "url", "existingSecretPasswordKey": ""}))
		dep := one[*appsv1.Deployment](t, r)
		ref := envVar(t, dep, "RLS_REDIS_URL").ValueFrom
		if ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "my-redis" || ref.SecretKeyRef.Key != "url" {
			t.Errorf("RLS_REDIS_URL %+v: want Secret my-redis key url", ref)
		}
		if slices.ContainsFunc(dep.Spec.Template.Spec.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == "RLS_REDIS_PASSWORD" }) {
			t.Error("RLS_REDIS_PASSWORD set although existingSecretPasswordKey is empty")
		}
		if len(all[*corev1.Secret](r)) != 0 {
			t.Error("the chart creates a Secret although an existing one is named")
		}
		checkRelease(t, r)
		if out := dryRun(t, r); !strings.Contains(out, "redis://placeholder:xxxxx@my-redis.example:6379") {
			t.Errorf("dry run %q: want the URL from the Secret (placeholder)", out)
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		url := "redis://sentinel:26379?master_name=mymaster&username=rls"
		r := mustRender(t, nil, redis(map[string]any{"mode": "sentinel", "url": url, "existingSecret": "s"}))
		dep := one[*appsv1.Deployment](t, r)
		if cmd := containerCommand(t, dep); flagValue(cmd, "store") != "redis-sentinel" || envVar(t, dep, "RLS_REDIS_URL").Value != url {
			t.Errorf("command %v, RLS_REDIS_URL %q: want --store=redis-sentinel and the URL with the master's name and user", cmd, envVar(t, dep, "RLS_REDIS_URL").Value)
		}
		checkRelease(t, r)
		dryRun(t, r)
	})
}

// TestGlobalLimitsValues: globalLimits gives rls --region and
// RLS_GLOBAL_REDIS_URL (from the value or an existing Secret), which
// rls serve --dry-run accepts and reports.
func TestGlobalLimitsValues(t *testing.T) {
	values := func(g map[string]any) map[string]any {
		return map[string]any{"store": "redis", "replicaCount": 3, "globalLimits": g}
	}
	t.Run("url", func(t *testing.T) {
		url := "redis://global:6379?mode=cluster&addr=global-2:6379&floor=0.2"
		r := mustRender(t, nil, values(map[string]any{"region": "eu-west-1", "url": url}))
		dep := one[*appsv1.Deployment](t, r)
		if cmd := containerCommand(t, dep); flagValue(cmd, "region") != "eu-west-1" || envVar(t, dep, "RLS_GLOBAL_REDIS_URL").Value != url {
			t.Errorf("command %v, RLS_GLOBAL_REDIS_URL %q: want --region=eu-west-1 and the URL", cmd, envVar(t, dep, "RLS_GLOBAL_REDIS_URL").Value)
		}
		checkRelease(t, r)
		if out := dryRun(t, r); !strings.Contains(out, "region eu-west-1, global store (cluster, redis://global:6379") {
			t.Errorf("rls serve --dry-run said %q: want the region and the global Cluster", out)
		}
	})
	t.Run("existing Secret", func(t *testing.T) {
		r := mustRender(t, nil, values(map[string]any{"region": "ap", "existingSecret": "global-redis"}))
		dep := one[*appsv1.Deployment](t, r)
		ref := envVar(t, dep, "RLS_GLOBAL_REDIS_URL").ValueFrom
		if ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "global-redis" || ref.SecretKeyRef.Key != "url" {
			t.Errorf("RLS_GLOBAL_REDIS_URL %+v: want Secret global-redis key url", ref)
		}
		checkRelease(t, r)
		if out := dryRun(t, r); !strings.Contains(out, "region ap, global store (single, redis://placeholder:xxxxx@global-redis.example:6379)") {
			t.Errorf("rls serve --dry-run said %q: want the URL from the Secret (placeholder)", out)
		}
	})
	t.Run("none", func(t *testing.T) {
		dep := one[*appsv1.Deployment](t, mustRender(t, nil, values(map[string]any{})))
		if cmd := containerCommand(t, dep); flagValue(cmd, "region") != "" || slices.ContainsFunc(dep.Spec.Template.Spec.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == "RLS_GLOBAL_REDIS_URL" }) {
			t.Errorf("command %v: a region or a global URL without globalLimits", cmd)
		}
	})
}

// TestDryRunCatchesBadValues: a value rls refuses fails the command check,
// so TestShippedValues' passing means something.
func TestDryRunCatchesBadValues(t *testing.T) {
	for name, set := range map[string]map[string]any{
		"redis mode":        {"store": "redis", "redis": map[string]any{"mode": "ring"}},
		"sentinel, no name": {"store": "redis", "redis": map[string]any{"mode": "sentinel"}},
		"log level":         {"logLevel": "verbose"},
		"unknown flag":      {"extraArgs": []any{"--redis-adress=x"}},
		"not a flag":        {"extraArgs": []any{"serve"}},
		"bad drain":         {"shutdownDrain": "5 seconds"},
		"global floor":      {"store": "redis", "globalLimits": map[string]any{"region": "eu", "url": "redis://g:6379?floor=0.9"}},
		"global region":     {"store": "redis", "globalLimits": map[string]any{"region": "eu west", "url": "redis://g:6379"}},
	} {
		t.Run(name, func(t *testing.T) {
			r := mustRender(t, nil, set)
			_, env := commandAndEnv(t, r)
			stdout, stderr, err := runRLS(env, append(commandArgs(t, r), "--dry-run")...)
			if err == nil {
				t.Fatalf("rls accepted it: %s", stdout)
			}
			t.Logf("refused: %s", strings.TrimSpace(stderr))
		})
	}
}

// TestChartRefuses: values that would deploy something other than what
// they say fail at render time, with a message naming the value: by the
// templates' checks, or by values.schema.json (a key the chart does not
// know, which helm would otherwise ignore).
func TestChartRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		set  map[string]any
		want string
	}{
		"memory store, 2 replicas":   {map[string]any{"replicaCount": 2}, "replicaCount 2 with store: memory"},
		"memory store, autoscaling":  {map[string]any{"autoscaling": map[string]any{"enabled": true}}, "autoscaling.enabled with store: memory"},
		"two passwords":              {map[string]any{"store": "redis", "redis": map[string]any{"existingSecret": "s", "password": "p"}}, "redis.existingSecret and redis.password"},
		"a config file rls skips":    {map[string]any{"config": map[string]any{"files": map[string]any{"limits.json": "{}"}}}, "config.files.limits.json"},
		"unknown store":              {map[string]any{"store": "etcd"}, "/store"},
		"a misspelt value":           {map[string]any{"replicaCont": 2}, "replicaCont"},
		"a misspelt nested value":    {map[string]any{"store": "redis", "redis": map[string]any{"existingsecret": "s"}}, "existingsecret"},
		"min over max":               {map[string]any{"store": "redis", "autoscaling": map[string]any{"enabled": true, "minReplicas": 5, "maxReplicas": 3}}, "minReplicas is more than"},
		"URL key, no existingSecret": {map[string]any{"store": "redis", "redis": map[string]any{"existingSecretURLKey": "url"}}, "existingSecretURLKey needs"},
		"global, memory store":       {map[string]any{"globalLimits": map[string]any{"region": "eu", "url": "redis://g:6379"}}, "globalLimits.region needs store: redis"},
		"global region, no URL":      {map[string]any{"store": "redis", "globalLimits": map[string]any{"region": "eu"}}, "globalLimits.region needs globalLimits.url"},
		"global URL, no region":      {map[string]any{"store": "redis", "globalLimits": map[string]any{"url": "redis://g:6379"}}, "needs globalLimits.region"},
		"global URL twice":           {map[string]any{"store": "redis", "globalLimits": map[string]any{"region": "eu", "url": "redis://g:6379", "existingSecret": "s"}}, "globalLimits.url and globalLimits.existingSecret"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := render(t, "rls", "rls", nil, tc.set)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render: %v; want an error with %q", err, tc.want)
			}
		})
	}
}

// TestConfigChangeRestartsNothing: changing the descriptor config changes
// the ConfigMap only. The pod template stays the same, so no rollout: the
// kubelet updates the mounted files and rls reloads them in place.
func TestConfigChangeRestartsNothing(t *testing.T) {
	set := map[string]any{"config": map[string]any{"files": map[string]any{"example.yaml": "domain: example\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"}}}
	a, b := mustRender(t, nil, nil), mustRender(t, nil, set)
	da, db := one[*appsv1.Deployment](t, a), one[*appsv1.Deployment](t, b)
	if !reflect.DeepEqual(da, db) {
		t.Error("a config change changes the Deployment (a rollout); rls reloads the mounted ConfigMap by itself")
	}
	if reflect.DeepEqual(configMapOf(t, a, da).Data, configMapOf(t, b, db).Data) {
		t.Error("the config change did not reach the ConfigMap")
	}
	validateConfig(t, configMapOf(t, b, db))
}

// checkRelease checks one rendering's objects against each other.
func checkRelease(t *testing.T, r *release) {
	t.Helper()
	for _, o := range r.objects {
		if o.namespace != r.namespace && !(o.kind == "ConfigMap" && strings.HasSuffix(o.name, "-dashboard")) {
			t.Errorf("%s %s in namespace %q, want the release's %q", o.kind, o.name, o.namespace, r.namespace)
		}
	}
	dep := one[*appsv1.Deployment](t, r)
	pod := dep.Spec.Template
	sel := selector(t, dep.Spec.Selector)
	if !sel.Matches(labels.Set(pod.Labels)) {
		t.Fatalf("Deployment selector %v does not match its pods' labels %v", sel, pod.Labels)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want rls alone", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	cmd := containerCommand(t, dep)

	// Ports: --grpc-addr and --http-addr are the named container ports.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	grpcPort, httpPort := ports["grpc"], ports["http-metrics"]
	if grpcPort == 0 || httpPort == 0 {
		t.Errorf("container ports %v: want grpc and http-metrics", ports)
	}
	if a := flagValue(cmd, "grpc-addr"); a != fmt.Sprintf(":%d", grpcPort) {
		t.Errorf("--grpc-addr=%s, container port grpc is %d", a, grpcPort)
	}
	if a := flagValue(cmd, "http-addr"); a != fmt.Sprintf(":%d", httpPort) {
		t.Errorf("--http-addr=%s, container port http-metrics is %d", a, httpPort)
	}

	// Probes: the kubelet's gRPC probes on the gRPC port; readiness on the
	// service that turns NOT_SERVING on SIGTERM.
	for name, p := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
		if p == nil || p.GRPC == nil || p.HTTPGet != nil || p.TCPSocket != nil || p.Exec != nil {
			t.Errorf("%s %+v: want a grpc probe", name, p)
			continue
		}
		if p.GRPC.Port != grpcPort {
			t.Errorf("%s on port %d, the gRPC port is %d", name, p.GRPC.Port, grpcPort)
		}
	}
	if p := c.ReadinessProbe; p != nil && p.GRPC != nil && (p.GRPC.Service == nil || *p.GRPC.Service != rlsHealthService(t)) {
		t.Errorf("readinessProbe asks for service %v, want %q (what rls reports NOT_SERVING while draining)", p.GRPC.Service, rlsHealthService(t))
	}
	// Liveness on the service that stays SERVING while rls waits for its
	// store: a replica started before Redis is not restarted in a loop.
	if p := c.LivenessProbe; p != nil && p.GRPC != nil && (p.GRPC.Service == nil || *p.GRPC.Service != "rls.live") {
		t.Errorf("livenessProbe asks for service %v, want rls.live", p.GRPC.Service)
	}

	// Security: non-root, read-only root file system, no capabilities.
	psc, sc := pod.Spec.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Error("pod securityContext.runAsNonRoot is not true")
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 ||
		(sc.Privileged != nil && *sc.Privileged) {
		t.Errorf("container securityContext %+v: want readOnlyRootFilesystem, no privilege escalation, drop ALL", sc)
	}
	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		t.Error("the pod mounts a service account token; rls never calls the API")
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("resource requests %v: want cpu and memory", c.Resources.Requests)
	}

	// Config: the ConfigMap mounted whole (no subPath) as --config-dir.
	checkConfigMount(t, r, dep, cmd)

	// Fleet: --min-fleet-size is the least number of replicas.
	hpas := all[*autoscalingv2.HorizontalPodAutoscaler](r)
	minReplicas := int32(0)
	switch {
	case len(hpas) == 1:
		h := hpas[0]
		if h.Spec.ScaleTargetRef.Kind != "Deployment" || h.Spec.ScaleTargetRef.Name != dep.Name || h.Spec.ScaleTargetRef.APIVersion != "apps/v1" {
			t.Errorf("HPA scales %+v, not Deployment %s", h.Spec.ScaleTargetRef, dep.Name)
		}
		if dep.Spec.Replicas != nil {
			t.Error("Deployment sets replicas under an HPA: every helm upgrade would reset the HPA's count")
		}
		if h.Spec.MinReplicas == nil {
			t.Fatal("HPA without minReplicas")
		}
		minReplicas = *h.Spec.MinReplicas
	case len(hpas) > 1:
		t.Errorf("%d HPAs", len(hpas))
	case dep.Spec.Replicas == nil:
		t.Error("no replicas and no HPA")
	default:
		minReplicas = *dep.Spec.Replicas
	}
	if strings.HasPrefix(flagValue(cmd, "store"), "redis") {
		if got := flagValue(cmd, "min-fleet-size"); got != strconv.Itoa(int(minReplicas)) {
			t.Errorf("--min-fleet-size=%s, want the least replicas, %d", got, minReplicas)
		}
		envVar(t, dep, "RLS_REDIS_URL")
	}
	for _, a := range cmd {
		if strings.HasPrefix(a, "--redis-password") || strings.HasPrefix(a, "--redis-url") {
			t.Errorf("%s in the command line (visible in the pod spec and ps): want it from env", a)
		}
	}
	checkSecretRefs(t, r, c)

	// Service: selects the pods, gRPC port named grpc-* for Istio.
	svc := one[*corev1.Service](t, r)
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) || len(svc.Spec.Selector) == 0 {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, pod.Labels)
	}
	svcPorts := map[string]bool{}
	for _, p := range svc.Spec.Ports {
		svcPorts[p.Name] = true
		target := p.TargetPort.IntVal
		if p.TargetPort.Type == intstr.String {
			target = ports[p.TargetPort.StrVal]
		}
		switch {
		case strings.HasPrefix(p.Name, "grpc-"):
			if target != grpcPort || p.AppProtocol == nil || *p.AppProtocol != "grpc" {
				t.Errorf("Service port %s targets %d (appProtocol %v), want the gRPC port %d, grpc", p.Name, target, p.AppProtocol, grpcPort)
			}
		case p.Name == "http-metrics":
			if target != httpPort {
				t.Errorf("Service port http-metrics targets %d, want %d", target, httpPort)
			}
		default:
			t.Errorf("Service port %q: want grpc-* (Istio's protocol selection) or http-metrics", p.Name)
		}
	}
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return strings.HasPrefix(p.Name, "grpc-") }) || !svcPorts["http-metrics"] {
		t.Errorf("Service ports %v: want a grpc-* port and http-metrics", keys(svcPorts))
	}

	// PDB: the pods, and never more than the fleet can give.
	pdb := one[*policyv1.PodDisruptionBudget](t, r)
	if !selector(t, pdb.Spec.Selector).Matches(labels.Set(pod.Labels)) {
		t.Error("the PodDisruptionBudget does not select the pods")
	}
	if m := pdb.Spec.MinAvailable; m != nil && m.Type == intstr.Int && m.IntVal >= minReplicas {
		t.Errorf("PDB minAvailable %d with %d replicas: no node could ever be drained", m.IntVal, minReplicas)
	}

	for _, sm := range all[*serviceMonitor](r) {
		if !selector(t, &sm.Spec.Selector).Matches(labels.Set(svc.Labels)) {
			t.Errorf("ServiceMonitor selector %v does not select Service %s (labels %v)", sm.Spec.Selector, svc.Name, svc.Labels)
		}
		if !slices.Contains(sm.Spec.NamespaceSelector.MatchNames, svc.Namespace) && !sm.Spec.NamespaceSelector.Any {
			t.Errorf("ServiceMonitor looks in %v, the Service is in %s", sm.Spec.NamespaceSelector.MatchNames, svc.Namespace)
		}
		for _, e := range sm.Spec.Endpoints {
			if !svcPorts[e.Port] || e.Path != "/metrics" {
				t.Errorf("ServiceMonitor endpoint %s%s: want a Service port and /metrics", e.Port, e.Path)
			}
		}
	}
	for _, np := range all[*networkingv1.NetworkPolicy](r) {
		if !selector(t, &np.Spec.PodSelector).Matches(labels.Set(pod.Labels)) {
			t.Error("the NetworkPolicy does not select the pods")
		}
		for _, in := range np.Spec.Ingress {
			for _, p := range in.Ports {
				if p.Port == nil || (p.Port.Type == intstr.String && ports[p.Port.StrVal] == 0) {
					t.Errorf("NetworkPolicy port %v is not a container port", p.Port)
				}
			}
		}
	}
	for _, tsc := range pod.Spec.TopologySpreadConstraints {
		if !selector(t, tsc.LabelSelector).Matches(labels.Set(pod.Labels)) {
			t.Errorf("topologySpreadConstraint selector %v does not select the pods", tsc.LabelSelector)
		}
	}
	for _, pr := range all[*prometheusRule](r) {
		checkRules(t, "PrometheusRule "+pr.Metadata.Name, pr.Spec)
		checkRuleJobs(t, pr, svc.Name)
	}
	if cm := dashboardConfigMap(t, r); cm != nil {
		checkDashboard(t, cm)
	}
}

// checkConfigMount: the descriptor ConfigMap is mounted as a directory at
// --config-dir, and rls validate accepts its files.
func checkConfigMount(t *testing.T, r *release, dep *appsv1.Deployment, cmd []string) {
	t.Helper()
	dir := flagValue(cmd, "config-dir")
	c := dep.Spec.Template.Spec.Containers[0]
	var mount *corev1.VolumeMount
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == dir {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("nothing is mounted at --config-dir %s", dir)
	}
	if mount.SubPath != "" || mount.SubPathExpr != "" {
		t.Error("the config is mounted with subPath: the kubelet never updates such a file, so no reload")
	}
	cm := configMapOf(t, r, dep)
	if cm == nil {
		return // an existing ConfigMap
	}
	validateConfig(t, cm)
}

// validateConfig writes a ConfigMap's files to a directory and runs
// `rls validate` on it.
func validateConfig(t *testing.T, cm *corev1.ConfigMap) {
	t.Helper()
	dir := t.TempDir()
	for name, data := range cm.Data {
		if !strings.HasSuffix(name, ".yaml") && !strings.HasSuffix(name, ".yml") {
			t.Errorf("ConfigMap %s key %s: rls reads only .yaml and .yml files", cm.Name, name)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, stderr, err := runRLS(nil, "validate", dir); err != nil {
		t.Errorf("rls validate on ConfigMap %s: %v\n%s%s", cm.Name, err, out, stderr)
	}
}

// configMapOf returns the rendered ConfigMap the Deployment mounts as its
// config volume, or nil when it mounts one the chart does not make.
func configMapOf(t *testing.T, r *release, dep *appsv1.Deployment) *corev1.ConfigMap {
	t.Helper()
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name != "config" {
			continue
		}
		if v.ConfigMap == nil {
			t.Fatalf("volume config is not a ConfigMap: %+v", v)
		}
		for _, cm := range all[*corev1.ConfigMap](r) {
			if cm.Name == v.ConfigMap.Name {
				return cm
			}
		}
		return nil
	}
	t.Fatal("no volume named config")
	return nil
}

// checkSecretRefs: every Secret the container reads is rendered by the
// chart, or named by the values as existing; a rendered one has the key.
func checkSecretRefs(t *testing.T, r *release, c corev1.Container) {
	t.Helper()
	for _, e := range c.Env {
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		if ref.Optional != nil && *ref.Optional {
			t.Errorf("%s: optional Secret reference: a missing Secret would start rls without it", e.Name)
		}
		for _, s := range all[*corev1.Secret](r) {
			if s.Name == ref.Name {
				if _, ok := s.Data[ref.Key]; !ok {
					t.Errorf("%s: Secret %s has no key %s", e.Name, s.Name, ref.Key)
				}
			}
		}
	}
}

// dashboardConfigMap returns the ConfigMap labelled for Grafana's sidecar.
func dashboardConfigMap(t *testing.T, r *release) *corev1.ConfigMap {
	t.Helper()
	var found *corev1.ConfigMap
	for _, cm := range all[*corev1.ConfigMap](r) {
		if cm.Labels["grafana_dashboard"] != "" {
			if cm.Labels["grafana_dashboard"] != "1" {
				t.Errorf("ConfigMap %s label grafana_dashboard=%q, want \"1\"", cm.Name, cm.Labels["grafana_dashboard"])
			}
			found = cm
		}
	}
	return found
}

// checkDashboard: the dashboard is JSON with a title and uid, and its
// queries name only metrics rls exports.
func checkDashboard(t *testing.T, cm *corev1.ConfigMap) {
	t.Helper()
	if len(cm.Data) != 1 {
		t.Fatalf("dashboard ConfigMap keys %v, want one .json", keys(cm.Data))
	}
	for name, data := range cm.Data {
		if !strings.HasSuffix(name, ".json") {
			t.Errorf("dashboard key %s: the sidecar wants a .json file", name)
		}
		var d struct {
			Title  string `json:"title"`
			UID    string `json:"uid"`
			Panels []any  `json:"panels"`
		}
		if err := json.Unmarshal([]byte(data), &d); err != nil {
			t.Fatalf("dashboard %s: %v", name, err)
		}
		if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
			t.Errorf("dashboard %s: title %q uid %q, %d panels", name, d.Title, d.UID, len(d.Panels))
		}
		exprs := jsonStrings(d.Panels, "expr")
		if len(exprs) == 0 {
			t.Errorf("dashboard %s has no query", name)
		}
		for _, e := range exprs {
			checkMetricNames(t, "dashboard query", e)
		}
	}
}

// jsonStrings collects the string values of every key named key in v.
func jsonStrings(v any, key string) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok && k == key {
				out = append(out, s)
			} else {
				out = append(out, jsonStrings(e, key)...)
			}
		}
	case []any:
		for _, e := range v {
			out = append(out, jsonStrings(e, key)...)
		}
	}
	return out
}

// checkRules: every rule has an expression and a name, on metrics rls
// exports.
func checkRules(t *testing.T, where string, rf ruleFile) {
	t.Helper()
	n := 0
	for _, g := range rf.Groups {
		if g.Name == "" {
			t.Errorf("%s: a group without a name", where)
		}
		for _, r := range g.Rules {
			n++
			if r.Expr == "" || (r.Alert == "") == (r.Record == "") {
				t.Errorf("%s: rule %q/%q: want an expr and one of alert or record", where, r.Alert, r.Record)
			}
			checkMetricNames(t, where+" "+r.Alert+r.Record, r.Expr)
		}
	}
	if n == 0 {
		t.Errorf("%s has no rule", where)
	}
}

var metricRef = regexp.MustCompile(`\brls_[a-z0-9_]+`)

// checkMetricNames: each rls_* name in a PromQL expression is a metric rls
// exports.
func checkMetricNames(t *testing.T, where, expr string) {
	t.Helper()
	for _, m := range unknownMetrics(t, expr) {
		t.Errorf("%s: %s is not a metric rls exports (%q)", where, m, expr)
	}
}

// unknownMetrics returns the rls_* names in expr that rls does not export
// (a histogram's are known with their _bucket, _sum or _count suffix).
func unknownMetrics(t *testing.T, expr string) []string {
	t.Helper()
	known := exportedMetrics(t)
	var unknown []string
	for _, m := range metricRef.FindAllString(expr, -1) {
		base := m
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(m, s); ok && known[b] {
				base = b
			}
		}
		if !known[base] {
			unknown = append(unknown, m)
		}
	}
	return unknown
}

var exported map[string]bool

// exportedMetrics reads the metric names rls registers from its sources:
// every "rls_..." string literal in cmd/ and pkg/.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	if exported != nil {
		return exported
	}
	exported = map[string]bool{}
	lit := regexp.MustCompile(`"(rls_[a-z0-9_]+)"`)
	for _, root := range []string{"../cmd", "../pkg"} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			for _, m := range lit.FindAllSubmatch(b, -1) {
				exported[string(m[1])] = true
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if !exported["rls_decisions_total"] {
		t.Fatalf("found no rls_decisions_total in rls's sources (found %v): has the metric moved?", keys(exported))
	}
	return exported
}

// TestRuleAndDashboardFiles checks the two files shipped for monitoring as
// files, whether or not the templates that ship them are enabled.
func TestRuleAndDashboardFiles(t *testing.T) {
	b, err := os.ReadFile(chartDir + "/files/prometheus-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalStrict(b, &rf); err != nil {
		t.Fatalf("files/prometheus-rules.yaml: %v", err)
	}
	checkRules(t, "files/prometheus-rules.yaml", rf)
	d, err := os.ReadFile(chartDir + "/files/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	checkDashboard(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "file"}, Data: map[string]string{"rls.json": string(d)}})

	// The check can fail: a name rls does not export is reported.
	if got := unknownMetrics(t, "sum(rate(rls_requests_total[5m])) / sum(rate(rls_decision_duration_seconds_count[5m]))"); !slices.Equal(got, []string{"rls_requests_total"}) {
		t.Errorf("unknown metrics %v, want [rls_requests_total]", got)
	}
}

// rlsHealthService is the gRPC health service name rls reports
// NOT_SERVING when it drains (rlsServiceName in cmd/rls/serve.go).
func rlsHealthService(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../cmd/rls/serve.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^const rlsServiceName = "([^"]+)"`).FindSubmatch(b)
	if m == nil {
		t.Fatal("cmd/rls/serve.go has no const rlsServiceName")
	}
	return string(m[1])
}

// containerCommand is what the container runs: the image's ENTRYPOINT
// (unless the pod sets command) followed by args.
func containerCommand(t *testing.T, dep *appsv1.Deployment) []string {
	t.Helper()
	c := dep.Spec.Template.Spec.Containers[0]
	ep, _ := dockerEntrypoint(t)
	if len(c.Command) > 0 {
		ep = c.Command
	}
	return append(slices.Clone(ep), c.Args...)
}

// flagValue returns the last value of --name in cmd (the one rls uses),
// in either --name=value or --name value form.
func flagValue(cmd []string, name string) string {
	v := ""
	for i, a := range cmd {
		if x, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			v = x
		} else if a == "--"+name && i+1 < len(cmd) {
			v = cmd[i+1]
		}
	}
	return v
}

// commandArgs is the container command as arguments to the rls binary: the
// ENTRYPOINT's program must be where the Dockerfile puts rls.
func commandArgs(t *testing.T, r *release) []string {
	t.Helper()
	cmd, _ := commandAndEnv(t, r)
	_, binary := dockerEntrypoint(t)
	if cmd[0] != binary {
		t.Fatalf("the container runs %s; the Dockerfile puts rls at %s", cmd[0], binary)
	}
	return cmd[1:]
}

// commandAndEnv returns the container's command and its environment,
// Secret references resolved: from a Secret the chart renders, else (an
// existing Secret) a placeholder of the form the variable needs.
func commandAndEnv(t *testing.T, r *release) ([]string, []string) {
	t.Helper()
	dep := one[*appsv1.Deployment](t, r)
	c := dep.Spec.Template.Spec.Containers[0]
	if len(c.EnvFrom) > 0 {
		t.Fatal("envFrom: the test does not resolve it")
	}
	var env []string
	for _, e := range c.Env {
		v := e.Value
		if f := e.ValueFrom; f != nil {
			if f.SecretKeyRef == nil {
				t.Fatalf("env %s: valueFrom %+v: the test resolves only secretKeyRef", e.Name, f)
			}
			v = secretValue(r, e.Name, f.SecretKeyRef)
		}
		env = append(env, e.Name+"="+v)
	}
	return containerCommand(t, dep), env
}

func secretValue(r *release, name string, ref *corev1.SecretKeySelector) string {
	for _, s := range all[*corev1.Secret](r) {
		if s.Name == ref.Name {
			if v, ok := s.Data[ref.Key]; ok {
				return string(v)
			}
			if v, ok := s.StringData[ref.Key]; ok {
				return v
			}
		}
	}
	if strings.HasSuffix(name, "_URL") {
		return "redis://placeholder:secret@" + ref.Name + ".example:6379"
	}
	return "placeholder-" + ref.Key
}

// dryRun runs the container's command through `rls serve --dry-run` with
// the container's environment alone, and returns what it printed.
func dryRun(t *testing.T, r *release) string {
	t.Helper()
	_, env := commandAndEnv(t, r)
	args := append(commandArgs(t, r), "--dry-run")
	stdout, stderr, err := runRLS(env, args...)
	if err != nil {
		t.Fatalf("rls %s (env %v): %v\n%s%s", strings.Join(args, " "), env, err, stdout, stderr)
	}
	if !strings.Contains(stdout, "flags ok") {
		t.Fatalf("rls --dry-run printed %q", stdout)
	}
	return strings.TrimSpace(stdout)
}

func selector(t *testing.T, s *metav1.LabelSelector) labels.Selector {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil || s == nil || sel.Empty() {
		t.Fatalf("selector %v: %v (empty selects everything)", s, err)
	}
	return sel
}

// envVar returns the container's variable name, failing when it is unset.
func envVar(t *testing.T, dep *appsv1.Deployment, name string) corev1.EnvVar {
	t.Helper()
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		if e.Name == name {
			return e
		}
	}
	t.Fatalf("no env %s", name)
	return corev1.EnvVar{}
}

// manifestName returns the name of the object of kind in a manifest file.
func manifestName(t *testing.T, file, kind string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range splitYAML(string(b)) {
		var o metav1.PartialObjectMetadata
		if err := yaml.Unmarshal([]byte(d), &o); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if o.Kind == kind {
			return o.Name
		}
	}
	t.Fatalf("%s has no %s", file, kind)
	return ""
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestReadmeHelmCommands: every `helm install` in the README renders (with
// its -n, -f and --set, as helm parses --set) into a release that passes
// the checks above, and an image built by the README's `make image
// IMAGE=...` is the image the chart then runs.
func TestReadmeHelmCommands(t *testing.T) {
	md, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(md), "\\\n", " ")
	built := ""
	n := 0
	for _, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, "#")
		words := strings.Fields(line)
		if len(words) > 2 && words[0] == "make" && words[1] == "image" {
			for _, w := range words[2:] {
				if v, ok := strings.CutPrefix(w, "IMAGE="); ok {
					built = v
				}
			}
		}
		if len(words) < 4 || words[0] != "helm" || words[1] != "install" || slices.Contains(words, "...") {
			continue
		}
		n++
		t.Run(strings.Join(words, " "), func(t *testing.T) {
			if words[3] != "deploy/helm/rls" {
				t.Fatalf("chart %s, want deploy/helm/rls", words[3])
			}
			ns := "default"
			var files []string
			set := map[string]any{}
			for i := 4; i < len(words); i++ {
				switch w := words[i]; w {
				case "-n", "--namespace", "-f", "--values", "--set":
					if i+1 == len(words) {
						t.Fatalf("%s without a value", w)
					}
					i++
					switch w {
					case "-n", "--namespace":
						ns = words[i]
					case "-f", "--values":
						files = append(files, "../"+words[i])
					case "--set":
						if err := strvals.ParseInto(words[i], set); err != nil {
							t.Fatalf("--set %s: %v", words[i], err)
						}
					}
				case "--create-namespace":
				default:
					t.Fatalf("the test does not know helm's %s", w)
				}
			}
			r, err := render(t, words[2], ns, files, set)
			if err != nil {
				t.Fatal(err)
			}
			checkRelease(t, r)
			dryRun(t, r)
			image := one[*appsv1.Deployment](t, r).Spec.Template.Spec.Containers[0].Image
			if set["image"] != nil && image != built {
				t.Errorf("the chart runs %s; the README's make image built %s", image, built)
			}
		})
	}
	if n < 2 {
		t.Errorf("found %d helm install commands in the README, want the Kubernetes and Istio ones", n)
	}
}

// TestProbeOverride: a probe handler in the values replaces the gRPC one
// (the kubelet's gRPC probes do not speak TLS), timings are kept.
func TestProbeOverride(t *testing.T) {
	r := mustRender(t, nil, map[string]any{
		"extraArgs":      []any{"--grpc-tls-cert=/tls/tls.crt", "--grpc-tls-key=/tls/tls.key"},
		"readinessProbe": map[string]any{"tcpSocket": map[string]any{"port": "grpc"}},
	})
	c := one[*appsv1.Deployment](t, r).Spec.Template.Spec.Containers[0]
	if p := c.ReadinessProbe; p.GRPC != nil || p.TCPSocket == nil || p.TCPSocket.Port.StrVal != "grpc" || p.PeriodSeconds != 5 {
		t.Errorf("readinessProbe %+v: want the tcpSocket handler alone, periodSeconds 5 kept", p)
	}
	if p := c.LivenessProbe; p.GRPC == nil {
		t.Errorf("livenessProbe %+v: want the gRPC one, not overridden", p)
	}
}

var jobRef = regexp.MustCompile(`\bjob="([^"]*)"`)

// checkRuleJobs: every job the rules name is job, the job of the release's
// targets (a ServiceMonitor without jobLabel scrapes them as the Service's
// name), and at least one rule names it.
func checkRuleJobs(t *testing.T, pr *prometheusRule, job string) {
	t.Helper()
	n := 0
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			for _, m := range jobRef.FindAllStringSubmatch(r.Expr, -1) {
				n++
				if m[1] != job {
					t.Errorf("PrometheusRule %s: %s selects job %q, want the release's job %q", pr.Metadata.Name, r.Alert, m[1], job)
				}
			}
		}
	}
	if n == 0 {
		t.Errorf("PrometheusRule %s: no rule selects the release's job %q", pr.Metadata.Name, job)
	}
}

// TestUserConfigReplacesExample: a user's config.files replaces the chart's
// example config, not merged with it, even when it defines domain example
// too (both would make the pods refuse to start: a duplicate domain).
func TestUserConfigReplacesExample(t *testing.T) {
	mine := "domain: example\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 7}\n"
	for _, name := range []string{"mine.yaml", "example.yaml"} {
		r := mustRender(t, nil, map[string]any{"config": map[string]any{"files": map[string]any{name: mine}}})
		cm := configMapOf(t, r, one[*appsv1.Deployment](t, r))
		if len(cm.Data) != 1 || cm.Data[name] != mine {
			t.Errorf("config.files {%s}: the ConfigMap has %v, want only the user's file", name, keys(cm.Data))
		}
		validateConfig(t, cm) // rls validate: one domain example, no duplicate
	}
}

// TestRulesSelectReleaseJob: under any release name, the alert rules select
// the job of that release's targets, never a fixed job="rls"; and
// prometheusRule.job names another.
func TestRulesSelectReleaseJob(t *testing.T) {
	on := map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}}
	for _, c := range []struct {
		release string
		set     map[string]any
		want    string
	}{
		{"payments", on, "payments-rls"},
		{"rls", on, "rls"},
		{"edge", mergeValues(on, map[string]any{"prometheusRule": map[string]any{"job": "kubernetes-pods"}}), "kubernetes-pods"},
	} {
		r, err := render(t, c.release, "ns", nil, c.set)
		if err != nil {
			t.Fatalf("%s: %v", c.release, err)
		}
		svc := one[*corev1.Service](t, r)
		if c.set["prometheusRule"].(map[string]any)["job"] == nil && svc.Name != c.want {
			t.Errorf("release %s: Service %s, want %s (the ServiceMonitor's job)", c.release, svc.Name, c.want)
		}
		checkRuleJobs(t, one[*prometheusRule](t, r), c.want)
	}
}

// TestHelmLint: the chart passes Helm's own lint (helm lint's packages), in
// strict mode, with the default values and with every shipped values file.
func TestHelmLint(t *testing.T) {
	for _, s := range shipped {
		vals := map[string]any{}
		for _, f := range s.files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var v map[string]any
			if err := yaml.Unmarshal(b, &v); err != nil {
				t.Fatal(err)
			}
			vals = mergeValues(vals, v)
		}
		l := lint.All(chartDir, vals, "rls", true)
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("%s: helm lint: %s", s.name, m)
			}
		}
	}
}
