package deploy

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// TestGoMemLimit: the container's GOMEMLIMIT is goMemLimitPercent (90 by
// default) of resources.limits.memory, in bytes, which rls --dry-run
// accepts; none without a limit or with the percentage 0; the operator's
// own GOMEMLIMIT in extraEnv is the only one; a limit the chart cannot
// read fails the render, naming the value.
func TestGoMemLimit(t *testing.T) {
	limits := func(mem string) map[string]any {
		return map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": mem}}}
	}
	for name, tc := range map[string]struct {
		set  map[string]any
		want []string // the GOMEMLIMIT values in the container's env
	}{
		"default, 512Mi": {nil, []string{"483183820"}}, // 512 MiB * 0.9, rounded down
		"1Gi at 80":      {mergeValues(limits("1Gi"), map[string]any{"goMemLimitPercent": 80}), []string{"858993459"}},
		"decimal 1G":     {limits("1G"), []string{"900000000"}},
		"plain bytes":    {limits("1000000"), []string{"900000"}},
		"no limit":       {map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": nil}}}, nil},
		"percent 0":      {map[string]any{"goMemLimitPercent": 0}, nil},
		"the operator's": {map[string]any{"extraEnv": []any{map[string]any{"name": "GOMEMLIMIT", "value": "300MiB"}}}, []string{"300MiB"}},
	} {
		t.Run(name, func(t *testing.T) {
			r := mustRender(t, nil, tc.set)
			var got []string
			for _, e := range one[*appsv1.Deployment](t, r).Spec.Template.Spec.Containers[0].Env {
				if e.Name == "GOMEMLIMIT" {
					got = append(got, e.Value)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("GOMEMLIMIT %q, want %q", got, tc.want)
			}
			if len(got) > 0 {
				dryRun(t, r) // fails the test when rls refuses the value
			}
		})
	}
	_, err := render(t, "rls", "rls", nil, limits("0.5Gi"))
	if err == nil || !strings.Contains(err.Error(), `resources.limits.memory "0.5Gi": goMemLimitPercent needs a whole number`) {
		t.Errorf("0.5Gi: %v; want an error naming resources.limits.memory", err)
	}
	if _, err := render(t, "rls", "rls", nil, map[string]any{"goMemLimitPercent": 120}); err == nil || !strings.Contains(err.Error(), "goMemLimitPercent") {
		t.Errorf("goMemLimitPercent 120: %v; want the schema to refuse it", err)
	}
}
