package compat

import (
	"fmt"
	"net"
	"os"
)

// ListenGRPC listens on the Unix socket uds when it is set (--grpc-uds, as
// upstream's GRPC_UDS: instead of TCP), else on tcpAddr (--grpc-addr). It
// returns the listener and the name of the flag it serves, the port's name
// in connguard's metrics. A socket left by a process that died is
// replaced; any other file there is an error.
func ListenGRPC(uds, tcpAddr string) (net.Listener, string, error) {
	if uds == "" {
		lis, err := net.Listen("tcp", tcpAddr)
		if err != nil {
			return nil, "", fmt.Errorf("--grpc-addr: %w", err)
		}
		return lis, "grpc-addr", nil
	}
	if st, err := os.Lstat(uds); err == nil && st.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(uds)
	}
	lis, err := net.Listen("unix", uds)
	if err != nil {
		return nil, "", fmt.Errorf("--grpc-uds (RLS_GRPC_UDS): %w", err)
	}
	return lis, "grpc-uds", nil
}
