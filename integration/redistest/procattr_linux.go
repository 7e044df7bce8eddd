package redistest

import "syscall"

// ChildAttr makes a child process get SIGKILL when the test process dies,
// so that a test binary killed before its cleanups ran (a fuzz worker the
// fuzzing engine restarts, a `go test` past its -timeout) leaves no
// redis-server or rls behind.
func ChildAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
