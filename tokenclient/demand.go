package tokenclient

import (
	"math"
	"sort"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
)

// Demand: what the proxy wants of a group, in RU/s, sent with every
// request so that rgserver splits the group's fill rate between proxies
// in proportion to it; the EWMA of consumption, the RU of statements
// waiting (also held by HoldDemand for a refused statement), the notify
// threshold it sets on the bucket, and the usage ring behind SHOW RESOURCE
// GROUP USAGE.

// holdFor is how long a refused statement's RU counts as its group's
// waiting demand (HoldDemand) when its session sends nothing more: a
// client that retries comes back within it, one that went quiet stops
// weighing on the split of the fill rate between proxies.
const holdFor = 2 * time.Second

// DemandHold is the RU of a session's refused statement, held as its
// group's waiting demand (HoldDemand). A session owns one; the zero value
// holds nothing. It is used under the groups' lock (groupTable.mu) only.
type DemandHold struct {
	group string
	ru    float64
	until time.Time
}

// heldDemand is an entry of the client's hold list, oldest first.
type heldDemand struct {
	h     *DemandHold
	until time.Time
}

// HoldDemand makes h hold ru of group's waiting demand, as a statement
// waiting for tokens counts, without waiting, in place of what h held.
// The policy holds the RU of a session's refused statement: a client
// refused and retrying still wants its statement, so the fill rate keeps
// being split by the clients that want it, not by those that happened to
// get in. The hold ends at ReleaseDemand (the session's next statement,
// or its end) or after holdFor, whichever comes first; meanwhile it is
// averaged into the demand like any waiting statement.
func (c *Client) HoldDemand(h *DemandHold, group string, ru float64) {
	group = resourcegroup.NormalizeName(group)
	now := c.clk.Now()
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	c.groups.releaseDemandLocked(h, now)
	if ru <= 0 || math.IsInf(ru, 0) || math.IsNaN(ru) || !c.groups.servesLocked(group) {
		return
	}
	gs := c.groups.stateLocked(group, now)
	gs.addWaiting(now, ru)
	gs.heldRU += ru
	gs.want = true
	c.groups.kickLocked()
	*h = DemandHold{group: group, ru: ru, until: now.Add(holdFor)}
	c.groups.holds = append(c.groups.holds, heldDemand{h: h, until: h.until})
}

// ReleaseDemand ends what h holds, if anything (a hold may have expired).
func (c *Client) ReleaseDemand(h *DemandHold) {
	now := c.clk.Now()
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	c.groups.releaseDemandLocked(h, now)
}

func (t *groupTable) releaseDemandLocked(h *DemandHold, at time.Time) {
	if h.ru == 0 {
		return
	}
	if gs, ok := t.byName[h.group]; ok {
		gs.addWaiting(at, -h.ru)
		gs.heldRU = max(gs.heldRU-h.ru, 0)
	}
	*h = DemandHold{}
}

// expireHoldsLocked ends the holds older than holdFor, each as of its
// end; the stream loop calls it every tick.
func (t *groupTable) expireHoldsLocked(now time.Time) {
	n := 0
	for _, e := range t.holds {
		if !e.until.After(now) {
			if e.h.ru != 0 && e.h.until.Equal(e.until) {
				t.releaseDemandLocked(e.h, e.until)
			}
			n++
			continue
		}
		break
	}
	if n > 0 {
		t.holds = append(t.holds[:0], t.holds[n:]...)
	}
	// Entries whose hold was released or replaced are dropped when they
	// expire; bound the list against many replacements within holdFor.
	if len(t.holds) > 4096 {
		kept := t.holds[:0]
		for _, e := range t.holds {
			if e.h.ru != 0 && e.h.until.Equal(e.until) {
				kept = append(kept, e)
			}
		}
		t.holds = kept
	}
}

// pollLowLocked turns the bucket's one-shot low-tokens signal into a
// request at the next send.
func (t *groupTable) pollLowLocked(gs *groupState) {
	if gs.bucket.NeedsTokens() {
		gs.want = true
		t.kickLocked()
	}
}

func (t *groupTable) kickLocked() {
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// threshold is the notify threshold at now: demand × notifyLead, at most
// holdCap (a bucket that holds its capacity does not ask, however busy the
// group was a moment ago).
func (gs *groupState) threshold(now time.Time) float64 {
	t := gs.demand(now) * notifyLead.Seconds()
	if gs.holdCap > 0 {
		t = min(t, gs.holdCap)
	}
	return t
}

// holdCapLocked is gs's share of its group's capacity: this proxy's rate
// (as Share reports it) × the BURSTABLE seconds; 0 for a group whose
// settings are unknown or that is never throttled.
func (t *groupTable) holdCapLocked(gs *groupState) float64 {
	g, ok := t.cache.definition(gs.name)
	if !ok || t.unlimitedLocked(g) {
		return 0
	}
	if t.heldToServiceLimitLocked(g) {
		return gs.shareRate // 1 s of what rgserver's ceiling gives it here
	}
	rate := max(gs.shareRate, float64(g.RUPerSec)/float64(max(gs.proxies, 1)))
	return rate * g.Burst.CapacitySeconds()
}

// demand is what the proxy wants for the group at now, in RU/s: the
// larger of the EWMA of consumed RU/s (or the rate since its last sample
// when that is higher, so a rise counts within a tick rather than a second)
// and the RU of the statements waiting or sleeping on a reservation,
// averaged since the last report and counted as wanted within waitLead.
//
// Under throttling consumption equals the grant, so it must not decide the
// split between proxies (a proxy that once got more would keep more); the
// waiting part, the larger then, does: with shares in proportion to
// demand, each proxy's share is its part of all waiting statements — its
// part of the clients under closed-loop load.
func (gs *groupState) demand(now time.Time) float64 {
	rate := gs.ewma
	if el := now.Sub(gs.ewmaAt); el >= tick {
		rate = max(rate, gs.ewmaAcc/el.Seconds())
	}
	return max(rate, gs.avgWaiting(now)/waitLead.Seconds(), 0)
}

// reportedDemand is the demand a message tells rgserver for gs: demand,
// but 0 for a quiet group that asks for nothing while rgserver shares a
// rate above the group's own (shares, see sharesLocked): the EWMA would
// go on claiming its past rate for seconds, and rgserver would keep its
// part of the service limit or of its parent's rate from the groups still
// running. An ask always carries demand: its tokens are sized by it.
// Called with t.mu held.
func (t *groupTable) reportedDemandLocked(gs *groupState, now time.Time, ask bool) float64 {
	if !ask && gs.quiet(now) && t.sharesLocked(gs) {
		return 0
	}
	return gs.demand(now)
}

// sharesLocked reports whether rgserver shares a rate above gs's own by
// the groups' demands: a service limit is in force, or the group has a
// PARENT. Called with t.mu held.
func (t *groupTable) sharesLocked(gs *groupState) bool {
	if t.serviceLimited {
		return true
	}
	g, ok := t.cache.group(gs.name)
	return ok && g.Parent != ""
}

// quiet reports whether no statement of the group waits and none used it
// (ran, or was refused) for quietAfter. The demand refused statements
// hold (HoldDemand) does not count: a client that retries after 8252
// uses the group again within it, one that stopped should not keep the
// group's part of the service limit for holdFor.
func (gs *groupState) quiet(now time.Time) bool {
	return len(gs.queue) == 0 && gs.waiting-gs.heldRU <= 1e-9 && now.Sub(gs.lastUsed) >= quietAfter
}

// addWaiting changes the RU of waiting statements by d at now.
func (gs *groupState) addWaiting(now time.Time, d float64) {
	gs.integrateWaiting(now)
	gs.waiting += d
	if gs.waiting < 1e-9 {
		gs.waiting = max(gs.waiting, 0)
	}
}

func (gs *groupState) integrateWaiting(now time.Time) {
	if gs.waitSince.IsZero() {
		gs.waitSince, gs.waitAt = now, now
	}
	if dt := now.Sub(gs.waitAt).Seconds(); dt > 0 {
		gs.waitArea += gs.waiting * dt
		gs.waitAt = now
	}
}

// avgWaiting is the time average of waiting since the last report, or the
// current value when no time has passed.
func (gs *groupState) avgWaiting(now time.Time) float64 {
	gs.integrateWaiting(now)
	if span := now.Sub(gs.waitSince).Seconds(); span > 0 {
		return max(gs.waitArea/span, 0)
	}
	return gs.waiting
}

// resetWaiting starts a new averaging window at now (after a report).
func (gs *groupState) resetWaiting(now time.Time) {
	gs.integrateWaiting(now)
	gs.waitArea, gs.waitSince = 0, now
}

// startReport starts the time the next report covers at now when nothing
// is pending, and notes now as its last figure's: a report covers the time
// its figures came in, not the idle time before or after them, so that
// the usage history spreads them where they happened.
func (gs *groupState) startReport(now time.Time) {
	if !gs.hasReport() {
		gs.reportFrom = now
	}
	gs.lastFigure = now
}

// record adds cons to what is reported and to the demand and usage figures.
func (gs *groupState) record(now time.Time, cons ru.Consumption) {
	gs.startReport(now)
	gs.pending.Add(cons)
	gs.ewmaAcc += cons.RU()
	gs.usage.add(now, cons.RU(), cons.Statements)
}

// updateEWMA folds the consumption since the last sample into the EWMA
// once per ewmaInterval; idle intervals decay it.
func (gs *groupState) updateEWMA(now time.Time) {
	el := now.Sub(gs.ewmaAt)
	if el < ewmaInterval {
		return
	}
	rate := gs.ewmaAcc / el.Seconds()
	if gs.ewmaSampled {
		gs.ewma = ewmaAlpha*rate + (1-ewmaAlpha)*gs.ewma
	} else {
		gs.ewma = rate // the first sample: no history to average with
		gs.ewmaSampled = true
	}
	gs.ewmaAcc = 0
	gs.ewmaAt = now
}

// GroupUsage is one group's live state on this proxy (SHOW RESOURCE GROUP
// USAGE).
type GroupUsage struct {
	// Group is the group's name.
	Group string
	// RUPerSec is the RU consumed per second on this proxy over the last
	// 10 s.
	RUPerSec float64
	// Tokens is what the local bucket holds; negative is debt.
	Tokens float64
	// Unlimited: the group is never throttled (Tokens is meaningless).
	Unlimited bool
	// Throttled counts the statements refused by AcquireShare (or counted
	// by CountThrottled) since start.
	Throttled uint64
	// Degraded: the proxy refills the group locally (rgserver unreachable).
	Degraded bool
}

// Usage returns, sorted by name, every group known from the settings cache or
// used on this proxy, with its live state at now.
func (c *Client) Usage(now time.Time) []GroupUsage {
	c.groups.mu.Lock()
	c.groups.refreshLocked(now)
	degraded := c.groups.degraded
	out := make([]GroupUsage, 0, len(c.groups.byName))
	seen := map[string]bool{}
	for name, gs := range c.groups.byName {
		seen[name] = true
		out = append(out, GroupUsage{
			Group:     name,
			RUPerSec:  gs.usage.rate(now),
			Tokens:    gs.bucket.Tokens(now),
			Unlimited: gs.bucket.Unlimited(),
			Throttled: gs.throttled,
			Degraded:  degraded,
		})
	}
	c.groups.mu.Unlock()
	// The groups defined and not in use, from the cache alone: one lock
	// at a time.
	c.cache.read(func(snap *snapshot) {
		for name, g := range snap.Groups {
			if !seen[name] {
				out = append(out, GroupUsage{Group: name, Unlimited: isUnlimited(g), Degraded: degraded})
			}
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out
}

// usageRing sums RU and statements in one-second slots over the last
// usageWindow seconds.
type usageRing struct {
	slots [usageWindow]usageSlot
	sec   int64 // Unix second of the newest slot
}

type usageSlot struct{ ru, statements float64 }

func (u *usageRing) advance(now time.Time) {
	s := now.Unix()
	if s <= u.sec {
		return
	}
	if s-u.sec >= usageWindow {
		u.slots = [usageWindow]usageSlot{}
	} else {
		for i := u.sec + 1; i <= s; i++ {
			u.slots[i%usageWindow] = usageSlot{}
		}
	}
	u.sec = s
}

func (u *usageRing) add(now time.Time, ru, statements float64) {
	u.advance(now)
	if now.Unix() == u.sec {
		sl := &u.slots[u.sec%usageWindow]
		sl.ru += ru
		sl.statements += statements
	}
}

// rate is the RU consumed per second over the window that ends at now.
func (u *usageRing) rate(now time.Time) float64 {
	r, _ := u.rates(now)
	return r
}

// rates are the RU and the statements per second over the window that
// ends at now.
func (u *usageRing) rates(now time.Time) (ru, statements float64) {
	u.advance(now)
	for _, sl := range u.slots {
		ru += sl.ru
		statements += sl.statements
	}
	return math.Max(ru, 0) / usageWindow, math.Max(statements, 0) / usageWindow
}
