package server

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

// AdminServer serves rls.admin.v1.AdminService, and reflection for
// grpcurl, on a listener and gRPC server of its own. Whoever reaches it can
// read and reset every counter: it belongs on loopback or a private
// interface, never on the RateLimitService's port. A nil *AdminServer is
// the admin API off: its methods do nothing.
type AdminServer struct {
	srv *grpc.Server
	lis net.Listener
}

// ListenAdmin listens on addr (TCP) with at most conns.Max connections
// open at once (connguard.Limit). Its gRPC server takes the listener's
// interceptors, then opts (the gRPC port's TLS and interceptors). It serves
// nothing until Register and Serve. An empty addr is the admin API off:
// nil, nil. An error names the listener as --conns.Port.
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

// Register serves a on s.
func (s *AdminServer) Register(a adminv1.AdminServiceServer) {
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

// Serve serves until Stop, then returns nil; it returns nil at once when s
// is nil.
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
// connection (at once with timeout 0). It closes the listener when Serve
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
