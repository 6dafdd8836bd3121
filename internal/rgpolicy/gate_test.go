package rgpolicy

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/internal/clock"
)

// waitGate polls until the gate has n waiters.
func waitGate(t *testing.T, g *gate, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		g.mu.Lock()
		w := len(g.waiters)
		g.mu.Unlock()
		if w == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gate %s: want %d waiters", g, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestGateBoundsWhatIsInFlight(t *testing.T) {
	clk := clock.NewFake()
	ctx := context.Background()
	g := &gate{}
	// Bound 100 RU: two 45 RU statements run together, a third waits.
	for range 2 {
		if err := enter(g, ctx, clk, 45, 100, 0, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if got := g.String(); got != "bound=100 max=0 inflight=90 running=2 waiting=0" {
		t.Fatal(got)
	}
	done := make(chan error, 1)
	go func() { done <- enter(g, ctx, clk, 45, 100, 0, time.Second) }()
	waitGate(t, g, 1)
	// A light statement queues behind it: first come, first served.
	light := make(chan error, 1)
	go func() { light <- enter(g, ctx, clk, 1, 100, 0, time.Second) }()
	waitGate(t, g, 2)
	g.release(45)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-light; err != nil {
		t.Fatal(err)
	}
	if got := g.String(); got != "bound=100 max=0 inflight=91 running=3 waiting=0" {
		t.Fatal(got)
	}
	g.release(45)
	g.release(45)
	g.release(1)
	if got := g.String(); got != "bound=100 max=0 inflight=0 running=0 waiting=0" {
		t.Fatal(got)
	}
}

func TestGateHeavierThanTheBoundRunsAlone(t *testing.T) {
	clk := clock.NewFake()
	ctx := context.Background()
	g := &gate{}
	if err := enter(g, ctx, clk, 500, 100, 0, 0); err != nil {
		t.Fatalf("alone, a statement over the bound must run: %v", err)
	}
	if err := enter(g, ctx, clk, 1, 100, 0, 0); !errors.Is(err, errGateTimeout) {
		t.Fatalf("beside it nothing runs: %v", err)
	}
	g.release(500)
	if err := enter(g, ctx, clk, 1, 100, 0, 0); err != nil {
		t.Fatal(err)
	}
}

func TestGateTimeoutAndCancel(t *testing.T) {
	clk := clock.NewFake()
	g := &gate{}
	if err := enter(g, context.Background(), clk, 80, 100, 0, time.Second); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- enter(g, context.Background(), clk, 80, 100, 0, time.Second) }()
	waitGate(t, g, 1)
	clk.Advance(time.Second)
	if err := <-done; !errors.Is(err, errGateTimeout) {
		t.Fatalf("after its wait: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- enter(g, ctx, clk, 80, 100, 0, time.Second) }()
	waitGate(t, g, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	// Forced in (a transaction's statement after its wait): over the bound.
	g.force(80, 0)
	if got := g.String(); got != "bound=100 max=0 inflight=160 running=2 waiting=0" {
		t.Fatal(got)
	}
}

// MAX_CONCURRENCY: at most maxConc statements at once, however light.
func TestGateMaxConcurrency(t *testing.T) {
	clk := clock.NewFake()
	ctx := context.Background()
	g := &gate{}
	inf := math.Inf(1)
	for range 2 {
		if err := enter(g, ctx, clk, 0.1, inf, 2, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- enter(g, ctx, clk, 0.1, inf, 2, time.Second) }()
	waitGate(t, g, 1)
	g.release(0.1)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := g.String(); got != "bound=+Inf max=2 inflight=0.2 running=2 waiting=0" {
		t.Fatal(got)
	}
	// MODE WARN goes in anyway and is told it would have waited.
	if !g.force(0.1, 2) {
		t.Fatal("a third statement under MAX_CONCURRENCY 2 would not have waited")
	}
}

// enter is gate.acquire without the time it waited.
func enter(g *gate, ctx context.Context, clk clock.Clock, n, bound float64, maxConc int, maxWait time.Duration) error {
	_, err := g.acquire(ctx, clk, n, bound, maxConc, maxWait)
	return err
}
