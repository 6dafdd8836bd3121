package tokenclient

import (
	"context"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// A group's local state (groupState) and its per-group series live
// together: both are born when the proxy first serves the group (default's
// when the client starts) and both go when the group is dropped — it
// leaves the settings cache, or rgserver answers NOT_FOUND — or when it has
// been idle here for Config.IdleExpiry. Either way the hook registered
// with OnGroupForgotten is told, so that the caller forgets the group too.

// OnGroupForgotten registers fn, called with a group's name (outside the
// groups' lock, on one of its goroutines) after the group was dropped or
// expired here and its series deleted. It replaces any earlier fn; nil
// removes it. Safe to call at any time, also after Start.
func (c *Client) OnGroupForgotten(fn func(group string)) {
	if fn == nil {
		c.groups.onForgotten.Store(nil)
		return
	}
	c.groups.onForgotten.Store(&fn)
}

// useLocked returns group's state (made on first use) and notes that it
// was used at now.
func (t *groupTable) useLocked(group string, now time.Time) *groupState {
	gs := t.stateLocked(group, now)
	if now.After(gs.lastUsed) {
		gs.lastUsed = now
	}
	return gs
}

// dropLocked forgets a group that no longer exists: statements waiting on
// it wake and get ErrUnknownGroup (their caller falls back to default,
// as it would a moment later from rgserver's NOT_FOUND), and what it still
// owed is moot: rgserver drops whatever is reported for an unknown group.
// `default` cannot be dropped.
func (t *groupTable) dropLocked(gs *groupState) {
	if gs.name == resourcegroup.DefaultGroup || t.byName[gs.name] != gs {
		return
	}
	gs.dead = true
	gs.wake()
	t.forgetLocked(gs)
	now := t.clk.Now()
	if len(t.droppedAt) >= 1024 {
		for name, at := range t.droppedAt {
			if now.Sub(at) >= droppedMemory {
				delete(t.droppedAt, name)
			}
		}
	}
	t.droppedAt[gs.name] = now
}

// forgetLocked deletes gs and its series and queues the hook.
func (t *groupTable) forgetLocked(gs *groupState) {
	delete(t.byName, gs.name)
	t.met.forget(gs.name)
	t.forgotten = append(t.forgotten, gs.name)
}

// droppedFromCacheLocked drops the groups in use here that the settings stream
// cache no longer holds, among names (all groups in use when names is
// nil: a whole snapshot was installed).
func (t *groupTable) droppedFromCacheLocked(names []string) {
	check := func(name string) {
		if gs, ok := t.byName[name]; ok {
			if _, known := t.cache.group(name); !known {
				t.dropLocked(gs)
			}
		}
	}
	if names != nil {
		for _, n := range names {
			check(n)
		}
		return
	}
	for name := range t.byName {
		check(name)
	}
}

// notifyForgotten runs the OnGroupForgotten hook for the groups forgotten
// since its last call, outside the lock. A group used again meanwhile
// (its state born again) is not reported: its caller may already count it.
func (t *groupTable) notifyForgotten() {
	t.mu.Lock()
	names := t.forgotten
	t.forgotten = nil
	live := names[:0:0]
	for _, n := range names {
		if _, again := t.byName[n]; !again {
			live = append(live, n)
		}
	}
	t.mu.Unlock()
	fn := t.onForgotten.Load()
	if fn == nil {
		return
	}
	for _, n := range live {
		(*fn)(n)
	}
}

// owedEpsilon is the rounding noise below which RU waiting or in debt
// count as none.
const owedEpsilon = 1e-6

// expireIdle forgets, at now, the groups with no use for IdleExpiry whose
// state no longer matters. A state is kept, however idle, while anything
// about it is still owed or pending, so that forgetting it loses nothing:
//   - a statement waits on it, or sleeps on a reservation;
//   - a request is in flight (its answer settles the bucket);
//   - consumption is still to be reported (rgserver unreachable): it is
//     reported first, at the next message;
//   - its bucket is in debt: forgetting would forgive the debt, so it
//     stays until the fill or a grant repaid it.
//
// What is dropped with an idle state is at most unspent tokens (the group
// can only spend less for it) and a net refund that could not be reported
// yet (rgserver keeps counting a little more consumption than there was).
// `default` never expires: its series exist from start.
func (c *Client) expireIdle(now time.Time) {
	c.groups.mu.Lock()
	before := now.Add(-c.cfg.IdleExpiry)
	for name, gs := range c.groups.byName {
		if name == resourcegroup.DefaultGroup || gs.lastUsed.After(before) {
			continue
		}
		if len(gs.queue) > 0 || gs.waiting > owedEpsilon || gs.inFlight || gs.hasReport() ||
			(!gs.bucket.Unlimited() && gs.bucket.Tokens(now) < -owedEpsilon) {
			continue
		}
		c.groups.forgetLocked(gs)
	}
	c.groups.mu.Unlock()
	c.groups.notifyForgotten()
}

// expireLoop runs expireIdle every quarter of IdleExpiry (at most every
// minute) until ctx ends.
func (c *Client) expireLoop(ctx context.Context) {
	every := min(c.cfg.IdleExpiry/4, time.Minute)
	for {
		if err := c.sleep(ctx, every); err != nil {
			return
		}
		c.expireIdle(c.clk.Now())
	}
}
