//go:build unix

package connguard

import "syscall"

// FDLimit returns the process's file-descriptor limit (the soft
// RLIMIT_NOFILE, which the Go runtime raises to the hard one at start-up),
// or 0 when it cannot be read.
func FDLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return r.Cur
}
