package rgpolicy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/resourcegroup"
)

// admission caps the statements running on the backend at once
// (--max-backend-concurrency). When the cap is reached, waiting statements
// are admitted HIGH before MEDIUM before LOW, first come first served
// within a priority. Safe for concurrent use.
type admission struct {
	// open: there is no cap and nobody waits, so a statement enters
	// without taking mu (the usual case: every session would otherwise
	// meet on this one lock). Written under mu.
	open    atomic.Bool
	mu      sync.Mutex
	limit   int // 0 = unlimited
	running int
	queues  [3][]chan struct{} // by rank: 0 = HIGH, 1 = MEDIUM, 2 = LOW
}

func newAdmission(limit int) *admission {
	a := &admission{limit: max(limit, 0)}
	a.open.Store(a.limit == 0)
	return a
}

func rank(p resourcegroup.Priority) int {
	switch p {
	case resourcegroup.PriorityHigh:
		return 0
	case resourcegroup.PriorityLow:
		return 2
	default:
		return 1
	}
}

// setLimit changes the cap; raising it (or lifting it, 0) admits waiters.
func (a *admission) setLimit(limit int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.limit = max(limit, 0)
	for a.queuedLocked() > 0 && (a.limit == 0 || a.running < a.limit) {
		a.running++
		a.wakeFirstLocked()
	}
	a.open.Store(a.limit == 0 && a.queuedLocked() == 0)
}

// errAdmissionWait: the statement waited maxWait for a slot.
var errAdmissionWait = errors.New("rgpolicy: backend concurrency cap: waited too long")

// acquire blocks until the statement may run, ctx ends, or maxWait (> 0)
// passes on clk (errAdmissionWait). held reports whether it took a slot,
// which must then be given back with release.
func (a *admission) acquire(ctx context.Context, clk clock.Clock, p resourcegroup.Priority, maxWait time.Duration) (held bool, err error) {
	if a.open.Load() {
		return false, nil
	}
	a.mu.Lock()
	if a.limit == 0 && a.queuedLocked() == 0 {
		a.mu.Unlock()
		return false, nil
	}
	if (a.limit == 0 || a.running < a.limit) && a.queuedLocked() == 0 {
		a.running++
		a.mu.Unlock()
		return true, nil
	}
	ch := make(chan struct{})
	r := rank(p)
	a.queues[r] = append(a.queues[r], ch)
	a.open.Store(false)
	a.mu.Unlock()
	var timeout <-chan time.Time
	if maxWait > 0 {
		t := clk.NewTimer(maxWait)
		defer t.Stop()
		timeout = t.C()
	}
	giveUp := func(err error) (bool, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		for i, c := range a.queues[r] {
			if c == ch {
				a.queues[r] = append(a.queues[r][:i], a.queues[r][i+1:]...)
				return false, err
			}
		}
		// Admitted while we gave up: hand the slot on.
		a.releaseLocked()
		return false, err
	}
	select {
	case <-ch:
		return true, nil
	case <-ctx.Done():
		return giveUp(fmt.Errorf("rgpolicy: waiting for a backend slot: %w", ctx.Err()))
	case <-timeout:
		return giveUp(errAdmissionWait)
	}
}

// release gives back a slot that acquire took.
func (a *admission) release() {
	a.mu.Lock()
	a.releaseLocked()
	a.mu.Unlock()
}

// releaseLocked frees one slot, or passes it straight to the first waiter
// of the highest priority while the cap allows.
func (a *admission) releaseLocked() {
	if a.queuedLocked() > 0 && (a.limit == 0 || a.running <= a.limit) {
		a.wakeFirstLocked()
		return
	}
	a.running--
}

// wakeFirstLocked admits the first waiter of the highest priority; its
// slot is already counted in running.
func (a *admission) wakeFirstLocked() {
	for r := range a.queues {
		if q := a.queues[r]; len(q) > 0 {
			a.queues[r] = q[1:]
			close(q[0])
			return
		}
	}
}

func (a *admission) queuedLocked() int {
	return len(a.queues[0]) + len(a.queues[1]) + len(a.queues[2])
}
