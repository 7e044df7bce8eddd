package compat

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestListenGRPCReplacesStaleSocket: a socket a dead process left is
// replaced; a regular file is not.
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
	second.Close()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ListenGRPC(file, ""); err == nil || !strings.Contains(err.Error(), "--grpc-uds") {
		t.Errorf("over a regular file: %v, want an error naming --grpc-uds", err)
	}
}
