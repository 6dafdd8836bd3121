package tokenclient

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
)

// Acquiring: how a statement takes its group's tokens. AcquireShare is the
// one way in: a purse first (purse.go), else the group's bucket, where the
// statements that must wait queue in arrival order and a reservation
// sleeps until the fill has paid it. Charge is the post-charge after the
// statement, and Share what one proxy may spend of a group, read under the
// same lock as the statement's tokens.

// AcquireShare pre-charges cons.RU() tokens of group, waiting at most
// maxWait, and returns the group's Share as it stood when the statement
// got its tokens or was refused, read under the same lock (the policy
// needs both for every statement), and how long it waited.
//
// cons.RU() may hold an estimate of what the statement will cost: it is
// all taken, but only its required part (today's before-cost; cons.RU()
// when nothing is estimated) can get the statement refused. It fails fast
// with an error wrapping ErrThrottled when the estimated wait already
// exceeds maxWait or when maxWait passes first; nothing is then charged
// nor recorded, nor counted as throttled: a caller that refuses the
// statement counts it (CountThrottled), one that runs it anyway (inside a
// transaction) must pay for it (Charge, or later, as a session's debt). When the whole cannot be paid within
// maxWait but the required part can, the statement waits until the fill
// has paid what it took or maxWait has passed, whichever is first, and the
// rest stays as debt that later statements repay: an estimate never
// refuses a statement that its required cost alone would have run. When
// ctx ends first it returns ctx's error (the client is gone: not counted
// as throttled). On success cons is recorded for reporting. An error
// wrapping ErrUnknownGroup means rgserver dropped the group.
//
// With a purse (nil: none), the statement takes its tokens from the purse
// when it can, and may fill the purse with an advance when it takes them
// from the bucket.
func (c *Client) AcquireShare(ctx context.Context, p *Purse, group string, cons ru.Consumption, required float64, maxWait time.Duration) (Share, time.Duration, error) {
	return c.takeShare(ctx, p, group, cons, true, required, maxWait)
}

// TakeShare is AcquireShare that records nothing: it takes cons.RU() of
// the group's tokens, and the caller records what the statement consumed
// once it is known (Settle). A statement's prepaid cost is only a
// reservation: recorded at once, a part of it given back later could
// reach rgserver only netted against later consumption, and a group
// whose last statement gave some back would stay counted for it.
func (c *Client) TakeShare(ctx context.Context, p *Purse, group string, cons ru.Consumption, required float64, maxWait time.Duration) (Share, time.Duration, error) {
	return c.takeShare(ctx, p, group, cons, false, required, maxWait)
}

func (c *Client) takeShare(ctx context.Context, p *Purse, group string, cons ru.Consumption, record bool, required float64, maxWait time.Duration) (Share, time.Duration, error) {
	if p != nil {
		if sh, ok := p.take(group, cons, record, c.cache.gen.Load()); ok {
			return sh, 0, nil
		}
	}
	var sh Share
	waited, err := c.acquire(ctx, group, cons, record, required, maxWait, &sh, p)
	return sh, waited, err
}

// acquire is AcquireShare's path through the group's bucket: *share is
// set as AcquireShare returns it, and p, when not nil, is settled and may
// be filled; record: cons is recorded as consumed.
func (c *Client) acquire(ctx context.Context, group string, cons ru.Consumption, record bool, required float64, maxWait time.Duration, share *Share, p *Purse) (time.Duration, error) {
	named := group
	group = resourcegroup.NormalizeName(group)
	n := max(cons.RU(), 0)
	required = min(max(required, 0), n)
	start := c.clk.Now()
	c.groups.mu.Lock()
	if p != nil && p.listed {
		// The purse could not serve the statement: what it spent is
		// recorded, what is left goes back, before the bucket is asked.
		c.groups.dropPurseLocked(p, start)
	}
	gs := c.groups.useLocked(group, start)
	// me is this statement's place in gs.queue once it had to wait: the
	// group's waiting statements take their tokens in arrival order, so
	// that one session's retries cannot keep getting ahead of another's.
	var me *queued
	unregister := func() {
		if me != nil {
			gs.addWaiting(c.clk.Now(), -n)
			gs.dequeue(me)
			me = nil
		}
	}
	for now := start; ; now = c.clk.Now() {
		waited := now.Sub(start)
		c.groups.refreshLocked(now)
		if gs.dead {
			unregister()
			c.groups.mu.Unlock()
			return waited, fmt.Errorf("%w: %q", ErrUnknownGroup, group)
		}
		remaining := max(maxWait-waited, 0)
		var wait time.Duration
		ok := false
		if len(gs.queue) == 0 || gs.queue[0] == me {
			wait, ok = gs.bucket.Reserve(now, n, remaining)
			if !ok && required < n && gs.bucket.CanReserve(now, required, remaining) {
				// More than the wait can pay, but the required part fits:
				// pay what the wait can, the rest is debt.
				gs.bucket.Take(now, n)
				wait, ok = min(gs.repayTime(now), remaining), true
			}
		}
		c.groups.pollLowLocked(gs)
		if ok {
			unregister()
			if wait > 0 {
				// Sleeping on a reservation is waiting too: it counts in the
				// demand that splits the fill rate between proxies.
				gs.addWaiting(now, n)
				c.groups.mu.Unlock()
				err := c.sleep(ctx, wait)
				c.groups.mu.Lock()
				now = c.clk.Now()
				gs.addWaiting(now, -n)
				if err != nil {
					gs.bucket.Refund(now, n)
					c.groups.mu.Unlock()
					return now.Sub(start), fmt.Errorf("tokenclient: group %q: %w", group, err)
				}
				waited = now.Sub(start)
			}
			if record {
				gs.record(now, cons)
			}
			gs.lastUsed = now
			if c.groups.byName[group] == gs { // a forgotten group's series stay deleted
				gs.waitObs.Observe(waited.Seconds())
			}
			*share = c.groups.shareLocked(group)
			if p != nil && wait == 0 && waited == 0 {
				c.groups.fillPurseLocked(p, gs, named, now, n, *share)
			}
			c.groups.mu.Unlock()
			return waited, nil
		}
		// Fail fast only when even the best case cannot pay in time: the
		// whole group's RU_PER_SEC (this proxy's share may grow while it
		// waits), or the local refill in degraded mode.
		rate := float64(gs.ruPerSec)
		if c.groups.degraded {
			rate = gs.bucket.FillRate(now)
		}
		short := required - gs.bucket.Tokens(now)
		if remaining <= 0 || (rate > 0 && short/rate > remaining.Seconds()) {
			unregister()
			*share = c.groups.shareLocked(group)
			c.groups.mu.Unlock()
			return waited, fmt.Errorf("%w: group %q needs %.2f RU, more than %v can supply", ErrThrottled, group, n, maxWait)
		}
		if me == nil {
			gs.addWaiting(now, n)
			gs.want = true
			me = &queued{}
			gs.queue = append(gs.queue, me)
			c.groups.kickLocked()
		}
		retry := remaining
		if wait > 0 && wait < retry {
			retry = wait
		}
		ch := gs.notify
		c.groups.mu.Unlock()
		t := c.clk.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			c.groups.mu.Lock()
			unregister()
			c.groups.mu.Unlock()
			return c.clk.Now().Sub(start), fmt.Errorf("tokenclient: group %q: %w", group, ctx.Err())
		case <-ch:
		case <-t.C():
		}
		t.Stop()
		c.groups.mu.Lock()
	}
}

// sleep waits d on the client's clock or until ctx ends.
func (c *Client) sleep(ctx context.Context, d time.Duration) error {
	t := c.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}

// repayTime is how long the group's fill needs to pay its bucket's debt
// back, at the current fill or, between trickles, at this proxy's share
// of the group's rate.
func (gs *groupState) repayTime(now time.Time) time.Duration {
	debt := -gs.bucket.Tokens(now)
	if debt <= 0 {
		return 0
	}
	rate := gs.bucket.FillRate(now)
	if rate <= 0 {
		rate = gs.shareRate
	}
	if rate <= 0 && gs.ruPerSec > 0 {
		rate = float64(gs.ruPerSec) / float64(max(gs.proxies, 1))
	}
	if rate <= 0 {
		return maxDuration
	}
	return durationOf(debt / rate)
}

// queued is a statement's place in its group's queue of waiting
// statements; only its identity matters (not zero-sized, so that two
// places never share an address).
type queued struct{ _ byte }

// dequeue removes q from gs's queue; when q was first, the statements
// behind it retry at once (the next one may take its tokens now).
func (gs *groupState) dequeue(q *queued) {
	for i, x := range gs.queue {
		if x == q {
			gs.queue = slices.Delete(gs.queue, i, i+1)
			if i == 0 && len(gs.queue) > 0 {
				gs.wake()
			}
			return
		}
	}
}

// wake lets the statements waiting on gs retry.
func (gs *groupState) wake() {
	close(gs.notify)
	gs.notify = make(chan struct{})
}

// Charge post-charges cons.RU() to group with debt allowed (a negative RU
// is a refund) and records cons for reporting. It never blocks.
func (c *Client) Charge(group string, cons ru.Consumption) { c.Settle(nil, group, cons.RU(), cons) }

// ChargePurse is Charge that settles in the purse when it can (p nil:
// Charge).
func (c *Client) ChargePurse(p *Purse, group string, cons ru.Consumption) {
	c.Settle(p, group, cons.RU(), cons)
}

// Settle takes tokens RU from group's bucket with debt allowed (negative
// gives them back) and records rec as consumed, for reporting, the demand
// and the usage history; in the purse p when it can (nil: none). Taking
// and recording are apart so that a statement's reservation (TakeShare)
// and its settlement move tokens while only its cost, once known, is
// recorded: recorded figures then never go negative. It never blocks.
func (c *Client) Settle(p *Purse, group string, tokens float64, rec ru.Consumption) {
	if p != nil {
		if ok, shadow := p.spend(group, tokens, rec, c.cache.gen.Load()); ok {
			if shadow {
				c.shadowCharge(group, tokens)
			}
			return
		}
	}
	group = resourcegroup.NormalizeName(group)
	now := c.clk.Now()
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	c.groups.refreshLocked(now)
	gs, ok := c.groups.byName[group]
	if !ok {
		if !c.groups.servesLocked(group) {
			return // dropped meanwhile: nothing to charge, no state to revive
		}
		gs = c.groups.stateLocked(group, now)
	}
	if now.After(gs.lastUsed) {
		gs.lastUsed = now
	}
	if tokens != 0 {
		gs.bucket.Take(now, tokens)
		gs.shadowTakeLocked(now, tokens)
	}
	if !rec.IsZero() {
		gs.record(now, rec)
	}
	c.groups.pollLowLocked(gs)
}

// CountThrottled counts a statement of group that the caller refused
// (8252) as throttled: rgproxy_throttled_total, USAGE's THROTTLED and the
// next report's throttled; estimate, the RU it would have cost, goes in
// the report's denied_ru. AcquireShare does not count its ErrThrottled
// answers itself: a caller may still run the statement (inside a
// transaction, on its session's debt), and only a refusal is throttled.
func (c *Client) CountThrottled(group string, estimate float64) {
	c.count(group, func(t *groupTable, gs *groupState) {
		t.throttledLocked(gs)
		gs.counts.deniedRU += validRU(estimate)
	})
}

// CountRefused counts a statement of group refused before it ran other
// than by 8252 (a budget's REFUSE): the next report's refused, and its
// estimate in denied_ru.
func (c *Client) CountRefused(group string, estimate float64) {
	c.count(group, func(_ *groupTable, gs *groupState) {
		gs.counts.refused++
		gs.counts.deniedRU += validRU(estimate)
	})
}

// CountWaited adds the estimate of a statement of group that had to wait
// for its tokens before it ran to the next report's waited_ru (the demand
// that waited). Only a statement that waited calls it: it sleeps anyway.
func (c *Client) CountWaited(group string, estimate float64) {
	c.count(group, func(_ *groupTable, gs *groupState) { gs.counts.waitedRU += validRU(estimate) })
}

// count runs f on group's state under the groups' lock, unless the group
// was dropped lately.
func (c *Client) count(group string, f func(*groupTable, *groupState)) {
	group = resourcegroup.NormalizeName(group)
	now := c.clk.Now()
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	if !c.groups.servesLocked(group) {
		return
	}
	gs := c.groups.useLocked(group, now)
	gs.startReport(now)
	f(c.groups, gs)
}

// validRU is an estimate as a report may carry it: negative, NaN and
// infinite ones count as 0.
func validRU(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 1) {
		return 0
	}
	return v
}

func (t *groupTable) throttledLocked(gs *groupState) {
	gs.throttled++
	gs.counts.throttled++
	t.met.throttled.WithLabelValues(gs.name).Inc()
}

// Share is what one proxy may spend of a group, from its settings and the
// last grant (AcquireShare returns it). A group the client does not know
// is unlimited.
type Share struct {
	// Rate is this proxy's share of the group's RU_PER_SEC, in RU/s: the
	// larger of its last granted share of the fill and RU_PER_SEC divided
	// by the proxies using the group.
	Rate float64
	// BurstSeconds is the group's bucket capacity in seconds of its rate
	// (BurstMode.CapacitySeconds): 1 with BURSTABLE OFF, 10 with
	// MODERATED, +Inf with UNLIMITED (then Unlimited is set too).
	BurstSeconds float64
	// Proxies is how many proxies use the group (from the last grant; 1
	// before the first).
	Proxies uint32
	// Unlimited: the group is never throttled (also in MODE WARN or OFF).
	Unlimited bool
	// Mode is the group's MODE.
	Mode resourcegroup.Mode
	// MaxConcurrency is this proxy's part of the group's MAX_CONCURRENCY,
	// ceil(n ÷ Proxies); 0 = no cap.
	MaxConcurrency int
	// Tokens is the group's local bucket when the share was read:
	// negative is what the group owes (statements that cost more than
	// they prepaid, reservations being slept on), which a refusal names.
	// 0 when Unlimited or the group is not in use here.
	Tokens float64
}

func (t *groupTable) shareLocked(group string) Share {
	g, ok := t.cache.definition(group)
	if !ok {
		return Share{Unlimited: true, Proxies: 1}
	}
	sh := Share{BurstSeconds: g.Burst.CapacitySeconds(), Proxies: 1, Mode: g.Mode, Unlimited: t.unlimitedLocked(g)}
	capped := t.heldToServiceLimitLocked(g)
	if capped {
		sh.BurstSeconds = 1 // rgserver runs it as BURSTABLE OFF at its ceiling
	}
	gs, used := t.byName[group]
	if used {
		sh.Proxies = max(gs.proxies, 1)
		sh.Unlimited = sh.Unlimited || gs.bucket.Unlimited()
	}
	if g.MaxConcurrency > 0 {
		n := uint64(sh.Proxies)
		sh.MaxConcurrency = int(min((g.MaxConcurrency+n-1)/n, 1<<31))
	}
	if sh.Unlimited {
		return sh
	}
	if used {
		sh.Rate = gs.shareRate
		sh.Tokens = gs.bucket.Tokens(t.clk.Now())
	}
	if !capped {
		sh.Rate = max(sh.Rate, float64(g.RUPerSec)/float64(sh.Proxies))
	}
	return sh
}
