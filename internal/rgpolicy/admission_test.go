package rgpolicy

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/resourcegroup"
)

func TestAdmissionOrdersWaitersByPriority(t *testing.T) {
	a := newAdmission(1)
	ctx := context.Background()
	if held, err := a.acquire(ctx, clock.Real{}, resourcegroup.PriorityLow, 0); err != nil || !held {
		t.Fatal(held, err)
	}
	order := make(chan string, 3)
	var wg sync.WaitGroup
	wait := func(name string, p resourcegroup.Priority) {
		defer wg.Done()
		if _, err := a.acquire(ctx, clock.Real{}, p, 0); err != nil {
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
		wg.Add(1)
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
	wg.Wait()
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
	a.acquire(context.Background(), clock.Real{}, resourcegroup.PriorityMedium, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := a.acquire(ctx, clock.Real{}, resourcegroup.PriorityHigh, 0)
		done <- err
	}()
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
	if held, err := a.acquire(context.Background(), clock.Real{}, resourcegroup.PriorityLow, 0); err != nil || !held {
		t.Fatal(held, err)
	}
}

// Raising the cap (or lifting it) admits waiters at once; lowering it lets
// running statements finish and admits no more than the new cap.
func TestAdmissionSetLimit(t *testing.T) {
	a := newAdmission(1)
	ctx := context.Background()
	if held, _ := a.acquire(ctx, clock.Real{}, resourcegroup.PriorityMedium, 0); !held {
		t.Fatal("no slot")
	}
	done := make(chan bool)
	go func() {
		held, _ := a.acquire(ctx, clock.Real{}, resourcegroup.PriorityMedium, 0)
		done <- held
	}()
	for queued(a) == 0 {
		time.Sleep(time.Millisecond)
	}
	a.setLimit(0)
	if held := <-done; !held {
		t.Fatal("a waiter admitted by lifting the cap must hold its slot")
	}
	a.release()
	a.release()
	if running(a) != 0 {
		t.Fatalf("running %d", running(a))
	}
	if held, _ := a.acquire(ctx, clock.Real{}, resourcegroup.PriorityMedium, 0); held {
		t.Fatal("no cap: nothing to hold")
	}
	a.setLimit(2)
	for range 2 {
		if held, _ := a.acquire(ctx, clock.Real{}, resourcegroup.PriorityMedium, 0); !held {
			t.Fatal("no slot under the new cap")
		}
	}
	a.setLimit(1)
	go func() {
		held, _ := a.acquire(ctx, clock.Real{}, resourcegroup.PriorityMedium, 0)
		done <- held
	}()
	for queued(a) == 0 {
		time.Sleep(time.Millisecond)
	}
	a.release() // 2 → 1 running: still at the new cap
	if queued(a) != 1 {
		t.Fatal("admitted beyond the lowered cap")
	}
	a.release()
	if held := <-done; !held {
		t.Fatal("waiter not admitted")
	}
}

func TestAdmissionUnlimited(t *testing.T) {
	a := newAdmission(0)
	for i := 0; i < 100; i++ {
		if held, err := a.acquire(context.Background(), clock.Real{}, resourcegroup.PriorityLow, 0); err != nil || held {
			t.Fatal(held, err)
		}
	}
}
