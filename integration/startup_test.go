package integration

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestOversizedRequest: a request over the gRPC port's 1 MiB is refused with
// ResourceExhausted and the server keeps serving.
func TestOversizedRequest(t *testing.T) {
	light(t)
	p := startRLS(t, "../config")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "example",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("api_key", strings.Repeat("x", 1_100_000))}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("1.1 MB request with a 1 MiB limit: %v, want ResourceExhausted", err)
	}
	if r := should(t, p.client(), "example", desc("api_key", "small")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after the oversized request: %v", r)
	}
}

// TestRelaunchOnTakenPort: the harness starts rls again on new addresses
// when a port freeAddrs handed out was taken before rls bound it (seen in
// CI: another process's port, taken between freeAddrs closing it and rls
// listening), so a test does not fail on the machine's other traffic.
func TestRelaunchOnTakenPort(t *testing.T) {
	light(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	p := newRLSProc(t, rlsBin, nil, "../config")
	p.launch(t, []string{taken.Addr().String(), freeAddr(t)})
	p.waitServing(t, 20*time.Second)
	if p.relaunches != 1 || p.GRPCAddr == taken.Addr().String() {
		t.Fatalf("relaunches %d, gRPC on %s (taken: %s), want one relaunch on another address", p.relaunches, p.GRPCAddr, taken.Addr())
	}
	if !strings.Contains(p.Log.String(), "address already in use") {
		t.Fatalf("the first start did not fail on the taken port:\n%s", p.Log.String())
	}
	if r := should(t, p.client(), "example", desc("api_key", "k")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after the relaunch: %v", r)
	}
}
