//go:build !linux

package sqltext

import "time"

var epoch = time.Now()

// threadCPU stands in for the thread's CPU time where it cannot be read:
// the wall clock.
func threadCPU() time.Duration { return time.Since(epoch) }
