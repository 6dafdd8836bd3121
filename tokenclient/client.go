package tokenclient

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// A Client and the calls that make and close it. Its state is split by
// owner, each with its own lock or goroutine; no lock is held while
// another is taken, but for the two leaves named in groupTable's contract:
//
//	groups          groupTable (groups.go), its own lock: every group's
//	                state, degraded mode, purses, demand holds
//	token stream    tokenStream (stream.go), its own lock: the requests
//	                awaiting their answer, whether connected; the groups
//	                read its status without a lock
//	settings cache  settingsCache (settingscache.go), its own RWMutex;
//	                written by the settings stream's goroutine only
//	connections     connPool (conns.go), its own lock
//	goroutines      loops (loops.go): each loop gets its context at start;
//	                Close cancels them and waits for them
//	inspect, runaway history
//	                inspectState and runawaySender, their own locks
//
// Lock order, where two are ever held together: groupTable.mu, then the
// settings cache's read lock or a Purse's mu. The rest of the client is
// split by concern:
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

	// groups are the groups in use, under their own lock (groups.go).
	groups *groupTable
	// stream is the token stream's state, under its own lock (stream.go).
	stream *tokenStream
	// cache is the settings stream's cache, under its own lock
	// (settingscache.go).
	cache *settingsCache
	// saveKick wakes saveLoop: the cache changed.
	saveKick chan struct{}

	// conns are the connections to rgserver, under their own lock.
	conns connPool

	// closed: Close was called.
	closed atomic.Bool

	// insp is the Inspect stream's state (inspect.go).
	insp inspectState
	// runaways queues runaway events for rgserver (history.go).
	runaways runawaySender
	// budgets are the groups' budget verdicts (budgets.go).
	budgets budgetTable

	// loops are the background goroutines, each with its own context
	// (loops.go); Close stops them and waits for them.
	loops loops
}

// New returns a Client for cfg; Start connects it.
func New(cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg:      cfg,
		clk:      cfg.Clock,
		log:      cfg.Logger.With("component", "tokenclient"),
		saveKick: make(chan struct{}, 1),
		cache:    newSettingsCache(),
		stream:   newTokenStream(cfg.Clock.Now()),
		runaways: newRunawaySender(),
	}
	c.groups = newGroupTable(&c.cfg, c.log, c.cache, c.stream)
	c.groups.budgets = &c.budgets
	c.met, err = newMetrics(c.groups, cfg.Registerer)
	if err != nil {
		return nil, err
	}
	c.groups.met = c.met
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
	if c.closed.Load() || !c.loops.begin() {
		return fmt.Errorf("tokenclient: start: %w", ErrClosed)
	}
	c.groups.mu.Lock()
	c.groups.stateLocked(resourcegroup.DefaultGroup, c.clk.Now()) // default's series from start
	c.groups.mu.Unlock()

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
			c.groups.mu.Lock()
			c.groups.cacheInstalledLocked()
			c.groups.enterDegradedLocked(c.clk.Now())
			c.groups.mu.Unlock()
			c.cache.wake()
			c.groups.notifyForgotten()
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
	if c.closed.Swap(true) {
		return nil
	}
	started := c.loops.running()
	connected := c.stream.status().connected
	c.groups.mu.Lock()
	c.groups.sweepPursesLocked(c.clk.Now(), true) // the final report holds what purses spent
	c.groups.mu.Unlock()
	if started && connected {
		done := make(chan struct{})
		t := c.clk.NewTimer(time.Second)
		select {
		case c.stream.flush <- done:
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
