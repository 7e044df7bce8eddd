//go:build !unix

package connguard

// FDLimit returns 0: the file-descriptor limit is not known here.
func FDLimit() uint64 { return 0 }
