package main

import (
	"context"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// caller makes ShouldRateLimit calls on one connection (one grpc-go
// ClientConn); it is safe for concurrent use.
type caller struct {
	cc   *grpc.ClientConn
	reqs *requestSet
}

// callScratch is one worker's reusable space for calls.
type callScratch struct {
	resp rlsv3.RateLimitResponse
}

// dialCaller makes a connection to addr. grpc.NewClient connects lazily:
// the preflight call is what finds a wrong address.
func dialCaller(addr string, reqs *requestSet) (*caller, error) {
	// passthrough: dial the address as given, no resolver; each ClientConn
	// is its own TCP connection. Static windows, as Envoy uses (256 MiB by
	// default): no bandwidth-estimation PINGs, which Envoy never sends and
	// which would cost the server a frame each.
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(16<<20))
	if err != nil {
		return nil, err
	}
	return &caller{cc: cc, reqs: reqs}, nil
}

// call sends the request of key idx and returns the response's overall
// code. sc is the calling worker's own scratch space.
func (c *caller) call(ctx context.Context, idx int, sc *callScratch) (rlsv3.RateLimitResponse_Code, error) {
	if err := c.cc.Invoke(ctx, method, c.reqs.get(idx), &sc.resp); err != nil {
		return 0, err
	}
	return sc.resp.OverallCode, nil
}

func (c *caller) close() error { return c.cc.Close() }
