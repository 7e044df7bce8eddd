package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rls-project/rls/pkg/connguard"
	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/limiter"
	"github.com/rls-project/rls/pkg/service"
	"github.com/rls-project/rls/pkg/store/memory"
	adminv1 "github.com/rls-project/rls/proto/rls/admin/v1"
)

// newTestAdmin is the admin API of a service with one rule, on the memory
// store.
func newTestAdmin(t *testing.T) *service.Admin {
	t.Helper()
	cfg, err := descriptors.Parse(map[string][]byte{"test.yaml": []byte(`
domain: test
descriptors:
  - key: api_key
    rate_limit: {name: per-key, unit: minute, requests_per_unit: 5}
`)})
	if err != nil {
		t.Fatal(err)
	}
	st := memory.New(memory.Options{})
	lim := limiter.New(st, limiter.Options{})
	return service.NewAdmin(service.New(cfg, lim, service.Options{}), st, lim)
}

// TestAdminServer: an empty address is the admin API off (a nil server
// whose methods do nothing); otherwise the API answers on its own
// listener, and Stop ends Serve with nil.
func TestAdminServer(t *testing.T) {
	guard := func() connguard.LimitOptions {
		return connguard.LimitOptions{Port: "admin-addr", Max: 1, Metrics: connguard.NewMetrics(prometheus.NewRegistry())}
	}
	off, err := ListenAdmin("", guard())
	if off != nil || err != nil {
		t.Fatalf("ListenAdmin(\"\"): %v %v, want nil, nil", off, err)
	}
	off.Register(nil)
	off.Stop(time.Second)
	if off.Serve() != nil || off.Addr() != nil {
		t.Error("a nil AdminServer serves or has an address")
	}
	if _, err := ListenAdmin("256.0.0.1:1", guard()); err == nil || !strings.HasPrefix(err.Error(), "--admin-addr: ") {
		t.Errorf("ListenAdmin on an invalid address: %v, want an error naming --admin-addr", err)
	}

	a := newTestAdmin(t)
	s, err := ListenAdmin("127.0.0.1:0", guard())
	if err != nil {
		t.Fatal(err)
	}
	s.Register(a)
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	conn, err := grpc.NewClient(s.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ex, err := adminv1.NewAdminServiceClient(conn).Explain(ctx, &adminv1.ExplainRequest{Domain: "test", Descriptors: []*adminv1.Descriptor{
		{Entries: []*adminv1.Entry{{Key: "api_key", Value: "a"}}}}})
	if err != nil || len(ex.GetExplanations()) != 1 || !ex.Explanations[0].Matched {
		t.Fatalf("Explain on the admin server: %v %v", ex, err)
	}
	s.Stop(time.Second)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve after Stop: %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve still running 5 s after Stop")
	}
}
