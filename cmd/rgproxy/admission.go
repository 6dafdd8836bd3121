package main

import (
	"context"
	"sync"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// admission caps the statements running on the backend at once
// (--max-backend-concurrency). When the cap is reached, waiting statements
// are admitted HIGH before MEDIUM before LOW, first come first served
// within a priority. Safe for concurrent use.
type admission struct {
	mu      sync.Mutex
	limit   int // 0 = unlimited
	running int
	queues  [3][]chan struct{} // by rank: 0 = HIGH, 1 = MEDIUM, 2 = LOW
}

func newAdmission(limit int) *admission { return &admission{limit: limit} }

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

// acquire blocks until the statement may run or ctx ends. Every nil
// return must be paired with one release.
func (a *admission) acquire(ctx context.Context, p resourcegroup.Priority) error {
	if a.limit <= 0 {
		return nil
	}
	a.mu.Lock()
	if a.running < a.limit && a.queuedLocked() == 0 {
		a.running++
		a.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	r := rank(p)
	a.queues[r] = append(a.queues[r], ch)
	a.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		a.mu.Lock()
		defer a.mu.Unlock()
		for i, c := range a.queues[r] {
			if c == ch {
				a.queues[r] = append(a.queues[r][:i], a.queues[r][i+1:]...)
				return ctx.Err()
			}
		}
		// Admitted while we gave up: hand the slot on.
		a.releaseLocked()
		return ctx.Err()
	}
}

func (a *admission) release() {
	if a.limit <= 0 {
		return
	}
	a.mu.Lock()
	a.releaseLocked()
	a.mu.Unlock()
}

// releaseLocked frees one slot, or passes it straight to the first waiter
// of the highest priority.
func (a *admission) releaseLocked() {
	for r := range a.queues {
		if q := a.queues[r]; len(q) > 0 {
			a.queues[r] = q[1:]
			close(q[0])
			return
		}
	}
	a.running--
}

func (a *admission) queuedLocked() int {
	return len(a.queues[0]) + len(a.queues[1]) + len(a.queues[2])
}
