package tokenclient

import "github.com/rgproxy/rgproxy/internal/clock"

// Clock is the time source of a Client (shared with rgproxy's policy).
// Tests inject a fake one so that waits, report periods and degraded mode
// are driven without sleeping.
type Clock = clock.Clock

// Timer is a one-shot timer made by a Clock.
type Timer = clock.Timer
