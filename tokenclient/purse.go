package tokenclient

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
)

// A session's statements mostly find their group's bucket far from empty.
// Then each of them taking the groups' lock — shared by every session of
// the proxy — twice (AcquireShare, Charge) costs more than the rest of the
// metering: on a saturated 2-core VM a point select's visits to the
// client were half of what metering added to it. So a session may carry a
// Purse: an advance on its group's tokens, taken from the bucket with one
// statement's tokens, from which its next statements take theirs and
// settle, under the purse's own lock.
//
// An advance is taken only while the bucket, after it, still holds
// purseHeadroom times the advance and no statement of the group waits:
// a group that is throttled, or close to it, is served statement by
// statement from its bucket, in arrival order, as without a purse.
//
// What a purse's statements consume is recorded (reported to rgserver,
// counted in the demand and in USAGE) when the purse takes its next
// advance and at the client's sweep, every purseSweep; the sweep also
// gives an advance back to the bucket when its purse was not used since
// the sweep before, and ReturnPurse when the session ends.

const (
	// purseStatements is how many statements one advance serves: the
	// statement that takes it and the purseStatements-1 after it.
	purseStatements = 32
	// purseHeadroom: an advance is taken only when the bucket keeps this
	// many times the advance after it.
	purseHeadroom = 64
	// purseSweep is how often the sweep records what purses spent and
	// takes back the advances of purses left unused.
	purseSweep = 100 * time.Millisecond
)

// Purse is one session's advance on its group's tokens (see above). The
// zero value is an empty purse. It belongs to one session, which passes
// it to AcquireShare, ChargePurse and ReturnPurse, from one goroutine at a
// time; the client's sweep may touch it concurrently. It must not be
// copied after first use.
type Purse struct {
	// mu guards the fields below but listed; the owner's statements and
	// the client's sweep take it, the sweep under groupTable.mu (never
	// the other way round).
	mu sync.Mutex
	// group is the group as the caller names it ("" = empty); gs its state
	// when the advance was taken; gen the cache generation then: a change
	// of the group's settings ends the advance.
	group string
	gs    *groupState
	gen   uint64
	// left is how many more statements the advance serves.
	left int
	// tokens is what is left of the advance (RU, never negative); limit
	// the most it keeps, twice the advance: a refund past it goes back to
	// the bucket.
	tokens, limit float64
	// unlimited: the group is never throttled; the purse holds no tokens.
	unlimited bool
	// shadow: the group is in MODE WARN; what the purse settles goes to
	// its shadow bucket too (shadow.go).
	shadow bool
	// spent is what the purse's statements consumed, not yet recorded;
	// zeroWaits how many of them got their tokens from it (the wait
	// histogram has not seen them yet).
	spent     ru.Consumption
	zeroWaits uint64
	// billAccount and billed are the chargeback of the purse's
	// statements to one account alone (Attribute), not yet recorded.
	billAccount string
	billed      chargeFig
	// share is the group's Share when the advance was taken.
	share Share
	// used: a statement used the purse since the last sweep.
	used bool

	// listed: the purse is in groupTable.purses; guarded by
	// groupTable.mu.
	listed bool
}

// String shows the purse's state in one line.
func (p *Purse) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.group == "" {
		return "purse: empty"
	}
	tokens := fmt.Sprintf("%.2f", p.tokens)
	if p.unlimited {
		tokens = "unlimited"
	}
	return fmt.Sprintf("purse %s: tokens=%s for %d statements, unrecorded=%.2f RU", p.group, tokens, p.left, p.spent.RU())
}

// take serves a statement of group from the purse: ok is false when the
// purse cannot (another group, a changed cache, too few tokens, its
// statements used up).
func (p *Purse) take(group string, cons ru.Consumption, record bool, gen uint64) (Share, bool) {
	n := cons.RU()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.left <= 0 || p.group != group || p.gen != gen || !(n >= 0) || (!p.unlimited && n > p.tokens) {
		return Share{}, false
	}
	p.left--
	if !p.unlimited {
		p.tokens -= n
	}
	if record {
		p.spent.Add(cons)
	}
	p.zeroWaits++
	p.used = true
	return p.share, true
}

// spend takes n tokens of group from the purse (gives them back when
// negative) and records rec as spent: ok is false when the purse cannot
// (another group, a changed cache, too few tokens, a refund past its
// limit); shadow tells that the group is in MODE WARN, whose shadow
// bucket must take n too.
func (p *Purse) spend(group string, n float64, rec ru.Consumption, gen uint64) (ok, shadow bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.group == "" || p.group != group || p.gen != gen {
		return false, false
	}
	if !p.unlimited {
		t := p.tokens - n
		if !(t >= 0 && t <= p.limit) {
			return false, false
		}
		p.tokens = t
	}
	p.spent.Add(rec)
	p.used = true
	return true, p.shadow
}

// bill keeps f, a statement's chargeback to account alone, in the purse
// when it holds group's advance and bills no other account; false when it
// cannot. The sweep records it with the purse's spending.
func (p *Purse) bill(group, account string, f chargeFig) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.group == "" || p.group != group || (p.billAccount != "" && p.billAccount != account) {
		return false
	}
	p.billAccount = account
	p.billed.add(f)
	return true
}

// ReturnPurse records what the purse spent and gives what is left of its
// advance back to the group's bucket; the purse is then empty. A session
// returns its purse when it ends.
func (c *Client) ReturnPurse(p *Purse) {
	now := c.clk.Now()
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	if p.listed {
		c.groups.dropPurseLocked(p, now)
	}
}

// dropPurseLocked settles a listed purse, gives its advance back and takes
// it off the sweep's list; t.mu is held.
func (t *groupTable) dropPurseLocked(p *Purse, now time.Time) {
	p.mu.Lock()
	t.settlePurseLocked(p, now, true)
	p.mu.Unlock()
	delete(t.purses, p)
	p.listed = false
}

// fillPurseLocked gives p an advance on gs after a statement of n RU got
// its tokens from the bucket at once, when the bucket can spare it; p is
// empty (acquire settled it). name is the group as the caller names it;
// sh the group's Share now.
func (t *groupTable) fillPurseLocked(p *Purse, gs *groupState, name string, now time.Time, n float64, sh Share) {
	if !(n > 0) || len(gs.queue) > 0 || gs.dead || t.byName[gs.name] != gs {
		return
	}
	unlimited := gs.bucket.Unlimited()
	adv := 0.0
	if !unlimited {
		adv = n * (purseStatements - 1)
		if gs.bucket.Tokens(now)-adv < purseHeadroom*adv {
			return
		}
		gs.bucket.Take(now, adv)
		t.pollLowLocked(gs)
	}
	p.mu.Lock()
	p.group, p.gs, p.gen = name, gs, t.cache.gen.Load()
	p.left = purseStatements - 1
	p.tokens, p.limit, p.unlimited = adv, 2*adv, unlimited
	p.shadow = sh.Mode == resourcegroup.ModeWarn
	p.share, p.used = sh, true
	p.mu.Unlock()
	if !p.listed {
		t.purses[p] = struct{}{}
		p.listed = true
	}
}

// settlePurseLocked records what p spent and, when empty is set, gives
// back what is left of its advance and empties it. Both t.mu and
// p.mu are held. What a purse of a group forgotten since is lost with the
// group, as a Charge to it would be.
func (t *groupTable) settlePurseLocked(p *Purse, now time.Time, empty bool) {
	if gs := p.gs; gs != nil && t.byName[gs.name] == gs {
		if !p.spent.IsZero() {
			gs.record(now, p.spent)
			if now.After(gs.lastUsed) {
				gs.lastUsed = now
			}
		}
		for ; p.zeroWaits > 0; p.zeroWaits-- {
			gs.waitObs.Observe(0)
		}
		if p.billAccount != "" && p.billed != (chargeFig{}) {
			gs.charge.add(nil, p.billAccount, p.billed)
		}
		if empty && !p.unlimited && p.tokens > 0 {
			gs.bucket.Refund(now, p.tokens)
			if len(gs.queue) > 0 {
				gs.wake()
			}
		}
	}
	p.spent, p.zeroWaits = ru.Consumption{}, 0
	p.billAccount, p.billed = "", chargeFig{}
	if empty {
		p.group, p.gs, p.gen, p.left = "", nil, 0, 0
		p.tokens, p.limit, p.unlimited, p.shadow, p.share = 0, 0, false, false, Share{}
	}
}

// sweepPursesLocked records what every purse spent, and empties those not
// used since the last sweep (all of them when all is set).
func (t *groupTable) sweepPursesLocked(now time.Time, all bool) {
	for p := range t.purses {
		p.mu.Lock()
		idle := all || !p.used
		p.used = false
		if !idle {
			t.settlePurseLocked(p, now, false)
		}
		p.mu.Unlock()
		if idle {
			t.dropPurseLocked(p, now)
		}
	}
}

// purseLoop sweeps the purses every purseSweep until ctx ends.
func (c *Client) purseLoop(ctx context.Context) {
	for {
		if err := c.sleep(ctx, purseSweep); err != nil {
			return
		}
		now := c.clk.Now()
		c.groups.mu.Lock()
		c.groups.sweepPursesLocked(now, false)
		c.groups.mu.Unlock()
	}
}
