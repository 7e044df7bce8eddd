package service

import (
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"github.com/rls-project/rls/pkg/connguard"
	adminv1 "github.com/rls-project/rls/proto/rls/admin/v1"
)

// AdminServer serves rls.admin.v1.AdminService (and reflection, for
// grpcurl) on a listener and gRPC server of its own, apart from the
// RateLimitService's port: whoever reaches the admin API can read and reset
// every counter, so it belongs on loopback or a private interface, never
// on the port Envoy and every other client reach. A nil *AdminServer is the
// admin API off: its methods do nothing.
type AdminServer struct {
	srv *grpc.Server
	lis net.Listener
}

// ListenAdmin listens on addr (TCP), with at most conns.Max connections
// open at once (connguard.Limit), and makes the admin API's server with
// opts (the gRPC port's TLS, interceptors) after the listener's own
// interceptors, which tell it the connections with a call in flight. It serves nothing until
// Register and Serve. An empty addr is the admin API off: nil, nil. An
// error names the listener as --conns.Port (the flag that set addr).
func ListenAdmin(addr string, conns connguard.LimitOptions, opts ...grpc.ServerOption) (*AdminServer, error) {
	if addr == "" {
		return nil, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", conns.Port, err)
	}
	limited := connguard.Limit(lis, conns)
	srv := grpc.NewServer(append(limited.ServerOptions(), opts...)...)
	reflection.Register(srv)
	return &AdminServer{srv: srv, lis: limited}, nil
}

// Register serves a's API on s.
func (s *AdminServer) Register(a *Admin) {
	if s != nil {
		adminv1.RegisterAdminServiceServer(s.srv, a)
	}
}

// Addr is the address s listens on; nil when s is nil.
func (s *AdminServer) Addr() net.Addr {
	if s == nil {
		return nil
	}
	return s.lis.Addr()
}

// Serve serves until Stop; it returns nil at once when s is nil, and nil
// after Stop.
func (s *AdminServer) Serve() error {
	if s == nil {
		return nil
	}
	if err := s.srv.Serve(s.lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("admin server: %w", err)
	}
	return nil
}

// Stop lets calls in flight finish for up to timeout, then closes every
// connection (at once with timeout 0), and closes the listener when Serve
// was never called.
func (s *AdminServer) Stop(timeout time.Duration) {
	if s == nil {
		return
	}
	t := time.AfterFunc(timeout, s.srv.Stop)
	s.srv.GracefulStop()
	t.Stop()
	s.lis.Close()
}
