package tokenclient

import "time"

// Degraded mode: when rgserver has granted nothing for
// Config.DegradedAfter (stream down, or requests unanswered), every
// group's bucket refills itself locally at RU_PER_SEC ÷ proxies, so that
// statements keep running at about their fair share. The first answer
// from rgserver ends it (stream.go). A client that starts without rgserver
// starts degraded, on the cached snapshot (Client.Start).

// Degraded reports whether the client refills buckets locally because
// rgserver has not granted tokens for Config.DegradedAfter.
func (c *Client) Degraded() bool {
	now := c.clk.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshLocked(now)
	return c.degraded
}

// refreshLocked ends expired demand holds and enters degraded mode when
// rgserver has been silent too long.
func (c *Client) refreshLocked(now time.Time) {
	c.expireHoldsLocked(now)
	if c.degraded {
		return
	}
	silentSince := time.Time{}
	if !c.connected {
		silentSince = c.lostAt
	} else {
		for _, r := range c.outstanding {
			if silentSince.IsZero() || r.at.Before(silentSince) {
				silentSince = r.at
			}
		}
	}
	if !silentSince.IsZero() && now.Sub(silentSince) >= c.cfg.DegradedAfter {
		c.enterDegradedLocked(now)
		c.log.Warn("no token grant from rgserver: degraded mode, refilling locally",
			"silent_for", now.Sub(silentSince).String())
	}
}

func (c *Client) enterDegradedLocked(now time.Time) {
	c.degraded = true
	for _, gs := range c.groups {
		c.localRefillLocked(now, gs)
	}
}

// localRefillLocked makes gs fill itself at RU_PER_SEC ÷ proxies (from the
// last grant, 1 if unknown), with the burst of its BURSTABLE mode.
func (c *Client) localRefillLocked(now time.Time, gs *groupState) {
	g, known := c.settingsLocked(gs.name)
	if known && isUnlimited(g) {
		gs.bucket.SetUnlimited(true)
		gs.wake()
		return
	}
	perSec := gs.ruPerSec
	if known {
		perSec = g.RUPerSec
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
	gs.wake()
}
