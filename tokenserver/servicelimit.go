package tokenserver

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// The service limit is a cap on the RU/s of all groups together (the
// backend's capacity, `ALTER RESOURCE CONTROL SERVICE LIMIT`): a layer
// above the groups' buckets that gives each group with demand a ceiling
// on its RU/s, the ceilings adding up to at most the limit. Within it the
// groups are served as PD serves a keyspace's service limit: by PRIORITY
// level, high to low, each level's RU_PER_SEC first (its groups' fill
// rates, as far as they have demand; in proportion to them when the
// level's rates alone exceed what is left), then its burst demand (what
// groups that may run above RU_PER_SEC want beyond it) in proportion;
// lower levels get what is left, nothing once the limit is used. What
// no group wants is spread over the groups in proportion to their demand,
// so that a group whose demand grows finds room until the next rebalance.
//
// A ceiling lowers the bucket's effective settings (Bucket.eff): a
// limited group fills at min(RU_PER_SEC, ceiling) and its capacity
// follows; a group otherwise never throttled (RU_PER_SEC or BURSTABLE
// UNLIMITED) runs as a BURSTABLE OFF group at its ceiling, 0 until it
// has demand. Trickles, grants at once and the bucket's bound
// (rate × T + capacity) then work as for any group, so the sum of every
// group's trickles stays within the sum of the ceilings. MODE WARN and
// OFF groups are never throttled, by the service limit either, and do
// not count in it.
//
// The cost is O(groups with demand) per rebalance, every rebalanceEvery
// and when a group starts to have demand (at most every minRebalance),
// taken on a grant's path; a grant itself stays O(1). Nothing is done
// while no limit is set. The layer only reads a bucket's settings, demand
// and last request, and sets its ceiling: a later layer (a parent group's
// limit over its children) can share a parent's rate the same way.

// Timing of the service limit's rebalances.
const (
	// rebalanceEvery: demands move with the proxies' reports and asks
	// (a trickle lasts 2 s), so a few rebalances a second follow them.
	rebalanceEvery = 250 * time.Millisecond
	// minRebalance spaces the rebalances a group's first demand asks for,
	// so that 100,000 groups waking at once cost a few rebalances.
	minRebalance = 20 * time.Millisecond
	// activeFor: a group not heard from for this long has no demand for
	// the service limit (a consuming group's proxies report at least
	// every reportPeriod; one waiting for tokens asks every trickle).
	activeFor = reportPeriod + time.Second
	// serviceTick is how often the leader runs a rebalance that fell due
	// between requests (Allocator.RebalanceIfDue).
	serviceTick = 50 * time.Millisecond
)

// svcEntry is a bucket's part in the service limit's layer.
type svcEntry struct {
	// active: the bucket is in serviceLayer.active, at index idx.
	active bool
	idx    int
	// seen is when a proxy last sent a message for the group.
	seen time.Time
	// demand, fill and burst are what the last rebalance counted, and
	// level the group's priority level's index (levelOf).
	demand, fill, burst float64
	level               int
	// extra is a background group's part of what nobody asked for at
	// the last rebalance.
	extra float64
	// cap is the service limit's ceiling of the last rebalance (+Inf:
	// none), before the parents' layer (parents.go) lowers it.
	cap float64
}

// serviceLayer shares the service limit between the groups with demand.
type serviceLayer struct {
	// limit in RU/s; 0 = none.
	limit float64
	// active are the ENFORCE groups with demand lately.
	active []*Bucket
	// stale: a group joined since the last rebalance; last is that
	// rebalance's time, due the next one's at the latest.
	stale     bool
	last, due time.Time
	// fillSum is the sum of the RU_PER_SEC the groups promise (ENFORCE
	// groups with a finite rate), kept up to date by SetGroup and
	// RemoveGroup: above the limit, not every group can have its rate.
	fillSum float64
	// figures of the last rebalance.
	fig ServiceLimitFigures
	// groups is the allocator's map of buckets, where the parents' layer
	// finds a group's parent; nested counts the groups with a parent
	// (while there are some, the layer runs without a service limit too).
	groups map[string]*Bucket
	nested int
	// reask: for each proxy slot, the groups it is to ask again for
	// (setActiveCeil), until its token stream pushes them.
	reask map[string]map[string]struct{}
	// tree is the parents' layer's scratch (parents.go).
	tree treeScratch
}

// on reports whether the layer shares anything: a service limit is set
// or some group has a parent.
func (l *serviceLayer) on() bool { return l.limit > 0 || l.nested > 0 }

// ServiceLimitFigures describe the service limit's last rebalance.
type ServiceLimitFigures struct {
	// Limit is the service limit in RU/s (0: none).
	Limit float64
	// Demand is the groups' demand the limit was shared by (RU/s).
	Demand float64
	// Allocated is the sum of the ceilings given (RU/s): at most Limit.
	Allocated float64
	// Levels is what each priority level got of the limit (HIGH,
	// MEDIUM, LOW), RU/s: RU_PER_SEC first, then burst.
	Levels [numLevels]float64
	// Background is what the background groups got (RU/s): their
	// RU_PER_SEC before every level, beyond it what LOW left, each at
	// most its UTILIZATION_LIMIT of the limit.
	Background float64
	// Groups is how many groups had demand.
	Groups int
	// FillRates is the sum of the ENFORCE groups' RU_PER_SEC.
	FillRates float64
	// At is the rebalance's time.
	At time.Time
}

// numLevels is the number of PRIORITY levels; bgLevel is the background
// groups' place, after them (their RU_PER_SEC, their floor, is met
// before every level's).
const (
	numLevels = 3
	bgLevel   = numLevels
)

// levelOf is a priority's place in the order the limit is shared in:
// HIGH first, then MEDIUM, then LOW.
func levelOf(p resourcegroup.Priority) int {
	switch p {
	case resourcegroup.PriorityHigh:
		return 0
	case resourcegroup.PriorityLow:
		return 2
	}
	return 1
}

// promisedRate is the RU/s a group's definition promises: RU_PER_SEC of
// an ENFORCE group with a finite rate, else 0.
func promisedRate(s Settings) float64 {
	if s.Mode != resourcegroup.ModeEnforce || s.RUPerSec == resourcegroup.Unlimited {
		return 0
	}
	return float64(s.RUPerSec)
}

// mayBurst reports whether a group may run above RU_PER_SEC, so that its
// demand beyond it is burst demand: BURSTABLE = UNLIMITED, RU_PER_SEC =
// UNLIMITED (which promises nothing: all its demand is burst), or a
// BACKGROUND group (its RU_PER_SEC is a floor; beyond it, what the
// foreground leaves).
func mayBurst(s Settings) bool {
	return s.RUPerSec == resourcegroup.Unlimited || s.Burst == resourcegroup.BurstUnlimited || s.Background > 0
}

// effectiveUnder is what a group with settings s runs with under a
// ceiling of c RU/s (+Inf: none).
func effectiveUnder(s Settings, c float64) Settings {
	if math.IsInf(c, 1) || s.Mode != resourcegroup.ModeEnforce {
		return s
	}
	r := uint64(max(math.Floor(c), 0))
	if mayBurst(s) {
		s.RUPerSec, s.Burst = r, resourcegroup.BurstOff
		return s
	}
	if r < s.RUPerSec {
		s.RUPerSec = r
	}
	return s
}

// idleCeil is the ceiling of a group without demand: none, but for a
// group otherwise never throttled while a limit is set, which must ask
// (and gets its ceiling once it has demand).
func (l *serviceLayer) idleCeil(s Settings) float64 {
	if (l.limit > 0 || s.Parent != "") && s.Mode == resourcegroup.ModeEnforce && mayBurst(s) {
		return 0
	}
	return math.Inf(1)
}

// track is called after each of b's requests while the layer is on: b
// joins the groups with demand when it has some, and the limit is
// rebalanced when due. It reports whether b joined and the rebalance ran.
func (l *serviceLayer) track(b *Bucket, now time.Time) bool {
	joined := l.join(b)
	if b.svc.active && !(b.demand > 0) {
		// It stopped: what it had goes to the others at the next
		// rebalance, minRebalance away rather than rebalanceEvery.
		l.stale = true
	}
	if l.dueAt(now) {
		l.rebalance(now)
		return joined
	}
	return false
}

// dueAt reports whether a rebalance is due at now: rebalanceEvery
// passed, or a group joined or stopped at least minRebalance after the
// last one.
func (l *serviceLayer) dueAt(now time.Time) bool {
	return !now.Before(l.due) || (l.stale && now.Sub(l.last) >= minRebalance)
}

// RebalanceIfDue rebalances the service limit's layer at now when a
// rebalance is due (dueAt) and the layer is on. The leader calls it on a tick
// (serviceTick), so that a rebalance a stopped group made due is not
// left waiting for the next request. It reports whether it ran.
func (a *Allocator) RebalanceIfDue(now time.Time) bool {
	l := &a.svc
	if !l.on() || !l.dueAt(now) {
		return false
	}
	l.rebalance(now)
	return true
}

// join makes b one of the groups with demand when it has some; it
// reports whether b joined.
func (l *serviceLayer) join(b *Bucket) bool {
	if b.svc.active || !(b.demand > 0) || b.settings.Mode != resourcegroup.ModeEnforce {
		return false
	}
	b.svc.active, b.svc.idx = true, len(l.active)
	l.active = append(l.active, b)
	l.stale = true
	return true
}

// remove takes b out of the groups with demand.
func (l *serviceLayer) remove(b *Bucket) {
	if !b.svc.active {
		return
	}
	last := l.active[len(l.active)-1]
	l.active[b.svc.idx] = last
	last.svc.idx = b.svc.idx
	l.active[len(l.active)-1] = nil
	l.active = l.active[:len(l.active)-1]
	b.svc.active = false
}

// Proxies fed by a trickle ask again only when it nears its end, up to
// a trickle period after a rebalance moved their group's ceiling: a
// BACKGROUND group would reach the capacity the foreground left a second
// or two late, and run above its new ceiling as long when the foreground
// comes back. So when a rebalance moves an active group's ceiling, every
// proxy whose running trickle was granted under a rate at least
// reaskChange away from the new one is told to ask again now
// (TokenResponse.ask_again, pushed on its stream), once until it asks,
// and its next grant replaces the trickle at the new rate. Measured from
// the trickle's rate, not the ceiling before: a foreground whose proxies
// go quiet one by one moves the ceiling in steps (170, 200, 240 RU/s),
// each under reaskChange after the first, and trickles granted at 170
// ran on for up to a trickle period under 240.
const (
	// reaskChange is the least relative move of a ceiling worth a
	// message to each of the group's trickle-fed proxies.
	reaskChange = 0.2
	// maxReaskGroups bounds the groups waiting to be pushed to one proxy
	// (more wait for their own next ask); maxReaskProxies the proxies.
	maxReaskGroups  = 256
	maxReaskProxies = 4096
)

// setActiveCeil gives b, a group with demand, its ceiling c at now from
// a rebalance, and notes b for each trickle-fed proxy whose trickle was
// granted under a rate reaskChange or more away from b's new one.
func (l *serviceLayer) setActiveCeil(b *Bucket, c float64, now time.Time) {
	if b.ceil == c {
		return
	}
	b.setCeil(c, now)
	rate := float64(b.eff.RUPerSec)
	for id, s := range b.slots {
		if s.rate <= 0 || !s.trickleEnd.After(now) || s.told {
			continue
		}
		if !b.eff.Unlimited() && math.Abs(rate-s.under) < reaskChange*max(rate, s.under) {
			continue
		}
		groups := l.reask[id]
		if groups == nil {
			if len(l.reask) >= maxReaskProxies {
				continue
			}
			if l.reask == nil {
				l.reask = map[string]map[string]struct{}{}
			}
			groups = map[string]struct{}{}
			l.reask[id] = groups
		}
		if len(groups) < maxReaskGroups {
			groups[b.name] = struct{}{}
			s.told = true
		}
	}
}

// Reasks reports whether some proxy is to be told to ask again.
func (a *Allocator) Reasks() bool { return len(a.svc.reask) > 0 }

// TakeReasks returns the groups whose proxy slot is to ask again for
// (sorted), and forgets them.
func (a *Allocator) TakeReasks(slot string) []string {
	groups := a.svc.reask[slot]
	if len(groups) == 0 {
		return nil
	}
	delete(a.svc.reask, slot)
	names := make([]string, 0, len(groups))
	for g := range groups {
		names = append(names, g)
	}
	slices.Sort(names)
	return names
}

// setCeil gives b a ceiling of c RU/s at now.
func (b *Bucket) setCeil(c float64, now time.Time) {
	if c == b.ceil {
		return
	}
	b.ceil = c
	if eff := effectiveUnder(b.settings, c); eff != b.eff {
		b.setEff(eff, now)
	}
}

// rebalance shares the limit between the groups with demand at now.
func (l *serviceLayer) rebalance(now time.Time) {
	l.stale, l.last, l.due = false, now, now.Add(rebalanceEvery)
	fig := ServiceLimitFigures{Limit: l.limit, FillRates: l.fillSum, At: now}
	var fills, bursts [numLevels + 1]float64
	fgDemand := 0.0 // the foreground's, which what nobody asks for goes to
	for i := 0; i < len(l.active); {
		b := l.active[i]
		if b.demand <= 0 || now.Sub(b.svc.seen) > activeFor || b.settings.Mode != resourcegroup.ModeEnforce {
			l.remove(b)
			b.setCeil(l.idleCeil(b.settings), now)
			continue // the last one moved to i
		}
		// A group's demand counts up to what any proxy may claim,
		// scaled to the limit: a claim of 1e12 RU/s for an unlimited
		// group weighs like a saturated one.
		b.svc.demand = b.demand
		if l.limit > 0 {
			b.svc.demand = min(b.svc.demand, demandRateFactor*l.limit)
		}
		i++
	}
	// The parents' limits over their children (parents.go): a child's
	// demand counts for the service limit only up to its part of its
	// parents' pools, so that what a parent holds back goes to the
	// limit's other groups.
	pc := l.parentCeilings()
	for _, b := range l.active {
		e := &b.svc
		if c, ok := pc[b]; ok {
			e.demand = min(e.demand, c)
		}
		e.fill, e.extra = 0, 0
		if b.settings.RUPerSec != resourcegroup.Unlimited {
			e.fill = min(e.demand, float64(b.settings.RUPerSec))
		}
		e.burst = 0
		if mayBurst(b.settings) {
			e.burst = e.demand - e.fill
		}
		e.level = levelOf(b.settings.Priority)
		if b.settings.Background > 0 {
			e.level = bgLevel
		} else {
			fgDemand += e.demand
		}
		fills[e.level] += e.fill
		bursts[e.level] += e.burst
		fig.Demand += e.demand
	}
	// What each level's fill rates and bursts get, as a fraction of what
	// they ask.
	var fillPart, burstPart [numLevels + 1]float64
	left := l.limit
	part := func(ask float64) float64 {
		if ask <= 0 {
			return 0
		}
		f := min(left/ask, 1)
		left = max(left-ask*f, 0)
		return f
	}
	// The background groups' floors first, then each level's rates and
	// bursts, then what the background groups want beyond their floors:
	// only what the foreground leaves.
	fillPart[bgLevel] = part(fills[bgLevel])
	for k := range numLevels {
		fillPart[k] = part(fills[k])
		burstPart[k] = part(bursts[k])
		fig.Levels[k] = fills[k]*fillPart[k] + bursts[k]*burstPart[k]
	}
	// A background group asks beyond its floor up to its
	// UTILIZATION_LIMIT of the limit; what it does not take goes to the
	// foreground as spare.
	if fills[bgLevel]+bursts[bgLevel] > 0 {
		bursts[bgLevel] = 0
		for _, b := range l.active {
			if e := &b.svc; e.level == bgLevel {
				room := float64(b.settings.Background)/100*l.limit - e.fill*fillPart[bgLevel]
				e.burst = min(e.burst, max(room, 0))
				bursts[bgLevel] += e.burst
			}
		}
	}
	burstPart[bgLevel] = part(bursts[bgLevel])
	// What nobody asks for is spread over every group with demand in
	// proportion to it, so that a group whose demand grows finds room
	// before the next rebalance: a background group's part only up to
	// its UTILIZATION_LIMIT room (its demand follows the proxies' slow
	// estimate, and held at it a background ramped over seconds once
	// the foreground stopped), the rest of it to the foreground. A
	// non-burstable group's part above RU_PER_SEC stays unused.
	spare, bgExtra := 0.0, 0.0
	if allDemand := fig.Demand; left > 0 && allDemand > 0 {
		for _, b := range l.active {
			e := &b.svc
			if e.level == bgLevel {
				room := float64(b.settings.Background)/100*l.limit - e.fill*fillPart[bgLevel] - e.burst*burstPart[bgLevel]
				e.extra = min(left*e.demand/allDemand, max(room, 0))
				bgExtra += e.extra
			}
		}
		if fgDemand > 0 {
			spare = (left - bgExtra) / fgDemand
		}
	}
	for _, b := range l.active {
		e := &b.svc
		e.cap = math.Inf(1)
		if l.limit > 0 {
			e.cap = e.fill*fillPart[e.level] + e.burst*burstPart[e.level]
			if e.level == bgLevel {
				e.cap += e.extra
				fig.Background += e.cap
			} else {
				e.cap += e.demand * spare
			}
			fig.Allocated += e.cap
		}
	}
	// Each group's ceiling: the least of the limit's part and its part
	// of its parents' pools.
	for _, b := range l.active {
		c := b.svc.cap
		if p, ok := pc[b]; ok {
			c = min(c, p)
		}
		l.setActiveCeil(b, c, now)
	}
	if l.limit > 0 {
		fig.Groups = len(l.active)
	} else {
		fig = ServiceLimitFigures{FillRates: l.fillSum, At: now}
	}
	l.fig = fig
}

// SetServiceLimit sets the service limit to limit RU/s at now (0: none).
// Setting or lifting it visits every group once; changing it, only the
// groups with demand.
func (a *Allocator) SetServiceLimit(limit float64, now time.Time) {
	if !(limit > 0) || math.IsInf(limit, 1) {
		limit = 0
	}
	l := &a.svc
	if limit == l.limit {
		return
	}
	was := l.limit
	l.limit = limit
	switch {
	case limit == 0 && l.nested > 0:
		// The parents' layer goes on: the groups it shares keep their
		// place, the rest lose the ceilings that only the limit set.
		for _, b := range a.groups {
			if !b.svc.active {
				b.setCeil(l.idleCeil(b.settings), now)
			}
		}
	case limit == 0:
		for _, b := range a.groups {
			l.remove(b)
			b.setCeil(math.Inf(1), now)
		}
		l.fig = ServiceLimitFigures{FillRates: l.fillSum, At: now}
		return
	case was == 0 && l.nested == 0:
		// Every group otherwise never throttled must ask from now on;
		// the groups used lately join the limit's sharing at once.
		for _, b := range a.groups {
			if b.demand > 0 && now.Sub(b.svc.seen) <= activeFor {
				l.join(b) // the rebalance below shares
			} else {
				b.setCeil(l.idleCeil(b.settings), now)
			}
		}
	}
	l.rebalance(now)
}

// ServiceLimit returns the service limit's figures as of its last
// rebalance (Limit 0: none), with the groups' RU_PER_SEC sum now.
func (a *Allocator) ServiceLimit() ServiceLimitFigures {
	f := a.svc.fig
	f.Limit, f.FillRates = a.svc.limit, a.svc.fillSum
	return f
}

// ServiceLimited reports whether a service limit is set.
func (a *Allocator) ServiceLimited() bool { return a.svc.limit > 0 }

// Ceiling returns the service limit's ceiling on a group's RU/s (+Inf:
// none) and whether the group is held.
func (a *Allocator) Ceiling(group string) (float64, bool) {
	b := a.groups[group]
	if b == nil {
		return 0, false
	}
	return b.ceil, true
}

// String describes the service limit's last rebalance, for logs and
// test failures.
func (f ServiceLimitFigures) String() string {
	if f.Limit == 0 {
		return "no service limit"
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "service limit %.0f RU/s: %d groups want %.1f, given %.1f (HIGH %.1f, MEDIUM %.1f, LOW %.1f, background %.1f); RU_PER_SEC sum %.0f",
		f.Limit, f.Groups, f.Demand, f.Allocated, f.Levels[0], f.Levels[1], f.Levels[2], f.Background, f.FillRates)
	return sb.String()
}
