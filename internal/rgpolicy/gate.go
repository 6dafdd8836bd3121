package rgpolicy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
)

// A gate bounds what one group has running on the backend through this
// proxy: the estimated RU of its statements in flight never exceeds a
// bound (what the group's share of RU_PER_SEC pays within its bucket's
// capacity), except that a statement estimated above the whole bound may
// run alone; and their number never exceeds this proxy's part of the
// group's MAX_CONCURRENCY. Waiting statements are admitted first come,
// first served, so a heavy one is not starved by light ones behind it.
//
// Safe for concurrent use.
type gate struct {
	mu       sync.Mutex
	bound    float64 // RU; the latest one a statement brought
	maxConc  int     // statements; 0 = no cap; the latest one a statement brought
	inflight float64 // estimated RU of the statements running
	running  int
	waiters  []*gateWaiter
	// probes: per shape (hash) this proxy has no estimate for yet, the
	// channel that closes when the statement of it in flight (the probe)
	// ends; see session.awaitProbe.
	probes map[uint64]chan struct{}
}

type gateWaiter struct {
	ru    float64
	ready chan struct{} // closed when admitted
}

// errGateTimeout: the statement could not enter within its wait.
var errGateTimeout = errors.New("rgpolicy: resource group's in-flight bound reached")

// fitsLocked reports whether a statement of n RU may start now.
func (g *gate) fitsLocked(n float64) bool {
	return g.running == 0 || g.inflight+n <= g.bound && (g.maxConc == 0 || g.running < g.maxConc)
}

// acquire waits until a statement estimated at n RU may run under bound
// and maxConc (0: no cap), at most maxWait (on clk), or until ctx ends.
// It returns how long it waited: 0, without reading the clock, when the
// statement entered at once.
func (g *gate) acquire(ctx context.Context, clk clock.Clock, n, bound float64, maxConc int, maxWait time.Duration) (time.Duration, error) {
	g.mu.Lock()
	g.bound, g.maxConc = bound, maxConc
	if len(g.waiters) == 0 && g.fitsLocked(n) {
		g.admitLocked(n)
		g.mu.Unlock()
		return 0, nil
	}
	if maxWait <= 0 {
		g.mu.Unlock()
		return 0, errGateTimeout
	}
	start := clk.Now()
	w := &gateWaiter{ru: n, ready: make(chan struct{})}
	g.waiters = append(g.waiters, w)
	g.mu.Unlock()
	t := clk.NewTimer(maxWait)
	defer t.Stop()
	var err error
	select {
	case <-w.ready:
		return clk.Now().Sub(start), nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C():
		err = errGateTimeout
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	waited := clk.Now().Sub(start)
	for i, x := range g.waiters {
		if x == w {
			g.waiters = append(g.waiters[:i], g.waiters[i+1:]...)
			g.wakeLocked() // the ones behind it may fit now
			return waited, err
		}
	}
	// Admitted as it gave up: give the place back.
	g.releaseLocked(n)
	return waited, err
}

// force admits a statement at once, over the bound if need be (inside a
// transaction once its wait is over, or a group in MODE WARN). It reports
// whether the statement would have had to wait under maxConc.
func (g *gate) force(n float64, maxConc int) (wouldWait bool) {
	g.mu.Lock()
	wouldWait = maxConc > 0 && g.running >= maxConc
	g.admitLocked(n)
	g.mu.Unlock()
	return wouldWait
}

// forceUnderCap admits a statement at once over the RU bound, but only
// while fewer than maxConc (0: no cap) statements run; it reports whether
// it did.
func (g *gate) forceUnderCap(n float64, maxConc int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if maxConc > 0 && g.running >= maxConc {
		return false
	}
	g.admitLocked(n)
	return true
}

// full reports whether maxConc statements run now.
func (g *gate) full(maxConc int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.running >= maxConc
}

func (g *gate) admitLocked(n float64) {
	g.inflight += n
	g.running++
}

// probe makes the caller the probe of the unknown shape hash (first) or,
// when a statement of it is already in flight, returns the channel that
// closes when that one ends. A probe must be ended with endProbe.
func (g *gate) probe(hash uint64) (done <-chan struct{}, first bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ch, ok := g.probes[hash]; ok {
		return ch, false
	}
	if g.probes == nil {
		g.probes = map[uint64]chan struct{}{}
	}
	g.probes[hash] = make(chan struct{})
	return nil, true
}

// endProbe ends the probe of shape hash, waking the statements that wait
// for it.
func (g *gate) endProbe(hash uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ch, ok := g.probes[hash]; ok {
		close(ch)
		delete(g.probes, hash)
	}
}

// release ends a statement admitted with n RU.
func (g *gate) release(n float64) {
	g.mu.Lock()
	g.releaseLocked(n)
	g.mu.Unlock()
}

func (g *gate) releaseLocked(n float64) {
	g.running--
	g.inflight -= n
	if g.running == 0 {
		g.inflight = 0 // no float residue
	}
	g.wakeLocked()
}

// wakeLocked admits waiters from the front while they fit.
func (g *gate) wakeLocked() {
	for len(g.waiters) > 0 && g.fitsLocked(g.waiters[0].ru) {
		w := g.waiters[0]
		g.waiters = g.waiters[1:]
		g.admitLocked(w.ru)
		close(w.ready)
	}
}

// String shows the gate's state on one line, e.g.
// "bound=25 max=0 inflight=24.5 running=1 waiting=2", and " probes=1" while
// statements of a shape not yet measured are in flight (session.awaitProbe).
func (g *gate) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := fmt.Sprintf("bound=%g max=%d inflight=%g running=%d waiting=%d", g.bound, g.maxConc, g.inflight, g.running, len(g.waiters))
	if len(g.probes) > 0 {
		s += fmt.Sprintf(" probes=%d", len(g.probes))
	}
	return s
}

// inflightHorizon is the share of a group's bucket capacity that its
// statements may have in flight on a proxy: with BURSTABLE OFF, what a
// quarter of a second of its rate pays. Heavy statements then enter one
// (or a few) at a time, at the pace the rate pays for them, instead of as
// many as a full bucket holds at once — which would be a burst of heavy
// statements on the backend, felt by every neighbour.
const inflightHorizon = 0.25

// gates holds one gate per group used on this proxy.
type gates struct {
	mu sync.Mutex
	m  map[string]*gate
}

func newGates() *gates { return &gates{m: map[string]*gate{}} }

func (gs *gates) get(group string) *gate {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	g, ok := gs.m[group]
	if !ok {
		g = &gate{}
		gs.m[group] = g
	}
	return g
}

// awaitProbe holds a statement whose shape this proxy has no estimate for
// while another statement of the same shape and group runs: the probe.
// Copies of a new heavy statement that arrive together (an application's
// start, a report fanned out over sessions, the first minute after a
// restart) would otherwise all enter at the base cost at once, the burst
// the in-flight bound exists to prevent; after the probe they enter at
// what it cost. A statement that finds no probe becomes it. The wait
// counts in the statement's wait budget and refuses nothing: when the
// budget is spent the statement goes on to the gate as it would have
// without a probe. It returns the RU the statement counts for in the
// gate: its prepaid cost, raised part by part to the estimate the probe
// taught.
func (s *session) awaitProbe(ctx context.Context, gt *gate, maxWait time.Duration) float64 {
	cur := &s.cur
	for {
		done, first := gt.probe(cur.shape.hash)
		if first {
			cur.probe = gt
			return cur.prepaid.RU()
		}
		left := maxWait - cur.waited
		if left <= 0 {
			return cur.prepaid.RU()
		}
		start := s.p.clk.Now()
		t := s.p.clk.NewTimer(left)
		select {
		case <-done:
		case <-t.C():
		case <-ctx.Done():
		}
		t.Stop()
		cur.waited += s.p.clk.Now().Sub(start)
		if ctx.Err() != nil {
			return cur.prepaid.RU()
		}
		if est, ok := s.p.shapes.estimate(cur.shape, &s.shapes); ok {
			return raise(cur.prepaid, est).RU()
		}
		// Out of budget, or the probe taught nothing (it never ran):
		// go on, or become the probe.
	}
}

// endProbe ends the probe the statement in flight is, if it is one.
func (s *session) endProbe() {
	if cur := &s.cur; cur.probe != nil {
		cur.probe.endProbe(cur.shape.hash)
		cur.probe = nil
	}
}

// admit is Before's last step, in this order: the proxy's COOLDOWN slot
// for a statement under a COOLDOWN watch; each of its groups' in-flight
// bound and MAX_CONCURRENCY on this proxy (the gate); and the backend
// concurrency limit by PRIORITY. Every wait shares the statement's wait
// budget (--max-wait, or --max-wait-in-txn inside a transaction) and
// holds nothing of a later step: a statement waiting for the COOLDOWN
// slot holds no place in its group's gate. A statement that cannot enter
// in time is refused (8252, counted as throttled), except that inside a
// transaction it then goes past the in-flight bound — what it runs on
// beyond its tokens is the session's debt, bounded in charge — and past
// the backend limit (the statements filling it may be waiting for its
// locks), but never past MAX_CONCURRENCY. COMMIT and ROLLBACK are never
// held. A group in MODE WARN is never held either: it only records that
// it would have waited; MODE OFF is not bounded at all. What admit takes
// it records in s.cur; abort or end gives it back.
func (s *session) admit(ctx context.Context, st *mysqlproto.Statement, set *Settings, cooldown bool) *mysqlproto.Reply {
	cur := &s.cur
	if endsTxn(st) && st.InTransaction {
		return nil
	}
	maxWait := set.MaxWait
	if st.InTransaction {
		maxWait = set.MaxWaitInTxn
	}
	g, _ := s.group(cur.group)
	prio := g.Priority
	if cooldown {
		prio = resourcegroup.PriorityLow
		if r := s.awaitCooldown(ctx, st, maxWait); r != nil {
			return r
		}
	}
	for i := range cur.nlegs {
		if r := s.enterGate(ctx, st, i, maxWait); r != nil {
			return r
		}
	}
	// Inside a transaction the backend concurrency cap holds a statement
	// at most --max-wait-in-txn, then lets it run over the cap: the
	// statements that fill the cap may be waiting on this transaction's
	// locks. Outside one it waits what is left of --max-wait.
	capWait := max(maxWait-cur.waited, time.Millisecond)
	start := s.p.clk.Now()
	held, err := s.p.admission.acquire(ctx, s.p.clk, prio, capWait)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return &mysqlproto.Reply{Err: errInterrupted}
	case errors.Is(err, errAdmissionWait) && st.InTransaction:
		held = false
		cur.waited += s.p.clk.Now().Sub(start)
	case errors.Is(err, errAdmissionWait):
		cur.waited += s.p.clk.Now().Sub(start)
		return s.refused(cur.group, fmt.Sprintf("%s for one of the proxy's --max-backend-concurrency %d backend slots",
			waitDetail(cur.waited, maxWait, false), set.MaxBackendConcurrency))
	default:
		return &mysqlproto.Reply{Err: errInterrupted}
	}
	cur.admitted = held
	return nil
}

// awaitCooldown waits, within what is left of maxWait, for the proxy's
// one COOLDOWN slot: statements under a COOLDOWN watch run one at a time.
// Inside a transaction a statement that cannot have it in time runs
// without it; outside one it is refused.
func (s *session) awaitCooldown(ctx context.Context, st *mysqlproto.Statement, maxWait time.Duration) *mysqlproto.Reply {
	cur := &s.cur
	select {
	case s.p.cooldown <- struct{}{}:
		cur.cooling = true
		return nil
	default:
	}
	left := maxWait - cur.waited
	if left <= 0 {
		return s.cooldownTimeout(st, maxWait)
	}
	start := s.p.clk.Now()
	t := s.p.clk.NewTimer(left)
	defer t.Stop()
	select {
	case s.p.cooldown <- struct{}{}:
		cur.cooling = true
		cur.waited += s.p.clk.Now().Sub(start)
		return nil
	case <-ctx.Done():
		return &mysqlproto.Reply{Err: errInterrupted}
	case <-t.C():
		cur.waited += s.p.clk.Now().Sub(start)
		return s.cooldownTimeout(st, maxWait)
	}
}

func (s *session) cooldownTimeout(st *mysqlproto.Statement, maxWait time.Duration) *mysqlproto.Reply {
	if st.InTransaction {
		return nil
	}
	return s.refused(s.cur.group, waitDetail(s.cur.waited, maxWait, false)+
		" for the proxy's COOLDOWN slot (a runaway watch lets one such statement run at a time)")
}

// enterGate takes the statement's place in the gate of its i-th group.
func (s *session) enterGate(ctx context.Context, st *mysqlproto.Statement, i int, maxWait time.Duration) *mysqlproto.Reply {
	cur := &s.cur
	l := &cur.legs[i]
	sh := l.share
	if cur.req.Class == ru.ClassFree || sh.Mode == resourcegroup.ModeOff || (sh.Unlimited && sh.MaxConcurrency == 0) {
		return nil
	}
	bound := math.Inf(1)
	if !sh.Unlimited {
		bound = sh.Rate * sh.BurstSeconds * inflightHorizon
	}
	n := l.prepaid.RU()
	gt := s.gateOf(l.group)
	if i == 0 && cur.hasShape && !cur.known && !sh.Unlimited && sh.Mode == resourcegroup.ModeEnforce {
		if n = s.awaitProbe(ctx, gt, maxWait); ctx.Err() != nil {
			return &mysqlproto.Reply{Err: errInterrupted}
		}
	}
	if sh.Mode == resourcegroup.ModeWarn {
		if gt.force(n, sh.MaxConcurrency) && cur.would == "" {
			cur.would = "wait (MAX_CONCURRENCY)"
			s.p.metrics.wouldWait(l.group, 0)
		}
		l.gate, l.gateRU = gt, n
		return nil
	}
	waited, err := gt.acquire(ctx, s.p.clk, n, bound, sh.MaxConcurrency, maxWait-cur.waited)
	cur.waited += waited
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return &mysqlproto.Reply{Err: errInterrupted}
	case st.InTransaction && gt.forceUnderCap(n, sh.MaxConcurrency):
		// The in-flight bound paces tokens, which a transaction's
		// statement ran on its session's debt; MAX_CONCURRENCY is a
		// count, which no debt repays.
	default:
		why := fmt.Sprintf(" for a place in the group's in-flight bound on this proxy (%s RU of statements at once; this one %s RU)",
			formatRU(bound), formatRU(n))
		if sh.MaxConcurrency > 0 && gt.full(sh.MaxConcurrency) {
			why = fmt.Sprintf(" for one of the group's MAX_CONCURRENCY places (%d on this proxy)", sh.MaxConcurrency)
		}
		return s.refused(l.group, waitDetail(cur.waited, maxWait, st.InTransaction)+why)
	}
	l.gate, l.gateRU = gt, n
	return nil
}
