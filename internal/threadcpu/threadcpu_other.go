//go:build !linux

package threadcpu

import "time"

// epoch is when the process started, as far as this package can tell.
var epoch = time.Now()

func now() (time.Duration, bool) { return time.Since(epoch), false }
