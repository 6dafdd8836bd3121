package threadcpu

import (
	"runtime"
	"testing"
	"time"
)

// A thread that sleeps uses no CPU; one that spins does.
func TestCountsOnlyTheThreadsWork(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start, ok := Now()
	if !ok {
		t.Skip("no thread CPU clock on this system")
	}
	time.Sleep(50 * time.Millisecond)
	slept, _ := Now()
	if d := slept - start; d > 20*time.Millisecond {
		t.Errorf("sleeping 50ms used %v of the thread's CPU", d)
	}
	for spin := time.Now(); time.Since(spin) < 30*time.Millisecond; {
	}
	spun, _ := Now()
	if d := spun - slept; d <= 0 {
		t.Errorf("spinning 30ms used %v of the thread's CPU", d)
	}
}
