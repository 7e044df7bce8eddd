package service

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
	adminv1 "github.com/rls-project/rls/proto/rls/admin/v1"
)

func newTestAdmin(t *testing.T, opts Options) (*Admin, *Service) {
	t.Helper()
	cfg, err := descriptors.Parse(map[string][]byte{"test.yaml": []byte(testConfig)})
	if err != nil {
		t.Fatal(err)
	}
	clk := &testkit.Clock{}
	clk.Advance(1_751_540_400e9)
	st := memory.New(memory.Options{Now: clk.Now})
	lim := limiter.New(st, limiter.Options{Now: clk.Now})
	svc := New(cfg, lim, opts)
	return NewAdmin(svc, st, lim), svc
}

func adminDesc(kv ...string) *adminv1.Descriptor {
	d := &adminv1.Descriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &adminv1.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// The admin API resolves a request as ShouldRateLimit does, with the same
// bounds and the same error mapping.
func TestAdminSharesTheResolver(t *testing.T) {
	a, svc := newTestAdmin(t, Options{Limits: Limits{Descriptors: 2}})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		req  *adminv1.ExplainRequest
		want string
	}{
		{"empty domain", &adminv1.ExplainRequest{Descriptors: []*adminv1.Descriptor{adminDesc("api_key", "a")}}, "domain is empty"},
		{"too many", &adminv1.ExplainRequest{Domain: "test", Descriptors: []*adminv1.Descriptor{adminDesc("a", "1"), adminDesc("b", "2"), adminDesc("c", "3")}}, "over the limit of 2 per request"},
		{"empty key", &adminv1.ExplainRequest{Domain: "test", Descriptors: []*adminv1.Descriptor{adminDesc("", "1")}}, "descriptors[0].entries[0].key is empty"},
		{"bad unit", &adminv1.ExplainRequest{Domain: "test", Descriptors: []*adminv1.Descriptor{{Entries: []*adminv1.Entry{{Key: "k", Value: "v"}}, Limit: &adminv1.LimitOverride{RequestsPerUnit: 1, Unit: "fortnight"}}}}, `unit "fortnight" is invalid`},
	} {
		_, err := a.Explain(ctx, tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want InvalidArgument naming %q", tc.name, err, tc.want)
		}
	}

	// Explain reads what ShouldRateLimit wrote, with the replaces applied.
	call(t, svc, 1, d("api_key", "x"))
	r, err := a.Explain(ctx, &adminv1.ExplainRequest{Domain: "test", Descriptors: []*adminv1.Descriptor{adminDesc("api_key", "x"), adminDesc("free", "y")}})
	if err != nil {
		t.Fatal(err)
	}
	if e := r.Explanations[0]; e.State.GetRemaining() != 4 || e.Rule.GetName() != "per-key" {
		t.Errorf("api_key: %v", e)
	}
	if e := r.Explanations[1]; e.State != nil || !strings.Contains(e.Note, "unlimited") {
		t.Errorf("free: %v", e)
	}
	// ResetCounters deletes exactly the counted key, and the next call starts afresh.
	rr, err := a.ResetCounters(ctx, &adminv1.ResetCountersRequest{Domain: "test", Descriptors: []*adminv1.Descriptor{adminDesc("api_key", "x")}})
	if err != nil || len(rr.Keys) != 1 {
		t.Fatalf("reset: %v %v", rr, err)
	}
	if got := call(t, svc, 1, d("api_key", "x")).Statuses[0].LimitRemaining; got != 4 {
		t.Errorf("after reset: remaining %d, want 4", got)
	}
}
