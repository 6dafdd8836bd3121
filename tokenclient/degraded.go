package tokenclient

import (
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// Degraded mode: when rgserver has granted nothing for
// Config.DegradedAfter (stream down, or requests unanswered), every
// group's bucket refills itself locally at RU_PER_SEC ÷ proxies, so that
// statements keep running at about their fair share. The first answer
// from rgserver ends it (stream.go). A client that starts without rgserver
// starts degraded, on the cached snapshot (Client.Start).
//
// The bridge: from the loss of the token stream until degraded mode, a
// group whose granted trickle has run out goes on filling at its last
// share of the fill rate (the grant's fill_rate), up to its share of the
// capacity, as rgserver's next trickle would most likely have: the group
// keeps running near its share, never above it, where it ran nothing for
// DegradedAfter (13, 5, then 0 statements/s of its 14).

// Degraded reports whether the client refills buckets locally because
// rgserver has not granted tokens for Config.DegradedAfter.
func (c *Client) Degraded() bool {
	now := c.clk.Now()
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	c.groups.refreshLocked(now)
	return c.groups.degraded
}

// refreshLocked ends expired demand holds and enters degraded mode when
// rgserver has been silent too long (as the token stream's status says).
func (t *groupTable) refreshLocked(now time.Time) {
	t.expireHoldsLocked(now)
	if t.degraded {
		return
	}
	silentSince := t.stream.status().silentSince
	if !silentSince.IsZero() && now.Sub(silentSince) >= t.cfg.DegradedAfter {
		t.enterDegradedLocked(now)
		t.log.Warn("no token grant from rgserver: degraded mode, refilling locally",
			"silent_for", now.Sub(silentSince).String())
	}
}

// tickLocked is the stream loop's housekeeping at now: refreshLocked, and
// the bridge while the stream is lost (here rather than in refreshLocked,
// which every statement calls: the bridge walks the groups in use). The
// stream's status is read under t.mu: a stream that answers meanwhile
// ends the bridge in its own step under t.mu, after this one
// (applyResponse).
func (t *groupTable) tickLocked(now time.Time) {
	t.refreshLocked(now)
	if st := t.stream.status(); !st.connected && !t.degraded {
		t.bridgeLocked(now, st.lostAt)
	}
}

// bridgeLocked starts the bridge (see above) of every group whose trickle
// has ended since the stream was lost, or that had none: from then (the
// tokens of the time since are added at once, up to the cap), at its last
// share rate; lostAt is when the stream was lost. A group idle for releaseAfter (its saved tokens given back)
// is bridged only once a statement uses it again.
func (t *groupTable) bridgeLocked(now, lostAt time.Time) {
	for _, gs := range t.byName {
		if gs.bridging || !gs.granted || gs.dead || gs.unavailable || gs.bucket.Unlimited() || gs.shareRate <= 0 ||
			gs.trickleUntil.After(now) || now.Sub(gs.lastUsed) >= releaseAfter {
			continue
		}
		from := lostAt
		if gs.trickleUntil.After(from) {
			from = gs.trickleUntil
		}
		rate, burst := gs.shareRate, gs.holdCap
		since := rate * max(now.Sub(from).Seconds(), 0)
		if burst > 0 {
			since = min(since, max(burst-gs.bucket.Tokens(now), 0))
		}
		gs.bucket.Reconfigure(now, since, rate, burst, gs.threshold(now))
		gs.trickleUntil = time.Time{}
		gs.bridging = true
		gs.wake()
	}
}

// endBridgeLocked stops the bridge of every group when rgserver answers
// again: their buckets stop filling and they ask at once.
func (t *groupTable) endBridgeLocked(now time.Time) {
	for _, gs := range t.byName {
		if !gs.bridging {
			continue
		}
		gs.bridging = false
		gs.bucket.Reconfigure(now, 0, 0, 0, gs.threshold(now))
		gs.want = true
		t.kickLocked()
	}
}

func (t *groupTable) enterDegradedLocked(now time.Time) {
	t.degraded = true
	for _, gs := range t.byName {
		t.localRefillLocked(now, gs)
	}
}

// localRefillLocked makes gs fill itself at RU_PER_SEC ÷ proxies (from the
// last grant, 1 if unknown), with the burst of its BURSTABLE mode.
func (t *groupTable) localRefillLocked(now time.Time, gs *groupState) {
	g, known := t.cache.definition(gs.name)
	var throttle uint64
	if t.budgets != nil {
		throttle = t.budgets.throttle(gs.name, now)
	}
	if known && isUnlimited(g) && throttle == 0 {
		gs.bucket.SetUnlimited(true)
		gs.wake()
		return
	}
	perSec := gs.ruPerSec
	if known {
		perSec = g.RUPerSec
	}
	if throttle > 0 && (perSec == 0 || perSec == resourcegroup.Unlimited || perSec > throttle) {
		perSec = throttle // a budget's THROTTLE holds while rgserver is away
	}
	proxies := max(gs.proxies, 1)
	rate := float64(perSec) / float64(proxies)
	burst := rate // BURSTABLE OFF: 1 s of rate
	if known {
		burst = rate * g.Burst.CapacitySeconds()
	}
	gs.bucket.SetUnlimited(false)
	gs.bucket.Reconfigure(now, 0, rate, burst, gs.threshold(now))
	gs.trickleUntil = time.Time{}
	gs.bridging = false
	gs.wake()
}
