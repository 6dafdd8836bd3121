//go:build linux

package sqltext

import (
	"syscall"
	"time"
	"unsafe"
)

// clockThreadCPUTime is CLOCK_THREAD_CPUTIME_ID.
const clockThreadCPUTime = 3

// threadCPU returns the calling thread's CPU time, exact to the
// nanosecond (clock_gettime brings the scheduler's count up to date); the
// caller locks its goroutine to the thread. A cost comparison on a loaded
// machine reads this rather than the wall clock, which also counts the
// waits for a CPU.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	if _, _, e := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		panic(e)
	}
	return time.Duration(ts.Nano())
}
