package main

import (
	"context"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

func TestAdmissionOrdersWaitersByPriority(t *testing.T) {
	a := newAdmission(1)
	ctx := context.Background()
	if err := a.acquire(ctx, resourcegroup.PriorityLow); err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 3)
	wait := func(name string, p resourcegroup.Priority) {
		if err := a.acquire(ctx, p); err != nil {
			t.Error(err)
		}
		order <- name
		a.release()
	}
	// Queue LOW, MEDIUM, HIGH in that order, each surely queued before the next.
	for _, w := range []struct {
		name string
		p    resourcegroup.Priority
	}{{"low", resourcegroup.PriorityLow}, {"medium", resourcegroup.PriorityMedium}, {"high", resourcegroup.PriorityHigh}} {
		n := queued(a)
		go wait(w.name, w.p)
		for queued(a) == n {
			time.Sleep(time.Millisecond)
		}
	}
	a.release()
	for _, want := range []string{"high", "medium", "low"} {
		if got := <-order; got != want {
			t.Fatalf("admitted %s, want %s", got, want)
		}
	}
	if r := running(a); r != 0 {
		t.Fatalf("running = %d after all released", r)
	}
}

func running(a *admission) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.running
}

func queued(a *admission) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.queuedLocked()
}

func TestAdmissionCancelledWaiterLeavesNoSlot(t *testing.T) {
	a := newAdmission(1)
	a.acquire(context.Background(), resourcegroup.PriorityMedium)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.acquire(ctx, resourcegroup.PriorityHigh) }()
	for queued(a) == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("cancelled acquire succeeded")
	}
	a.release()
	if running(a) != 0 || queued(a) != 0 {
		t.Fatalf("running=%d queued=%d", running(a), queued(a))
	}
	if err := a.acquire(context.Background(), resourcegroup.PriorityLow); err != nil {
		t.Fatal(err)
	}
}

func TestAdmissionUnlimited(t *testing.T) {
	a := newAdmission(0)
	for i := 0; i < 100; i++ {
		if err := a.acquire(context.Background(), resourcegroup.PriorityLow); err != nil {
			t.Fatal(err)
		}
	}
}
