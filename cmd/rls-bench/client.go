package main

import (
	"context"
	"fmt"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// Clients (-client): "h2", a lean HTTP/2 gRPC client (h2.go) that costs
// the shared machine a fraction of what grpc-go's does, as Envoy's C++
// client would; "grpc", grpc-go's ClientConn.
const (
	clientH2   = "h2"
	clientGRPC = "grpc"
)

// caller makes ShouldRateLimit calls on one connection; it is safe for
// concurrent use.
type caller interface {
	// call sends the request of key idx and returns the response's
	// overall code. sc is the calling worker's own scratch space.
	call(ctx context.Context, idx int, sc *callScratch) (rlsv3.RateLimitResponse_Code, error)
	close() error
}

// callScratch is one worker's reusable space for calls.
type callScratch struct {
	resp rlsv3.RateLimitResponse // grpc-go
	req  []byte                  // h2: a request marshalled per call
	out  []byte                  // h2: the response message
}

// dialCaller connects to addr with the named client.
func dialCaller(ctx context.Context, kind, addr string, reqs *requestSet, timeout time.Duration) (caller, error) {
	switch kind {
	case clientH2:
		c, err := dialH2(ctx, addr)
		if err != nil {
			return nil, err
		}
		return &h2Caller{c: c, reqs: reqs, timeout: timeout}, nil
	case clientGRPC:
		// passthrough: dial the address as given, no resolver; each
		// ClientConn is its own TCP connection. Static windows, as Envoy
		// uses (256 MiB by default): no bandwidth-estimation PINGs, which
		// Envoy never sends and which would cost the server a frame each.
		cc, err := grpc.NewClient("passthrough:///"+addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(16<<20))
		if err != nil {
			return nil, err
		}
		return &grpcCaller{cc: cc, reqs: reqs}, nil
	}
	return nil, fmt.Errorf("unknown client %q", kind)
}

type grpcCaller struct {
	cc   *grpc.ClientConn
	reqs *requestSet
}

func (g *grpcCaller) call(ctx context.Context, idx int, sc *callScratch) (rlsv3.RateLimitResponse_Code, error) {
	if err := g.cc.Invoke(ctx, method, g.reqs.get(idx), &sc.resp); err != nil {
		return 0, err
	}
	return sc.resp.OverallCode, nil
}

func (g *grpcCaller) close() error { return g.cc.Close() }

type h2Caller struct {
	c       *h2conn
	reqs    *requestSet
	timeout time.Duration
}

func (h *h2Caller) call(ctx context.Context, idx int, sc *callScratch) (rlsv3.RateLimitResponse_Code, error) {
	out, err := h.c.Invoke(ctx, method, h.reqs.wire(idx, &sc.req), h.timeout, sc.out)
	sc.out = out
	if err != nil {
		return 0, err
	}
	return overallCode(out)
}

func (h *h2Caller) close() error { return h.c.Close() }

// overallCode reads RateLimitResponse.overall_code (field 1) from a
// marshalled response without unmarshalling the rest, as a client that
// only acts on the verdict would.
func overallCode(b []byte) (rlsv3.RateLimitResponse_Code, error) {
	var code uint64
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, status.Errorf(codes.Internal, "malformed response: %v", protowire.ParseError(n))
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			if code, n = protowire.ConsumeVarint(b); n < 0 {
				return 0, status.Errorf(codes.Internal, "malformed response: %v", protowire.ParseError(n))
			}
		} else if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return 0, status.Errorf(codes.Internal, "malformed response: %v", protowire.ParseError(n))
		}
		b = b[n:]
	}
	return rlsv3.RateLimitResponse_Code(code), nil
}
