//go:build unix

package mysqlproto

import "syscall"

// nofileLimit is the process's soft limit of open file descriptors; Go
// raises it to the hard limit at start (os package, since Go 1.19).
func nofileLimit() (uint64, bool) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, false
	}
	return uint64(rl.Cur), true
}
