package tokenclient

import (
	"context"
	"sync"
)

// loops owns a Client's background goroutines. Each gets its context when
// it starts (none is kept in the Client); stop cancels them all and waits
// for them. Its lock is its own and is never held while a loop runs.
type loops struct {
	mu      sync.Mutex
	started bool // Start began: StartInspect and the like may add loops
	stopped bool
	cancels []context.CancelFunc
	wg      sync.WaitGroup
}

// begin marks the start of the client's loops; false if they began or
// stopped already.
func (l *loops) begin() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started || l.stopped {
		return false
	}
	l.started = true
	return true
}

// running reports whether loops began and have not been stopped.
func (l *loops) running() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.started && !l.stopped
}

// start runs fn on a goroutine of its own with a context that stop
// cancels; false (and fn does not run) once the loops stopped or before
// they began.
func (l *loops) start(fn func(ctx context.Context)) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.started || l.stopped {
		return false
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancels = append(l.cancels, cancel)
	l.wg.Go(func() {
		defer cancel()
		fn(ctx)
	})
	return true
}

// stop cancels every loop and waits for them to return. It is idempotent.
func (l *loops) stop() {
	l.mu.Lock()
	l.stopped = true
	cancels := l.cancels
	l.cancels = nil
	l.mu.Unlock()
	for _, cancel := range cancels {
		cancel()
	}
	l.wg.Wait()
}
