package tokenclient

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
)

// A Client and the calls that make and close it. Its state is split by
// owner, each part with its own lock or goroutine:
//
//	settings cache  settingsCache (settingscache.go), its own RWMutex;
//	                written by the settings stream's goroutine only
//	groups          the groups in use, with the token stream's table of
//	                requests (tokenStreamState), under Client.mu: a
//	                request or a grant changes both in one step
//	connections     connPool (conns.go), its own lock
//	goroutines      loops (loops.go): each loop gets its context at start;
//	                Close cancels them and waits for them
//	inspect, runaway history
//	                inspectState and runawaySender, their own locks
//
// Lock order: Client.mu, then the settings cache's; the others are taken
// alone. The rest of the client is split by concern:
//
//	bucket.go    the local token bucket, one per group
//	acquire.go   AcquireShare (the one way a statement takes tokens), its
//	             queue and reservation, Charge, Share, throttled counts
//	demand.go    what the proxy wants of a group (EWMA, waiting RU,
//	             HoldDemand, the notify threshold) and USAGE
//	shadow.go    MODE WARN's shadow bucket (WouldAcquire)
//	degraded.go  degraded mode: local refill when rgserver is silent
//	stream.go    the token stream (requests, reports, grants)
//	settings.go  the settings stream and the snapshot file
//	purse.go     a session's advance on its group's tokens
//	lifecycle.go when a group's state is born and forgotten
//	store.go     the gRPC Store of admin statements
//	runaway.go   the runaway watch list's index and writes
//	inspect.go   the Inspect stream and ClusterInspect (cluster views)
//	overview.go  every group known, with its live state, for the console

// Client is the proxy side of the token protocol. All its methods are safe
// for concurrent use by many sessions; AcquireShare is the only one that
// blocks (bounded by its maxWait and ctx), Charge never blocks, and Store's
// writes block on one RPC plus at most 1 s for the settings cache.
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

	// cache is the settings stream's cache, under its own lock
	// (settingscache.go).
	cache *settingsCache

	kick     chan struct{}      // wakes the stream loop: some group needs tokens
	flush    chan chan struct{} // Close asks the stream loop for a final report
	saveKick chan struct{}      // wakes saveLoop: the cache changed

	// conns are the connections to rgserver, under their own lock.
	conns connPool

	// mu guards the groups in use and the token stream's state: a
	// request takes the groups' reports and marks them in flight, and a
	// grant fills their buckets, in one step with the stream's table of
	// requests, so that no consumption is reported twice or lost.
	mu     sync.Mutex
	groups map[string]*groupState
	stream tokenStreamState
	closed bool

	// purses are the sessions' purses that hold an advance or unrecorded
	// consumption (purse.go).
	purses map[*Purse]struct{}
	// holds are the refused statements' demand holds, oldest first
	// (HoldDemand).
	holds []heldDemand

	// droppedTokens counts granted tokens a dropGrant failpoint discarded.
	droppedTokens float64

	// forgotten are groups forgotten (dropped or expired) whose hook has
	// not run yet; notifyForgotten runs it outside the lock.
	forgotten []string
	// droppedAt: groups dropped lately (a settings stream DELETE or a NOT_FOUND
	// grant), so that a statement settling after the DROP does not bring
	// their state and series back; kept for droppedMemory.
	droppedAt   map[string]time.Time
	onForgotten atomic.Pointer[func(group string)]

	// insp is the Inspect stream's state (inspect.go).
	insp inspectState
	// runaways queues runaway events for rgserver (history.go).
	runaways runawaySender

	// loops are the background goroutines, each with its own context
	// (loops.go); Close stops them and waits for them.
	loops loops
}

// tokenStreamState is the token stream's side of the groups' state
// (stream.go, degraded.go); guarded by Client.mu.
type tokenStreamState struct {
	connected   bool      // a stream is open and has answered
	lostAt      time.Time // when the last answering stream ended (or Start)
	degraded    bool      // the groups refill locally (degraded.go)
	outstanding map[uint64]*sentRequest
	nextReqID   uint64
	finalID     uint64        // the request id of Close's final report
	finalAck    chan struct{} // closed when that report is answered
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
	// queue orders the statements waiting for tokens (AcquireShare):
	// only the first may take them, so they are served in arrival order.
	queue []*queued

	// Reporting.
	pending ru.Consumption
	// pendingThrottled counts the statements refused since the last
	// report (Consumption.throttled).
	pendingThrottled uint64
	lastReport       time.Time
	// heldSent is the held_tokens of the last message for the group.
	heldSent float64

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

// sentRequest is a TokenRequest awaiting its answer.
type sentRequest struct {
	at        time.Time
	reports   map[string]ru.Consumption // consumption sent per group
	throttled map[string]uint64         // refusals sent per group (nil: none)
	asked     map[string]bool           // group → tokens were asked (not report-only)
}

// New returns a Client for cfg; Start connects it.
func New(cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg:       cfg,
		clk:       cfg.Clock,
		log:       cfg.Logger.With("component", "tokenclient"),
		kick:      make(chan struct{}, 1),
		flush:     make(chan chan struct{}),
		saveKick:  make(chan struct{}, 1),
		groups:    map[string]*groupState{},
		droppedAt: map[string]time.Time{},
		purses:    map[*Purse]struct{}{},
		cache:     newSettingsCache(),
		stream:    tokenStreamState{lostAt: cfg.Clock.Now(), outstanding: map[uint64]*sentRequest{}},
		runaways:  newRunawaySender(),
	}
	c.met, err = newMetrics(c, cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Start starts the token stream and the settings stream (rpc Watch on the wire) in background
// goroutines, which run until Close. It returns once the first Watch
// snapshot arrived; or, when no rgserver answers, once the snapshot under
// CacheDir is loaded (the client then starts in degraded mode); or an error
// wrapping ErrUnavailable when neither is possible, or ctx's error if ctx
// ends first. ctx bounds only this first wait. Start may be called once;
// after an error the caller should Close the client.
func (c *Client) Start(ctx context.Context) error {
	c.mu.Lock()
	if c.closed || !c.loops.begin() {
		c.mu.Unlock()
		return fmt.Errorf("tokenclient: start: %w", ErrClosed)
	}
	c.stateLocked(resourcegroup.DefaultGroup, c.clk.Now()) // default's series from start
	c.mu.Unlock()

	first := make(chan error, 1)
	if !c.loops.start(func(ctx context.Context) { c.settingsLoop(ctx, first) }) {
		return fmt.Errorf("tokenclient: start: %w", ErrClosed) // Close came first
	}
	c.loops.start(c.tokenLoop)
	c.loops.start(c.expireLoop)
	c.loops.start(c.purseLoop)
	if c.cfg.CacheDir != "" {
		c.loops.start(c.saveLoop)
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
		if c.cache.install(snap, false) { // unless the settings stream succeeded meanwhile
			c.mu.Lock()
			c.cacheInstalledLocked()
			c.enterDegradedLocked(c.clk.Now())
			c.mu.Unlock()
			c.cache.wake()
			c.notifyForgotten()
		}
		c.log.Warn("rgserver unreachable at start: serving from the cached snapshot in degraded mode",
			"revision", snap.Revision, "groups", len(snap.Groups), "err", err)
		return nil
	case <-ctx.Done():
		return fmt.Errorf("tokenclient: start: %w", ctx.Err())
	}
}

// Close sends a final consumption report if connected (waiting at most 1 s
// for rgserver to take it), stops the goroutines and closes the
// connections. It is idempotent. AcquireShare and Charge keep working on the
// local buckets afterwards (degraded once DegradedAfter passes); Store
// writes fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	started := c.loops.running()
	connected := c.stream.connected
	c.sweepPursesLocked(c.clk.Now(), true) // the final report holds what purses spent
	c.mu.Unlock()
	if started && connected {
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
	c.loops.stop()
	return c.conns.close()
}

// stateLocked returns group's state, making it on first use, with its
// series at 0.
func (c *Client) stateLocked(group string, now time.Time) *groupState {
	if gs, ok := c.groups[group]; ok {
		return gs
	}
	gs := &groupState{name: group, notify: make(chan struct{}), ewmaAt: now, lastReport: now, lastUsed: now}
	if g, ok := c.definition(group); ok && isUnlimited(g) {
		gs.bucket.SetUnlimited(true)
	}
	c.groups[group] = gs
	gs.waitObs = c.met.born(group)
	if c.stream.degraded {
		c.localRefillLocked(now, gs)
	}
	return gs
}

// definition returns a group's definition from the cache; `default`
// has its built-in one until rgserver sends one.
func (c *Client) definition(name string) (resourcegroup.Group, bool) {
	if g, ok := c.cache.group(name); ok {
		return g, true
	}
	if name == resourcegroup.DefaultGroup {
		return resourcegroup.DefaultGroupDefinition(), true
	}
	return resourcegroup.Group{}, false
}

// isUnlimited reports whether g is never throttled.
func isUnlimited(g resourcegroup.Group) bool {
	return g.RUPerSec == resourcegroup.Unlimited || g.Burst == resourcegroup.BurstUnlimited || g.Mode != resourcegroup.ModeEnforce
}

// servesLocked reports whether a charge, a held demand or a refusal may
// (re)create group's state: not for a group dropped lately and not back
// in the settings cache (a statement that settles after the DROP must not
// bring back its state and series for --group-idle-expiry).
func (c *Client) servesLocked(group string) bool {
	if _, ok := c.groups[group]; ok {
		return true
	}
	at, ok := c.droppedAt[group]
	if !ok {
		return true
	}
	if _, known := c.cache.group(group); known || c.clk.Now().Sub(at) >= droppedMemory {
		delete(c.droppedAt, group)
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
