package tokenclient

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// within fails the test when f does not return within 10 s of real time:
// it waits for a lock it must not need.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s waited for a lock it must not take", what)
	}
}

// TestOwnersLocksApart: the groups and the token stream each own their
// state under their own lock, and neither takes the other's (groupTable's
// contract): with the stream's lock held, the statements, the scrape, the
// console and degraded mode go on; with the groups' lock held, the stream
// registers and answers requests.
func TestOwnersLocksApart(t *testing.T) {
	reg := prometheus.NewRegistry()
	c, clk := newTestClient(t, func(cfg *Config) { cfg.Registerer = reg })
	ctx := context.Background()

	c.stream.mu.Lock()
	within(t, "a statement, with the stream's lock held", func() {
		if _, _, err := c.AcquireShare(ctx, nil, resourcegroup.DefaultGroup, rruOf(1), 1, time.Second); err != nil {
			t.Error(err)
		}
		c.Charge(resourcegroup.DefaultGroup, rruOf(1))
		c.CountThrottled(resourcegroup.DefaultGroup, 1)
	})
	within(t, "the scrape, the console and Degraded, with the stream's lock held", func() {
		clk.Advance(time.Minute) // silent for DegradedAfter: degraded on the next look
		if _, err := reg.Gather(); err != nil {
			t.Error(err)
		}
		c.Usage(clk.Now())
		c.Overview(clk.Now(), 10)
		if !c.Degraded() {
			t.Error("not degraded after a minute without rgserver")
		}
	})
	c.stream.mu.Unlock()

	c.groups.mu.Lock()
	var req *tokenpb.TokenRequest
	within(t, "the stream's bookkeeping, with the groups' lock held", func() {
		req = &tokenpb.TokenRequest{}
		c.stream.register(req, &sentRequest{at: clk.Now()})
		c.stream.oldest(clk.Now())
		c.stream.answered(req.GetRequestId(), true)
		c.stream.ended(clk.Now())
		_ = c.stream.status()
	})
	c.groups.mu.Unlock()
	if req.GetRequestId() == 0 {
		t.Fatal("the request got no id")
	}
}
