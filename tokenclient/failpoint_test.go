package tokenclient

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pingcap/failpoint"

	"github.com/rgproxy/rgproxy/internal/fptest"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

const fpPkg = "github.com/rgproxy/rgproxy/tokenclient/"

// needFailpoints skips a test unless `make test-failpoints` compiled the
// markers in; there it must run.
func needFailpoints(t *testing.T) { fptest.Need(t, fpPkg, failpointsCompiledIn) }

func enable(t *testing.T, name, term string) { fptest.Enable(t, fpPkg, name, term) }

// A stream that fails on send or on receive is reopened; statements wait
// no longer than their maxWait meanwhile, and are served once it is back.
func TestFailpointStreamSendAndReceiveErrors(t *testing.T) {
	needFailpoints(t)
	for _, fp := range []string{"tokenStreamSendError", "tokenStreamRecvError"} {
		t.Run(fp, func(t *testing.T) {
			s := startServer(t)
			s.tok.setGrant(func(g *tokenpb.GroupTokenRequest) *tokenpb.GroupGrant {
				return &tokenpb.GroupGrant{Tokens: g.GetTokensWanted(), FillRate: 10, Proxies: 1, RuPerSec: 10}
			})
			c, err := New(Config{Servers: []string{s.addr}, ProxyID: "p1", Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			enable(t, fp, "return(true)")
			start := time.Now()
			_, err = acquireAll(ctx, c, "a", rruOf(5), 300*time.Millisecond)
			if waited := time.Since(start); waited > 800*time.Millisecond {
				t.Fatalf("AcquireShare waited %v with maxWait 300ms (err %v)", waited, err)
			}
			failpoint.Disable(fpPkg + fp)
			if _, err := acquireAll(ctx, c, "a", rruOf(5), 5*time.Second); err != nil {
				t.Fatalf("after the fault: %v", err)
			}
		})
	}
}

// A grant that comes 3 s late never makes a statement wait past maxWait.
func TestFailpointDelayedGrant(t *testing.T) {
	needFailpoints(t)
	s := startServer(t)
	s.tok.setGrant(func(g *tokenpb.GroupTokenRequest) *tokenpb.GroupGrant {
		return &tokenpb.GroupGrant{Tokens: g.GetTokensWanted(), FillRate: 10, Proxies: 1, RuPerSec: 10}
	})
	c, err := New(Config{Servers: []string{s.addr}, ProxyID: "p1", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	enable(t, "delayGrant", "return(3000)")
	var wg sync.WaitGroup
	var mu sync.Mutex
	var worst time.Duration
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, err := acquireAll(ctx, c, "a", rruOf(3), time.Second)
			d := time.Since(start)
			if err != nil && !errors.Is(err, ErrThrottled) {
				t.Errorf("AcquireShare: %v", err)
			}
			mu.Lock()
			worst = max(worst, d)
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Logf("slowest AcquireShare with grants 3 s late and maxWait 1 s: %v", worst)
	if worst > 1500*time.Millisecond {
		t.Fatalf("a statement waited %v, more than its maxWait of 1 s", worst)
	}
}

// A stream that breaks with grants in flight loses them, but never counts
// tokens twice: received ≤ granted ≤ received + what was in flight.
func TestFailpointDroppedGrant(t *testing.T) {
	needFailpoints(t)
	s := startServer(t)
	var mu sync.Mutex
	var granted float64
	s.tok.setGrant(func(g *tokenpb.GroupTokenRequest) *tokenpb.GroupGrant {
		mu.Lock()
		defer mu.Unlock()
		if g.GetGroup() == "a" {
			granted += g.GetTokensWanted()
		}
		return &tokenpb.GroupGrant{Tokens: g.GetTokensWanted(), FillRate: 10, Proxies: 1, RuPerSec: 10}
	})
	c, err := New(Config{Servers: []string{s.addr}, ProxyID: "p1", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Drop the next two grants, then let them through.
	enable(t, "dropGrant", "2*return(true)")
	for i := 0; i < 20; i++ {
		acquireAll(ctx, c, "a", rruOf(2), 2*time.Second)
	}
	c.stream.mu.Lock()
	dropped := c.stream.droppedTokens // only group a asks for tokens here
	c.stream.mu.Unlock()
	c.groups.mu.Lock()
	gs := c.groups.byName["a"]
	received := gs.received
	c.groups.mu.Unlock()
	mu.Lock()
	g := granted
	mu.Unlock()
	t.Logf("granted %.1f, received %.1f, dropped in flight %.1f", g, received, dropped)
	if dropped == 0 {
		t.Fatal("no grant was dropped")
	}
	if received > g+1e-9 || g > received+dropped+1e-9 {
		t.Fatalf("received %.1f, granted %.1f, dropped %.1f: want received ≤ granted ≤ received + dropped", received, g, dropped)
	}
}
