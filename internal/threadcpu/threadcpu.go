// Package threadcpu reads the CPU time of the calling OS thread, for the
// tests that compare the cost of two inputs on a loaded machine: the wall
// clock also counts the waits for a CPU, which a busy neighbour stretches
// at random, while a thread's CPU time counts only its own work.
package threadcpu

import "time"

// Now returns the calling thread's CPU time (exact to the nanosecond on
// Linux, where clock_gettime brings the scheduler's count up to date), and
// whether it is that; elsewhere it returns the wall time since the process
// started, and false. The caller locks its goroutine to its thread
// (runtime.LockOSThread) while it compares two readings.
func Now() (time.Duration, bool) { return now() }
