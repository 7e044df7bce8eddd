//go:build !linux

package redistest

import "syscall"

// ChildAttr returns nil outside Linux, which has no parent-death signal:
// cleanups alone stop the children there.
func ChildAttr() *syscall.SysProcAttr { return nil }
