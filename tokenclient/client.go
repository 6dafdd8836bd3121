package tokenclient

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"google.golang.org/grpc"
)

// Client is the proxy side of the token protocol. All its methods are safe
// for concurrent use by many sessions; Acquire is the only one that blocks
// (bounded by its maxWait and ctx), Charge never blocks, and Store's writes
// block on one RPC plus at most 1 s for the Watch cache.
//
// The protocol choices (docs/design.md §7, "Token protocol"): a group asks
// when its bucket falls below the notify threshold, demand × 1 s (demand =
// EWMA of consumed RU/s, sampled every second, plus the RU of waiting
// statements per second) but at most the proxy's share of the group's
// capacity, for demand × TargetPeriod × 1.1 − tokens left;
// a group has at most one request in flight; the groups that need tokens
// at one moment, and every group with unreported consumption, go in one
// TokenRequest; a group that consumes reports at least every ReportPeriod
// (report_only when it needs no tokens). A grant with trickle_ms = 0 is
// added at once and the bucket does not fill by itself; a trickle fills
// it at tokens ÷ trickle_ms, up to that share of the capacity, and the
// group asks again only near the trickle's end.
type Client struct {
	cfg Config
	clk Clock
	log *slog.Logger
	met *metrics

	kick     chan struct{}      // wakes the stream loop: some group needs tokens
	flush    chan chan struct{} // Close asks the stream loop for a final report
	saveKick chan struct{}      // wakes saveLoop: the cache changed

	connMu      sync.Mutex
	conns       map[string]*grpc.ClientConn
	connsClosed bool
	rgNext      int // next server tried for ResourceGroupService calls

	mu     sync.Mutex
	groups map[string]*groupState
	// Connection state of the token stream.
	connected   bool      // a stream is open and has answered
	lostAt      time.Time // when the last answering stream ended (or Start)
	degraded    bool
	outstanding map[uint64]*sentRequest
	nextReqID   uint64
	finalID     uint64        // the request id of Close's final report
	finalAck    chan struct{} // closed when that report is answered
	// Watch cache.
	cache        snapshot
	cacheLoaded  bool
	watchSynced  bool          // the cache came from a Watch (not only from the file)
	cacheChanged chan struct{} // closed and replaced on every cache change
	// cacheGen counts the cache's changes (CacheGeneration); written under
	// mu, read without it.
	cacheGen atomic.Uint64
	closed   bool
	// watchIdx is the runaway watch list indexed for MatchWatch, replaced
	// with the cache so that matching takes no lock.
	watchIdx atomic.Pointer[watchIndex]

	// purses are the sessions' purses that hold an advance or unrecorded
	// consumption (purse.go).
	purses map[*Purse]struct{}

	// droppedTokens counts granted tokens a dropGrant failpoint discarded.
	droppedTokens float64

	// forgotten are groups forgotten (dropped or expired) whose hook has
	// not run yet; notifyForgotten runs it outside the lock.
	forgotten []string
	// droppedAt: groups dropped lately (a Watch DELETE or a NOT_FOUND
	// grant), so that a statement settling after the DROP does not bring
	// their state and series back; kept for droppedMemory.
	droppedAt   map[string]time.Time
	onForgotten atomic.Pointer[func(group string)]

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// groupState is one group's local state; guarded by Client.mu.
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
	received     float64   // every token granted to this proxy, as applied
	dead         bool      // rgserver does not know the group
	// unavailable: rgserver could not read the group lately (etcd); it
	// keeps its settings and bucket, refilled locally, and asks again.
	unavailable bool

	// Request state.
	inFlight bool
	want     bool // the bucket signalled low tokens since the last request
	nextAsk  time.Time

	// Demand.
	ewma        float64 // RU/s
	ewmaAt      time.Time
	ewmaAcc     float64 // RU consumed since ewmaAt
	ewmaSampled bool
	// waiting is the RU of the statements waiting now: for tokens, or
	// sleeping on a reservation until the debt it made is paid.
	waiting float64
	// waitArea integrates waiting over time (RU·s) since waitSince, so that
	// demand reports the average over the period, not a noisy sample.
	waitArea  float64
	waitAt    time.Time
	waitSince time.Time
	// queue orders the statements waiting for tokens (AcquireEstimate):
	// only the first may take them, so they are served in arrival order.
	queue []*queued

	// Reporting.
	pending    ru.Consumption
	lastReport time.Time
	// heldSent is the held_tokens of the last message for the group.
	heldSent float64

	usage     usageRing
	throttled uint64
	// waitObs is the group's rgproxy_throttle_wait_seconds series.
	waitObs prometheus.Observer

	// shadow is MODE WARN's bucket of what ENFORCE would have done
	// (WouldAcquire); shadowOn says it is set up.
	shadow   Bucket
	shadowOn bool

	// lastUsed is the last Acquire, Charge or throttled count (or the
	// state's creation): the idle expiry's clock.
	lastUsed time.Time
}

// sentRequest is a TokenRequest awaiting its answer.
type sentRequest struct {
	at      time.Time
	reports map[string]ru.Consumption // consumption sent per group
	asked   map[string]bool           // group → tokens were asked (not report-only)
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
	// Throttled counts the statements refused by Acquire since start.
	Throttled uint64
	// Degraded: the proxy refills the group locally (rgserver unreachable).
	Degraded bool
}

// New returns a Client for cfg; Start connects it.
func New(cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg:          cfg,
		clk:          cfg.Clock,
		log:          cfg.Logger.With("component", "tokenclient"),
		kick:         make(chan struct{}, 1),
		flush:        make(chan chan struct{}),
		saveKick:     make(chan struct{}, 1),
		conns:        map[string]*grpc.ClientConn{},
		groups:       map[string]*groupState{},
		droppedAt:    map[string]time.Time{},
		outstanding:  map[uint64]*sentRequest{},
		purses:       map[*Purse]struct{}{},
		cache:        newSnapshot(),
		cacheChanged: make(chan struct{}),
		lostAt:       cfg.Clock.Now(),
	}
	c.met, err = newMetrics(c, cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Start starts the token stream and the Watch loop in background
// goroutines, which run until Close. It returns once the first Watch
// snapshot arrived; or, when no rgserver answers, once the snapshot under
// CacheDir is loaded (the client then starts in degraded mode); or an error
// wrapping ErrUnavailable when neither is possible, or ctx's error if ctx
// ends first. ctx bounds only this first wait. Start may be called once;
// after an error the caller should Close the client.
func (c *Client) Start(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.mu.Lock()
	if c.closed || c.cancel != nil {
		c.mu.Unlock()
		cancel()
		return fmt.Errorf("tokenclient: start: %w", ErrClosed)
	}
	c.cancel = cancel
	c.stateLocked(resourcegroup.DefaultGroup, c.clk.Now()) // default's series from start
	c.mu.Unlock()

	first := make(chan error, 1)
	c.wg.Add(4)
	go func() { defer c.wg.Done(); c.watchLoop(runCtx, first) }()
	go func() { defer c.wg.Done(); c.tokenLoop(runCtx) }()
	go func() { defer c.wg.Done(); c.expireLoop(runCtx) }()
	go func() { defer c.wg.Done(); c.purseLoop(runCtx) }()
	if c.cfg.CacheDir != "" {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); c.saveLoop(runCtx) }()
	}

	select {
	case err := <-first:
		if err == nil {
			return nil
		}
		snap, lerr := c.loadCache()
		if lerr != nil {
			return fmt.Errorf("%w: %w (cache: %w)", ErrUnavailable, err, lerr)
		}
		c.mu.Lock()
		if !c.cacheLoaded { // the Watch may have succeeded meanwhile
			c.setCacheLocked(snap)
			c.enterDegradedLocked(c.clk.Now())
		}
		c.mu.Unlock()
		c.log.Warn("rgserver unreachable at start: serving from the cached snapshot in degraded mode",
			"revision", snap.Revision, "groups", len(snap.Groups), "err", err)
		return nil
	case <-ctx.Done():
		return fmt.Errorf("tokenclient: start: %w", ctx.Err())
	}
}

// Close sends a final consumption report if connected (waiting at most 1 s
// for rgserver to take it), stops the goroutines and closes the
// connections. It is idempotent. Acquire and Charge keep working on the
// local buckets afterwards (degraded once DegradedAfter passes); Store
// writes fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	cancel := c.cancel
	connected := c.connected
	c.sweepPursesLocked(c.clk.Now(), true) // the final report holds what purses spent
	c.mu.Unlock()
	if cancel != nil {
		if connected {
			done := make(chan struct{})
			t := c.clk.NewTimer(time.Second)
			select {
			case c.flush <- done:
				select {
				case <-done:
				case <-t.C():
				}
			case <-t.C():
			}
			t.Stop()
		}
		cancel()
	}
	c.wg.Wait()
	c.connMu.Lock()
	defer c.connMu.Unlock()
	var first error
	for addr, cc := range c.conns {
		if err := cc.Close(); err != nil && first == nil {
			first = fmt.Errorf("tokenclient: close %s: %w", addr, err)
		}
	}
	c.conns = map[string]*grpc.ClientConn{}
	c.connsClosed = true
	return first
}

// Acquire pre-charges cons.RU() tokens of group, waiting at most maxWait.
// It fails fast with an error wrapping ErrThrottled when the estimated wait
// already exceeds maxWait or when maxWait passes first; nothing is then
// charged nor recorded, so a caller that runs the statement anyway (inside
// a transaction) must Charge it. When ctx ends first it returns ctx's error
// (the client is gone: not counted as throttled). On success cons is
// recorded for reporting. It returns how long it waited. An error wrapping
// ErrUnknownGroup means rgserver dropped the group.
func (c *Client) Acquire(ctx context.Context, group string, cons ru.Consumption, maxWait time.Duration) (time.Duration, error) {
	return c.AcquireEstimate(ctx, group, cons, cons.RU(), maxWait)
}

// AcquireEstimate is Acquire for a pre-charge that holds an estimate of
// what the statement will cost: cons.RU() is taken, but only its required
// part (today's before-cost) can get the statement refused. When the whole
// cannot be paid within maxWait but the required part can, the statement
// waits until the fill has paid what it took or maxWait has passed,
// whichever is first, and the rest stays as debt that later statements
// repay: an estimate never refuses a statement that its required cost
// alone would have run.
func (c *Client) AcquireEstimate(ctx context.Context, group string, cons ru.Consumption, required float64, maxWait time.Duration) (time.Duration, error) {
	return c.acquire(ctx, group, cons, required, maxWait, nil, nil)
}

// acquire is AcquireEstimate; when share is not nil it is set as
// AcquireShare returns it, and p, when not nil (AcquireShare's purse,
// which comes only with share), is settled and may be filled.
func (c *Client) acquire(ctx context.Context, group string, cons ru.Consumption, required float64, maxWait time.Duration, share *Share, p *Purse) (time.Duration, error) {
	named := group
	group = resourcegroup.NormalizeName(group)
	n := max(cons.RU(), 0)
	required = min(max(required, 0), n)
	start := c.clk.Now()
	c.mu.Lock()
	if p != nil && p.listed {
		// The purse could not serve the statement: what it spent is
		// recorded, what is left goes back, before the bucket is asked.
		c.dropPurseLocked(p, start)
	}
	gs := c.useLocked(group, start)
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
		c.refreshLocked(now)
		if gs.dead {
			unregister()
			c.mu.Unlock()
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
		c.pollLowLocked(gs)
		if ok {
			unregister()
			if wait > 0 {
				// Sleeping on a reservation is waiting too: it counts in the
				// demand that splits the fill rate between proxies.
				gs.addWaiting(now, n)
				c.mu.Unlock()
				err := c.sleep(ctx, wait)
				c.mu.Lock()
				now = c.clk.Now()
				gs.addWaiting(now, -n)
				if err != nil {
					gs.bucket.Refund(now, n)
					c.mu.Unlock()
					return now.Sub(start), fmt.Errorf("tokenclient: group %q: %w", group, err)
				}
				waited = now.Sub(start)
			}
			gs.record(now, cons)
			gs.lastUsed = now
			if c.groups[group] == gs { // a forgotten group's series stay deleted
				gs.waitObs.Observe(waited.Seconds())
			}
			if share != nil {
				*share = c.shareLocked(group)
				if p != nil && wait == 0 && waited == 0 {
					c.fillPurseLocked(p, gs, named, now, n, *share)
				}
			}
			c.mu.Unlock()
			return waited, nil
		}
		// Fail fast only when even the best case cannot pay in time: the
		// whole group's RU_PER_SEC (this proxy's share may grow while it
		// waits), or the local refill in degraded mode.
		rate := float64(gs.ruPerSec)
		if c.degraded {
			rate = gs.bucket.FillRate(now)
		}
		short := required - gs.bucket.Tokens(now)
		if remaining <= 0 || (rate > 0 && short/rate > remaining.Seconds()) {
			unregister()
			c.throttledLocked(gs)
			if share != nil {
				*share = c.shareLocked(group)
			}
			c.mu.Unlock()
			return waited, fmt.Errorf("%w: group %q needs %.2f RU, more than %v can supply", ErrThrottled, group, n, maxWait)
		}
		if me == nil {
			gs.addWaiting(now, n)
			gs.want = true
			me = &queued{}
			gs.queue = append(gs.queue, me)
			c.kickLocked()
		}
		retry := remaining
		if wait > 0 && wait < retry {
			retry = wait
		}
		ch := gs.notify
		c.mu.Unlock()
		t := c.clk.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			c.mu.Lock()
			unregister()
			c.mu.Unlock()
			return c.clk.Now().Sub(start), fmt.Errorf("tokenclient: group %q: %w", group, ctx.Err())
		case <-ch:
		case <-t.C():
		}
		t.Stop()
		c.mu.Lock()
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

// Charge post-charges cons.RU() to group with debt allowed (a negative RU
// is a refund) and records cons for reporting. It never blocks.
func (c *Client) Charge(group string, cons ru.Consumption) {
	group = resourcegroup.NormalizeName(group)
	now := c.clk.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshLocked(now)
	gs, ok := c.groups[group]
	if !ok {
		if !c.servesLocked(group) {
			return // dropped meanwhile: nothing to charge, no state to revive
		}
		gs = c.stateLocked(group, now)
	}
	if now.After(gs.lastUsed) {
		gs.lastUsed = now
	}
	gs.bucket.Take(now, cons.RU())
	gs.record(now, cons)
	c.pollLowLocked(gs)
}

// Share is what one proxy may spend of a group (see Client.Share).
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
}

// Share returns this proxy's share of group, from its settings and the
// last grant. A group the client does not know is unlimited.
func (c *Client) Share(group string) Share {
	group = resourcegroup.NormalizeName(group)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shareLocked(group)
}

func (c *Client) shareLocked(group string) Share {
	g, ok := c.settingsLocked(group)
	if !ok {
		return Share{Unlimited: true, Proxies: 1}
	}
	sh := Share{BurstSeconds: g.Burst.CapacitySeconds(), Proxies: 1, Mode: g.Mode, Unlimited: isUnlimited(g)}
	gs, used := c.groups[group]
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
	}
	sh.Rate = max(sh.Rate, float64(g.RUPerSec)/float64(sh.Proxies))
	return sh
}

// WouldAcquire tells, for a group in MODE WARN (which never waits), what
// Acquire(Estimate) would have done in ENFORCE: run at once, wait (for
// how long) or refuse. It keeps, per group, a shadow bucket filled at
// this proxy's fair share of RU_PER_SEC, capped as BURSTABLE says, which
// takes what ENFORCE would have taken (nothing for a refused statement),
// so the counts follow the same load in ENFORCE.
func (c *Client) WouldAcquire(group string, cons ru.Consumption, required float64, maxWait time.Duration) (wait time.Duration, refused bool) {
	group = resourcegroup.NormalizeName(group)
	now := c.clk.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	g, ok := c.settingsLocked(group)
	if !ok || g.RUPerSec == resourcegroup.Unlimited || g.Burst == resourcegroup.BurstUnlimited {
		return 0, false
	}
	gs := c.stateLocked(group, now)
	rate := float64(g.RUPerSec) / float64(max(gs.proxies, 1))
	burst := rate * g.Burst.CapacitySeconds()
	sb := &gs.shadow
	if !gs.shadowOn || sb.FillRate(now) != rate {
		if !gs.shadowOn {
			sb.Reconfigure(now, burst, rate, burst, 0) // starts full, as a fresh bucket would
		} else {
			sb.Reconfigure(now, 0, rate, burst, 0)
		}
		gs.shadowOn = true
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
	return 0, true
}

// HoldDemand adds d RU (negative: removes it) to the group's waiting
// demand, as a statement waiting for tokens does, without waiting. The
// policy holds the RU of a session's refused statement until the
// session's next statement: a client refused and retrying still wants
// its statement, so the fill rate keeps being split by the clients that
// want it, not by those that happened to get in.
func (c *Client) HoldDemand(group string, d float64) {
	group = resourcegroup.NormalizeName(group)
	now := c.clk.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.servesLocked(group) {
		return
	}
	gs := c.stateLocked(group, now)
	gs.addWaiting(now, d)
	if d > 0 {
		gs.want = true
		c.kickLocked()
	}
}

// CountThrottled counts a statement of group refused by the caller (for
// instance at its concurrency limit) as throttled, like one Acquire refused.
func (c *Client) CountThrottled(group string) {
	group = resourcegroup.NormalizeName(group)
	now := c.clk.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.servesLocked(group) {
		return
	}
	c.throttledLocked(c.useLocked(group, now))
}

// servesLocked reports whether a charge, a held demand or a refusal may
// (re)create group's state: not for a group dropped lately and not back
// in the Watch cache (a statement that settles after the DROP must not
// bring back its state and series for --group-idle-expiry).
func (c *Client) servesLocked(group string) bool {
	if _, ok := c.groups[group]; ok {
		return true
	}
	at, ok := c.droppedAt[group]
	if !ok {
		return true
	}
	if _, known := c.cache.Groups[group]; known || c.clk.Now().Sub(at) >= droppedMemory {
		delete(c.droppedAt, group)
		return true
	}
	return false
}

// droppedMemory is how long a dropped group is remembered: longer than
// any statement's settling after the DROP reached this proxy.
const droppedMemory = 10 * time.Minute

// Degraded reports whether the client refills buckets locally because
// rgserver has not granted tokens for Config.DegradedAfter.
func (c *Client) Degraded() bool {
	now := c.clk.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshLocked(now)
	return c.degraded
}

// Usage returns, sorted by name, every group known from the Watch cache or
// used on this proxy, with its live state at now.
func (c *Client) Usage(now time.Time) []GroupUsage {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshLocked(now)
	out := make([]GroupUsage, 0, len(c.groups)+len(c.cache.Groups))
	seen := map[string]bool{}
	for name, gs := range c.groups {
		seen[name] = true
		out = append(out, GroupUsage{
			Group:     name,
			RUPerSec:  gs.usage.rate(now),
			Tokens:    gs.bucket.Tokens(now),
			Unlimited: gs.bucket.Unlimited(),
			Throttled: gs.throttled,
			Degraded:  c.degraded,
		})
	}
	for name, g := range c.cache.Groups {
		if !seen[name] {
			out = append(out, GroupUsage{Group: name, Unlimited: isUnlimited(g), Degraded: c.degraded})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out
}

// stateLocked returns group's state, making it on first use, with its
// series at 0.
func (c *Client) stateLocked(group string, now time.Time) *groupState {
	if gs, ok := c.groups[group]; ok {
		return gs
	}
	gs := &groupState{name: group, notify: make(chan struct{}), ewmaAt: now, lastReport: now, lastUsed: now}
	if g, ok := c.settingsLocked(group); ok && isUnlimited(g) {
		gs.bucket.SetUnlimited(true)
	}
	c.groups[group] = gs
	gs.waitObs = c.met.born(group)
	if c.degraded {
		c.localRefillLocked(now, gs)
	}
	return gs
}

// settingsLocked returns a group's definition from the cache; `default`
// has its built-in one until rgserver sends one.
func (c *Client) settingsLocked(name string) (resourcegroup.Group, bool) {
	if g, ok := c.cache.Groups[name]; ok {
		return g, true
	}
	if name == resourcegroup.DefaultGroup {
		return resourcegroup.DefaultGroupDefinition(), true
	}
	return resourcegroup.Group{}, false
}

// pollLowLocked turns the bucket's one-shot low-tokens signal into a
// request at the next send.
func (c *Client) pollLowLocked(gs *groupState) {
	if gs.bucket.NeedsTokens() {
		gs.want = true
		c.kickLocked()
	}
}

func (c *Client) kickLocked() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *Client) throttledLocked(gs *groupState) {
	gs.throttled++
	c.met.throttled.WithLabelValues(gs.name).Inc()
}

// refreshLocked enters degraded mode when rgserver has been silent too long.
func (c *Client) refreshLocked(now time.Time) {
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

// isUnlimited reports whether g is never throttled.
func isUnlimited(g resourcegroup.Group) bool {
	return g.RUPerSec == resourcegroup.Unlimited || g.Burst == resourcegroup.BurstUnlimited || g.Mode != resourcegroup.ModeEnforce
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
func (c *Client) holdCapLocked(gs *groupState) float64 {
	g, ok := c.settingsLocked(gs.name)
	if !ok || isUnlimited(g) {
		return 0
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

// record adds cons to what is reported and to the demand and usage figures.
func (gs *groupState) record(now time.Time, cons ru.Consumption) {
	gs.pending.Add(cons)
	gs.ewmaAcc += cons.RU()
	gs.usage.add(now, cons.RU())
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

// trickleLeft returns the time and tokens of the running trickle still to
// come at now.
func (gs *groupState) trickleLeft(now time.Time) (time.Duration, float64) {
	if gs.trickleUntil.IsZero() || !gs.trickleUntil.After(now) {
		return 0, 0
	}
	d := gs.trickleUntil.Sub(now)
	return d, gs.bucket.FillRate(now) * d.Seconds()
}

// usageRing sums RU in one-second slots over the last usageWindow seconds.
type usageRing struct {
	slots [usageWindow]float64
	sec   int64 // Unix second of the newest slot
}

func (u *usageRing) advance(now time.Time) {
	s := now.Unix()
	if s <= u.sec {
		return
	}
	if s-u.sec >= usageWindow {
		u.slots = [usageWindow]float64{}
	} else {
		for i := u.sec + 1; i <= s; i++ {
			u.slots[i%usageWindow] = 0
		}
	}
	u.sec = s
}

func (u *usageRing) add(now time.Time, x float64) {
	u.advance(now)
	if now.Unix() == u.sec {
		u.slots[u.sec%usageWindow] += x
	}
}

func (u *usageRing) rate(now time.Time) float64 {
	u.advance(now)
	var sum float64
	for _, x := range u.slots {
		sum += x
	}
	return math.Max(sum, 0) / usageWindow
}
