package tokenclient

import (
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
)

// The MODE WARN shadow bucket: a group in WARN never waits, but the policy
// counts what ENFORCE would have done (rgproxy_would_wait_total,
// rgproxy_would_throttle_total) from WouldAcquire's answer, which comes
// from a second bucket per group that takes what ENFORCE would have taken.
// It is apart from the group's real bucket, which in WARN is unlimited.

// shadowBucket is a group's shadow bucket (groupState.shadow); guarded by
// groupTable.mu.
type shadowBucket struct {
	bucket Bucket
	on     bool // set up by a first WouldAcquire
}

// WouldAcquire tells, for a group in MODE WARN (which never waits), what
// AcquireShare would have done in ENFORCE: run at once, wait (for
// how long) or refuse. It keeps, per group, a shadow bucket filled at
// this proxy's fair share of RU_PER_SEC, capped as BURSTABLE says, which
// takes what ENFORCE would have taken, so the counts follow the same load
// in ENFORCE: the statement's tokens up front, then what Charge and
// ChargePurse settle after it ran (its measured cost beyond them). A
// refused statement takes nothing, unless onDebt says that ENFORCE would
// have run it on its session's debt (inside a transaction), which the
// session repays from the bucket later: it takes its tokens then.
func (c *Client) WouldAcquire(group string, cons ru.Consumption, required float64, maxWait time.Duration, onDebt bool) (wait time.Duration, refused bool) {
	group = resourcegroup.NormalizeName(group)
	now := c.clk.Now()
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	g, ok := c.cache.definition(group)
	if !ok || g.RUPerSec == resourcegroup.Unlimited || g.Burst == resourcegroup.BurstUnlimited {
		return 0, false
	}
	gs := c.groups.stateLocked(group, now)
	rate := float64(g.RUPerSec) / float64(max(gs.proxies, 1))
	burst := rate * g.Burst.CapacitySeconds()
	sb := &gs.shadow.bucket
	if !gs.shadow.on || sb.FillRate(now) != rate {
		if !gs.shadow.on {
			sb.Reconfigure(now, burst, rate, burst, 0) // starts full, as a fresh bucket would
		} else {
			sb.Reconfigure(now, 0, rate, burst, 0)
			// A lowered RU_PER_SEC (the WARN rehearsal of a tighter
			// limit) lowers the capacity: the shadow keeps no more than a
			// bucket of the new rate holds, else what the old rate saved
			// would hide the new limit for a long while.
			if t := sb.Tokens(now); t > burst {
				sb.Take(now, t-burst)
			}
		}
		gs.shadow.on = true
	}
	n := max(cons.RU(), 0)
	required = min(max(required, 0), n)
	if w, ok := sb.Reserve(now, n, maxWait); ok {
		return w, false
	}
	if required < n && sb.CanReserve(now, required, maxWait) {
		sb.Take(now, n)
		return min(durationOf(-sb.Tokens(now)/rate), maxWait), false
	}
	if onDebt {
		sb.Take(now, n)
	}
	return 0, true
}

// shadowTakeLocked takes n RU (a refund when negative) from the group's
// shadow bucket, once WouldAcquire set it up. groupTable.mu is held.
func (gs *groupState) shadowTakeLocked(now time.Time, n float64) {
	if gs.shadow.on {
		gs.shadow.bucket.Take(now, n)
	}
}

// shadowCharge is shadowTakeLocked for a charge a purse settled.
func (c *Client) shadowCharge(group string, n float64) {
	group = resourcegroup.NormalizeName(group)
	now := c.clk.Now()
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	if gs, ok := c.groups.byName[group]; ok {
		gs.shadowTakeLocked(now, n)
	}
}
