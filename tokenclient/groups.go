package tokenclient

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
)

// groupTable owns the groups in use on this proxy: each group's state
// (bucket, trickle, demand, queue of waiting statements, pending report,
// shadow bucket), whether the groups refill locally (degraded mode), the
// sessions' purses, the refused statements' demand holds and the groups
// dropped or forgotten lately.
//
// Concurrency contract:
//   - mu guards every field below it and every groupState; methods named
//     ...Locked are called with mu held, the others take it themselves.
//     Any goroutine may take it: the sessions (AcquireShare, Charge,
//     HoldDemand, ReturnPurse, WouldAcquire, ...), the token stream's two
//     goroutines (a request takes the groups' reports and marks them in
//     flight; a grant fills their buckets), the settings stream's goroutine
//     (a group's new definition), the expiry and purse loops, a scrape and
//     the console. It is never held across a wait: AcquireShare releases
//     it while it waits for tokens or sleeps on a reservation, and no RPC
//     is made under it.
//   - Two locks only are ever taken with mu held, each alone and after it
//     (never mu under them): the settings cache's read lock
//     (settingsCache.group, to read a definition) and a Purse's mu (the
//     sweep, a purse's filling and settling). The token stream's lock is
//     never taken under mu, nor mu under it: the groups read the stream's
//     state through tokenStream.status, an atomic load. A change of the stream's state is made under the stream's lock
//     first and then brought to the groups under mu (applyResponse,
//     streamEnded); whatever the groups read of it in between is a state it
//     was in, and the step under mu that follows corrects what it decided.
//   - The fields above mu are set by New and never change, but
//     onForgotten, an atomic.
type groupTable struct {
	cfg    *Config
	clk    Clock
	log    *slog.Logger
	met    *metrics
	cache  *settingsCache
	stream *tokenStream // only its status, read without a lock
	// budgets are the client's budget verdicts (budgets.go): a local
	// refill keeps to an enforced THROTTLE.
	budgets *budgetTable
	// kick wakes the token stream's send loop: some group needs tokens.
	kick chan struct{}
	// onForgotten is the OnGroupForgotten hook; it is called outside mu.
	onForgotten atomic.Pointer[func(group string)]

	mu     sync.Mutex
	byName map[string]*groupState
	// serviceLimited: rgserver's last answer said a service limit is in
	// force: every MODE ENFORCE group asks for its tokens.
	serviceLimited bool
	// degraded: the groups refill locally, rgserver having been silent
	// for Config.DegradedAfter (degraded.go).
	degraded bool
	// purses are the sessions' purses that hold an advance or unrecorded
	// consumption (purse.go).
	purses map[*Purse]struct{}
	// holds are the refused statements' demand holds, oldest first
	// (HoldDemand).
	holds []heldDemand
	// forgotten are groups forgotten (dropped or expired) whose hook has
	// not run yet; notifyForgotten runs it outside the lock.
	forgotten []string
	// droppedAt: groups dropped lately (a settings stream DELETE or a NOT_FOUND
	// grant), so that a statement settling after the DROP does not bring
	// their state and series back; kept for droppedMemory.
	droppedAt map[string]time.Time
}

func newGroupTable(cfg *Config, log *slog.Logger, cache *settingsCache, stream *tokenStream) *groupTable {
	return &groupTable{cfg: cfg, clk: cfg.Clock, log: log, cache: cache, stream: stream,
		kick: make(chan struct{}, 1), byName: map[string]*groupState{},
		purses: map[*Purse]struct{}{}, droppedAt: map[string]time.Time{}}
}

// groupState is one group's local state; guarded by groupTable.mu.
type groupState struct {
	name   string
	bucket Bucket
	notify chan struct{} // closed and replaced when tokens arrive

	// From the last grant.
	granted   bool
	shareRate float64 // this proxy's share of the fill rate, RU/s
	// holdCap is the most tokens the proxy holds for the group while
	// nothing waits: its share of the group's capacity (RU; 0 = unknown,
	// no cap). Trickles stop filling there and the low-tokens threshold
	// never exceeds it, so an idle proxy neither asks nor piles up tokens.
	holdCap      float64
	proxies      uint32
	ruPerSec     uint64
	trickleUntil time.Time // zero: no trickle
	trickleRate  float64   // RU/s of the trickle that runs until trickleUntil
	// bridging: the token stream is lost and the bucket fills at the last
	// share rate until degraded mode or the next answer (degraded.go).
	bridging bool
	received float64 // every token granted to this proxy, as applied
	dead     bool    // rgserver does not know the group
	// unavailable: rgserver could not read the group lately (etcd); it
	// keeps its settings and bucket, refilled locally, and asks again.
	unavailable bool

	// Request state.
	inFlight bool
	want     bool // the bucket signalled low tokens since the last request
	// askNow: rgserver moved the group's rate (ask_again): the next
	// ask need not wait for the running trickle to near its end.
	askNow  bool
	nextAsk time.Time

	// Demand.
	ewma        float64 // RU/s
	ewmaAt      time.Time
	ewmaAcc     float64 // RU consumed since ewmaAt
	ewmaSampled bool
	// waiting is the RU of the statements waiting now: for tokens, or
	// sleeping on a reservation until the debt it made is paid.
	waiting float64
	// heldRU is the part of waiting that refused statements' demand
	// holds are (HoldDemand).
	heldRU float64
	// waitArea integrates waiting over time (RU·s) since waitSince, so that
	// demand reports the average over the period, not a noisy sample.
	waitArea  float64
	waitAt    time.Time
	waitSince time.Time
	// queue orders the statements waiting for tokens (AcquireShare):
	// only the first may take them, so they are served in arrival order.
	queue []*queued

	// Reporting.
	pending ru.Consumption
	// charge is the chargeback of the consumption pending (Attribute).
	charge chargeAcc
	// counts are the refusals and the demand that waited or was denied
	// since the last report (Consumption's throttled, refused, waited_ru,
	// denied_ru).
	counts reportCounts
	// lastReport is the last message for the group; reportFrom the start
	// of the time the next report covers (Consumption.interval_ms): the
	// last report rgserver took or, when nothing was pending since, the
	// first figure that came in after it (startReport).
	lastReport time.Time
	reportFrom time.Time
	// lastFigure is when the last figure of the next report came in: the
	// report's idle_ms is the time since.
	lastFigure time.Time
	// heldSent is the held_tokens of the last message for the group,
	// demandSent its demand_ru_per_sec.
	heldSent   float64
	demandSent float64

	usage     usageRing
	throttled uint64
	// waitObs is the group's rgproxy_throttle_wait_seconds series.
	waitObs prometheus.Observer

	// shadow is MODE WARN's bucket of what ENFORCE would have done
	// (shadow.go).
	shadow shadowBucket

	// lastUsed is the last AcquireShare, Charge or throttled count (or the
	// state's creation): the idle expiry's clock.
	lastUsed time.Time
}

// stateLocked returns group's state, making it on first use, with its
// series at 0.
func (t *groupTable) stateLocked(group string, now time.Time) *groupState {
	if gs, ok := t.byName[group]; ok {
		return gs
	}
	gs := &groupState{name: group, notify: make(chan struct{}), ewmaAt: now, lastReport: now, reportFrom: now, lastUsed: now}
	if g, ok := t.cache.definition(group); ok && t.unlimitedLocked(g) {
		gs.bucket.SetUnlimited(true)
	}
	t.byName[group] = gs
	gs.waitObs = t.met.born(group)
	if t.degraded {
		t.localRefillLocked(now, gs)
	}
	return gs
}

// isUnlimited reports whether g is never throttled.
func isUnlimited(g resourcegroup.Group) bool {
	return g.RUPerSec == resourcegroup.Unlimited || g.Burst == resourcegroup.BurstUnlimited || g.Mode != resourcegroup.ModeEnforce
}

// unlimitedLocked reports whether g is never throttled here now: by its
// definition, unless rgserver shares a service limit (its answers say
// so), which throttles every MODE ENFORCE group, or g has a PARENT, whose
// rate rgserver shares among its children.
func (t *groupTable) unlimitedLocked(g resourcegroup.Group) bool {
	return isUnlimited(g) && !((t.serviceLimited || g.Parent != "") && g.Mode == resourcegroup.ModeEnforce)
}

// heldToServiceLimitLocked reports whether g, never throttled by its
// definition, is throttled by the service limit: its rate is then only
// what rgserver grants, its capacity 1 s of it.
func (t *groupTable) heldToServiceLimitLocked(g resourcegroup.Group) bool {
	return isUnlimited(g) && !t.unlimitedLocked(g)
}

// serviceLimitedLocked follows what rgserver's answer says of the service
// limit: when it comes or goes, the groups in use follow their
// definitions under it.
func (t *groupTable) serviceLimitedLocked(now time.Time, on bool) {
	if on == t.serviceLimited {
		return
	}
	t.serviceLimited = on
	t.log.Info("rgserver's service limit", "in_force", on)
	for _, gs := range t.byName {
		t.refreshGroupLocked(now, gs)
	}
}

// servesLocked reports whether a charge, a held demand or a refusal may
// (re)create group's state: not for a group dropped lately and not back
// in the settings cache (a statement that settles after the DROP must not
// bring back its state and series for --group-idle-expiry).
func (t *groupTable) servesLocked(group string) bool {
	if _, ok := t.byName[group]; ok {
		return true
	}
	at, ok := t.droppedAt[group]
	if !ok {
		return true
	}
	if _, known := t.cache.group(group); known || t.clk.Now().Sub(at) >= droppedMemory {
		delete(t.droppedAt, group)
		return true
	}
	return false
}

// droppedMemory is how long a dropped group is remembered: longer than
// any statement's settling after the DROP reached this proxy.
const droppedMemory = 10 * time.Minute

// trickleLeft returns the time and tokens of the running trickle still to
// come at now.
func (gs *groupState) trickleLeft(now time.Time) (time.Duration, float64) {
	if gs.trickleUntil.IsZero() || !gs.trickleUntil.After(now) {
		return 0, 0
	}
	d := gs.trickleUntil.Sub(now)
	return d, gs.bucket.FillRate(now) * d.Seconds()
}
