package tokenclient

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// grantTokens gives group n tokens at once, at a standing fill of rate.
func grantTokens(t *testing.T, c *Client, group string, n, rate float64) {
	t.Helper()
	wantTokens(c, group)
	req := build(c, false)
	if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
		{Group: group, Tokens: n, FillRate: rate, Proxies: 1, RuPerSec: uint64(rate)}}}); err != nil {
		t.Fatal(err)
	}
}

// pendingOf is the consumption of group not yet reported to rgserver.
func pendingOf(c *Client, group string) float64 {
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	return c.groups.byName[group].pending.RU()
}

func sweep(c *Client) {
	c.groups.mu.Lock()
	c.groups.sweepPursesLocked(c.clk.Now(), false)
	c.groups.mu.Unlock()
}

func purses(c *Client) int {
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	return len(c.groups.purses)
}

// A session's statements run from an advance while the bucket holds
// plenty: the bucket is touched once per purseStatements statements, what
// they spent is recorded at the sweep, and an unused advance goes back,
// so that the bucket ends where it would have without the purse.
func TestPurseServesStatementsFromAnAdvance(t *testing.T) {
	c, _ := newTestClient(t, nil)
	ctx := context.Background()
	// A standing fill of 0 keeps the bucket's arithmetic exact.
	grantTokens(t, c, "a", 10000, 0)
	start, pending0 := tokensOf(c, "a"), pendingOf(c, "a")
	var p Purse
	acquire := func(n float64) {
		t.Helper()
		if _, waited, err := c.AcquireShare(ctx, &p, "a", rruOf(n), n, time.Second); err != nil || waited != 0 {
			t.Fatalf("AcquireShare: waited %v, %v", waited, err)
		}
	}
	steps := []struct {
		do         func()
		bucket     float64 // tokens in the bucket after the step
		pending    float64 // RU recorded since the start
		purse      string
		purseCount int // purses the client sweeps
	}{
		// The first statement takes its tokens and an advance for 31 more.
		{func() { acquire(1) }, start - 32, 1, "purse a: tokens=31.00 for 31 statements, unrecorded=0.00 RU", 1},
		// Ten more come from the purse: the bucket does not move.
		{func() {
			for range 10 {
				acquire(1)
			}
		}, start - 32, 1, "purse a: tokens=21.00 for 21 statements, unrecorded=10.00 RU", 1},
		// A small settlement and a refund stay in the purse ...
		{func() { c.ChargePurse(&p, "a", rruOf(0.5)) }, start - 32, 1, "purse a: tokens=20.50 for 21 statements, unrecorded=10.50 RU", 1},
		{func() { c.ChargePurse(&p, "a", rruOf(-1)) }, start - 32, 1, "purse a: tokens=21.50 for 21 statements, unrecorded=9.50 RU", 1},
		// ... a refund that would leave it more than twice the advance goes
		// to the bucket.
		{func() { c.ChargePurse(&p, "a", rruOf(-50)) }, start + 18, -49, "purse a: tokens=21.50 for 21 statements, unrecorded=9.50 RU", 1},
		// The sweep records what the purse spent; it was used, so it keeps
		// its advance.
		{func() { sweep(c) }, start + 18, -39.5, "purse a: tokens=21.50 for 21 statements, unrecorded=0.00 RU", 1},
		// Unused since: the next sweep gives the advance back.
		{func() { sweep(c) }, start + 39.5, -39.5, "purse: empty", 0},
		// The next statement, twice as dear, takes an advance of 31 times
		// its cost.
		{func() { acquire(2) }, start - 24.5, -37.5, "purse a: tokens=62.00 for 31 statements, unrecorded=0.00 RU", 1},
		// The advance serves 31 statements; the 32nd records them and
		// takes the next one.
		{func() {
			for range purseStatements - 1 {
				acquire(2)
			}
		}, start - 24.5, -37.5, "purse a: tokens=0.00 for 0 statements, unrecorded=62.00 RU", 1},
		{func() { acquire(2) }, start - 88.5, 26.5, "purse a: tokens=62.00 for 31 statements, unrecorded=0.00 RU", 1},
		// The session ends: the bucket is where 26.5 RU of statements and
		// refunds leave it.
		{func() { c.ReturnPurse(&p) }, start - 26.5, 26.5, "purse: empty", 0},
	}
	for i, st := range steps {
		st.do()
		if got := tokensOf(c, "a"); !near(got, st.bucket) {
			t.Fatalf("step %d: bucket %v, want %v", i, got, st.bucket)
		}
		if got := pendingOf(c, "a") - pending0; !near(got, st.pending) {
			t.Fatalf("step %d: recorded %v, want %v", i, got, st.pending)
		}
		if got := p.String(); got != st.purse {
			t.Fatalf("step %d: %s, want %s", i, got, st.purse)
		}
		if got := purses(c); got != st.purseCount {
			t.Fatalf("step %d: %d purses, want %d", i, got, st.purseCount)
		}
	}
}

// No advance while the bucket could not spare it: a group near its limit
// is served statement by statement in arrival order, as without a purse.
// A change of the cache ends an advance.
func TestPurseOnlyWhenTheBucketSparesIt(t *testing.T) {
	ctx := context.Background()
	t.Run("low bucket", func(t *testing.T) {
		c, _ := newTestClient(t, nil)
		grantTokens(t, c, "a", 100, 0) // less than 64 advances of 31 RU
		var p Purse
		if _, _, err := c.AcquireShare(ctx, &p, "a", rruOf(1), 1, time.Second); err != nil {
			t.Fatal(err)
		}
		if got := p.String(); got != "purse: empty" {
			t.Fatalf("%s, want an empty purse", got)
		}
		if got := tokensOf(c, "a"); !near(got, 99) {
			t.Fatalf("bucket %v, want 99", got)
		}
	})
	t.Run("another group", func(t *testing.T) {
		c, _ := newTestClient(t, nil)
		grantTokens(t, c, "a", 10000, 0)
		grantTokens(t, c, "b", 10000, 0)
		a, b := tokensOf(c, "a"), tokensOf(c, "b")
		var p Purse
		for _, g := range []string{"a", "b"} {
			if _, _, err := c.AcquireShare(ctx, &p, g, rruOf(1), 1, time.Second); err != nil {
				t.Fatal(err)
			}
		}
		// a's advance went back when b's statement came.
		if got := tokensOf(c, "a"); !near(got, a-1) {
			t.Fatalf("a's bucket %v, want %v", got, a-1)
		}
		if got := tokensOf(c, "b"); !near(got, b-32) {
			t.Fatalf("b's bucket %v, want %v", got, b-32)
		}
	})
	t.Run("cache change", func(t *testing.T) {
		c, _ := newTestClient(t, nil)
		grantTokens(t, c, "a", 10000, 0)
		start := tokensOf(c, "a")
		var p Purse
		for range 2 {
			if _, _, err := c.AcquireShare(ctx, &p, "a", rruOf(1), 1, time.Second); err != nil {
				t.Fatal(err)
			}
		}
		c.cache.gen.Add(1)
		if _, _, err := c.AcquireShare(ctx, &p, "a", rruOf(1), 1, time.Second); err != nil {
			t.Fatal(err)
		}
		// The old advance (30 left) went back, a new one was taken.
		if got, want := tokensOf(c, "a"), start-3-31; !near(got, want) {
			t.Fatalf("bucket %v, want %v", got, want)
		}
		c.ChargePurse(&p, "a", rruOf(0.5))
		c.cache.gen.Add(1)
		c.ChargePurse(&p, "a", rruOf(0.5)) // goes to the bucket
		if got, want := tokensOf(c, "a"), start-3-31-0.5; !near(got, want) {
			t.Fatalf("bucket %v, want %v", got, want)
		}
	})
}

// An unlimited group's purse holds no tokens; it serves its statements
// and records them at the sweep, waits included in the wait histogram.
func TestPurseOfAnUnlimitedGroup(t *testing.T) {
	c, _ := newTestClient(t, nil)
	ctx := context.Background()
	setGroups(c, resourcegroup.Group{Name: "u", RUPerSec: resourcegroup.Unlimited})
	var p Purse
	for range 5 {
		if _, _, err := c.AcquireShare(ctx, &p, "u", rruOf(3), 3, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if got := p.String(); got != "purse u: tokens=unlimited for 27 statements, unrecorded=12.00 RU" {
		t.Fatalf("%s", got)
	}
	sweep(c)
	if got := pendingOf(c, "u"); !near(got, 15) {
		t.Fatalf("recorded %v, want 15", got)
	}
	if got := waitCount(t, c, "u"); got != 5 {
		t.Fatalf("wait histogram counts %d statements, want 5", got)
	}
}

// Close records what the purses spent before its final report.
func TestCloseSweepsPurses(t *testing.T) {
	c, _ := newTestClient(t, nil)
	grantTokens(t, c, "a", 10000, 0)
	pending0 := pendingOf(c, "a")
	var p Purse
	for range 3 {
		if _, _, err := c.AcquireShare(context.Background(), &p, "a", rruOf(1), 1, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := pendingOf(c, "a") - pending0; !near(got, 3) {
		t.Fatalf("recorded %v, want 3", got)
	}
	if got := p.String(); got != "purse: empty" {
		t.Fatalf("%s after Close", got)
	}
}

// The statements served from a purse allocate nothing.
func TestPurseAllocatesNothing(t *testing.T) {
	c, _ := newTestClient(t, nil)
	grantTokens(t, c, "a", 1e9, 0)
	ctx := context.Background()
	var p Purse
	cons := ru.Consumption{RRU: 0.7}
	run := func() {
		if _, _, err := c.AcquireShare(ctx, &p, "a", cons, 0.625, time.Second); err != nil {
			t.Fatal(err)
		}
		c.ChargePurse(&p, "a", ru.Consumption{RRU: 0.01})
	}
	run()
	if n := testing.AllocsPerRun(1000, run); n != 0 {
		t.Fatalf("%v allocations per statement, want 0", n)
	}
}

// waitCount is how many statements group's wait histogram counted.
func waitCount(t *testing.T, c *Client, group string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := c.met.wait.WithLabelValues(group).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// chargeOf is group's chargeback not yet reported, as "account=RU/stmts"
// and "key=value=RU/stmts" entries.
func chargeOf(c *Client, group string) []string {
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	gs := c.groups.byName[group]
	entries := gs.charge.take()
	var out []string
	for _, e := range entries {
		name := e.GetAccount()
		if e.GetTagKey() != "" {
			name = e.GetTagKey() + "=" + e.GetTagValue()
		}
		out = append(out, fmt.Sprintf("%s=%g/%d", name, e.GetRru()+e.GetWru(), e.GetStatements()))
	}
	gs.charge.restore(entries)
	return out
}

// A statement billed to its account alone is kept in the session's purse
// when the purse holds the group's advance, and recorded with the purse's
// spending at the sweep (or when the purse is returned); a tagged one, one
// of another account or group, or one without a purse goes to the group
// at once. Nothing is lost or counted twice.
func TestPurseKeepsTheAccountsChargeback(t *testing.T) {
	c, _ := newTestClient(t, nil)
	ctx := context.Background()
	grantTokens(t, c, "a", 10000, 0)
	var p Purse
	if _, _, err := c.AcquireShare(ctx, &p, "a", rruOf(1), 1, time.Second); err != nil {
		t.Fatal(err)
	}
	one := ru.Consumption{RRU: 1, Statements: 1}
	steps := []struct {
		do   func()
		want string
	}{
		{func() { c.Attribute(&p, "a", nil, "app@%", one) }, "[]"},
		{func() { c.Attribute(&p, "a", nil, "app@%", one) }, "[]"},
		{func() { sweep(c) }, "[app@%=2/2]"},
		{func() { c.Attribute(&p, "a", []BilledTag{{Key: "application", Value: "x"}}, "app@%", one) }, "[application=x=1/1 app@%=3/3]"},
		{func() { c.Attribute(&p, "a", nil, "app@%", one) }, "[application=x=1/1 app@%=3/3]"},
		{func() { c.Attribute(&p, "a", nil, "other@%", one) }, "[application=x=1/1 app@%=3/3 other@%=1/1]"},
		{func() { c.Attribute(nil, "a", nil, "app@%", one) }, "[application=x=1/1 app@%=4/4 other@%=1/1]"},
		{func() { c.ReturnPurse(&p) }, "[application=x=1/1 app@%=5/5 other@%=1/1]"},
		{func() { c.Attribute(&p, "a", nil, "app@%", one) }, "[application=x=1/1 app@%=6/6 other@%=1/1]"},
	}
	for i, st := range steps {
		st.do()
		if got := fmt.Sprint(chargeOf(c, "a")); got != st.want {
			t.Fatalf("step %d: chargeback %s, want %s", i, got, st.want)
		}
	}
}

// reportedRU is what req reports consumed of group.
func reportedRU(req *tokenpb.TokenRequest, group string) float64 {
	var n float64
	for _, g := range req.GetGroups() {
		if g.GetGroup() == group {
			n += g.GetConsumption().GetRru() + g.GetConsumption().GetWru()
		}
	}
	return n
}

// A statement reserves its estimate (TakeShare), a report goes out while
// it runs, then it settles far below the estimate: the bucket gets the
// difference back and rgserver hears the cost, never the reservation.
// (Recorded at the reservation, the 60 RU given back would wait in the
// report for later consumption to net against — forever, when the
// statement is the group's last — and rgserver would keep counting them.)
func TestSettleRecordsOnlyTheCost(t *testing.T) {
	for _, withPurse := range []bool{false, true} {
		t.Run(fmt.Sprintf("purse=%v", withPurse), func(t *testing.T) {
			c, _ := newTestClient(t, nil)
			ctx := context.Background()
			// Enough that the bucket spares a purse its advance (purseHeadroom).
			grantTokens(t, c, "a", 1e7, 0)
			var p *Purse
			if withPurse {
				p = &Purse{}
				// A first statement fills the purse, which then serves the next.
				if _, _, err := c.TakeShare(ctx, p, "a", rruOf(64), 64, time.Second); err != nil {
					t.Fatal(err)
				}
				c.Settle(p, "a", 0, rruOf(64))
				if purses(c) != 1 {
					t.Fatalf("no advance: %s", p)
				}
			}
			// held is the group's tokens in the bucket and the purse.
			held := func() float64 {
				n := tokensOf(c, "a")
				if p != nil {
					p.mu.Lock()
					n += p.tokens
					p.mu.Unlock()
				}
				return n
			}
			start := held()
			reported := 0.0
			report := func() {
				sweep(c)
				if req := build(c, true); req != nil {
					reported += reportedRU(req, "a")
					resp := &tokenpb.TokenResponse{RequestId: req.GetRequestId()}
					for _, g := range req.GetGroups() {
						resp.Grants = append(resp.Grants, &tokenpb.GroupGrant{Group: g.GetGroup(), Proxies: 1})
					}
					if err := c.applyResponse(resp); err != nil {
						t.Fatal(err)
					}
				}
			}
			report()
			reported = 0
			bucket := tokensOf(c, "a")
			if _, _, err := c.TakeShare(ctx, p, "a", rruOf(64), 2, time.Second); err != nil {
				t.Fatal(err)
			}
			if withPurse && tokensOf(c, "a") != bucket {
				t.Fatalf("the purse did not serve the statement: %s", p)
			}
			report() // while the statement runs
			if reported != 0 {
				t.Fatalf("a reservation was reported: %v RU", reported)
			}
			c.Settle(p, "a", 4-64, rruOf(4))
			if p != nil {
				c.ReturnPurse(p)
			}
			report()
			if !near(reported, 4) || !near(pendingOf(c, "a"), 0) {
				t.Errorf("reported %v RU (pending %v), want the cost, 4", reported, pendingOf(c, "a"))
			}
			if got := start - held(); !near(got, 4) {
				t.Errorf("the bucket paid %v, want 4", got)
			}
		})
	}
}
