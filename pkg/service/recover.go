package service

import (
	"context"
	"log/slog"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RecoverUnary returns a gRPC interceptor that turns a handler's panic into
// codes.Internal, counts it in m (may be nil) and logs it once with its
// stack, so one bad request never takes the process down.
func RecoverUnary(m *Metrics, log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				m.Panic()
				log.Error("panic in gRPC handler; answered Internal", "method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
				resp, err = nil, status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
			}
		}()
		return handler(ctx, req)
	}
}
