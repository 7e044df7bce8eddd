package compat

import (
	"fmt"
	"net"
	"os"
	"time"
)

// ListenGRPC listens on the Unix socket uds when it is set (--grpc-uds, as
// upstream's GRPC_UDS: instead of TCP), else on tcpAddr (--grpc-addr). It
// returns the listener and the name of the flag it serves, the port's name
// in connguard's metrics. A socket left by a process that died (nothing
// accepts on it) is replaced; a socket another process still serves is an
// error, as is any other file there: a second rls started on the same path
// took the socket over silently, leaving the first serving nobody.
func ListenGRPC(uds, tcpAddr string) (net.Listener, string, error) {
	if uds == "" {
		lis, err := net.Listen("tcp", tcpAddr)
		if err != nil {
			return nil, "", fmt.Errorf("--grpc-addr: %w", err)
		}
		return lis, "grpc-addr", nil
	}
	if st, err := os.Lstat(uds); err == nil && st.Mode()&os.ModeSocket != 0 {
		if c, err := net.DialTimeout("unix", uds, time.Second); err == nil {
			c.Close()
			return nil, "", fmt.Errorf("--grpc-uds (RLS_GRPC_UDS): %s is served by another process (a connection to it was accepted): stop that process, or choose another path", uds)
		}
		_ = os.Remove(uds)
	}
	lis, err := net.Listen("unix", uds)
	if err != nil {
		return nil, "", fmt.Errorf("--grpc-uds (RLS_GRPC_UDS): %w", err)
	}
	return lis, "grpc-uds", nil
}
