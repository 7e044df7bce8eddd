package compat

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestListenGRPCReplacesStaleSocket: a socket a dead process left is
// replaced; one a process still serves is not, nor is a regular file.
func TestListenGRPCReplacesStaleSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "rls-l-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s")
	first, _, err := ListenGRPC(sock, "")
	if err != nil {
		t.Fatal(err)
	}
	// Leave the file behind, as a killed process would.
	if l, ok := first.(interface{ SetUnlinkOnClose(bool) }); ok {
		l.SetUnlinkOnClose(false)
	}
	first.Close()
	second, port, err := ListenGRPC(sock, "")
	if err != nil || port != "grpc-uds" {
		t.Fatalf("over a stale socket: %v (%s)", err, port)
	}
	// A socket that a process still serves is not taken over.
	if _, _, err := ListenGRPC(sock, ""); err == nil || !strings.Contains(err.Error(), "served by another process") {
		t.Errorf("over a live socket: %v, want an error saying another process serves it", err)
	}
	if c, err := net.Dial("unix", sock); err != nil {
		t.Errorf("the first listener's socket after the refused take-over: %v, want it still served", err)
	} else {
		c.Close()
	}
	second.Close()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ListenGRPC(file, ""); err == nil || !strings.Contains(err.Error(), "--grpc-uds") {
		t.Errorf("over a regular file: %v, want an error naming --grpc-uds", err)
	}
}
