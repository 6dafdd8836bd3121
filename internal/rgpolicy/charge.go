package rgpolicy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// charge is Before's third step: it takes the statement's cost before it
// is forwarded — the larger of its before-cost and what its shape cost
// lately — from the bucket of each of its groups (its own, and in strict
// mode a bound tag's), waiting as the transaction rules allow. Only the
// before-cost can get a statement refused (8252): the part of an estimate
// the wait cannot pay becomes debt.
//
// Transactions add no room. Outside a transaction a statement first
// repays what its user owes its groups (debt.go), within the same wait
// (rgproxy's own statements repay nothing). Inside one it waits at most
// --max-wait-in-txn; then, rather than hold locks longer, it runs on the
// session's debt — not the group's — as long as the session owes the
// group less than a second of its share of the rate (txnDebtSeconds) and
// its user's sessions less than three (accountDebtSeconds), else it is
// refused. COMMIT and ROLLBACK of an open transaction never wait: their
// cost is session debt too. So running everything inside transactions,
// in one session or many, gains a user nothing, and the group's other
// sessions never pay for it.
func (s *session) charge(ctx context.Context, st *mysqlproto.Statement, set *Settings) *mysqlproto.Reply {
	cur := &s.cur
	s.price(st)
	cur.legs[0], cur.nlegs = leg{group: cur.group}, 1
	if cur.before.IsZero() {
		return nil // free
	}
	cur.addLeg(cur.tagGroup, legTag)
	cur.addLeg(cur.shapeGroup, legShape)
	if endsTxn(st) && st.InTransaction {
		for i := range cur.nlegs {
			l := &cur.legs[i]
			l.prepaid, l.onDebt = cur.prepaid, true
		}
		return nil
	}
	if r := s.budgetRefuse(); r != nil {
		return r // a budget's REFUSE: nothing was taken
	}
	maxWait := set.MaxWait
	if st.InTransaction {
		maxWait = set.MaxWaitInTxn
	} else if !cur.ownSQL {
		for i := range cur.nlegs {
			if r := s.repay(ctx, cur.legs[i].group, maxWait); r != nil {
				return r
			}
		}
	}
	for i := 0; i < cur.nlegs; {
		n := cur.nlegs
		if r := s.chargeLeg(ctx, st, i, maxWait); r != nil {
			return r
		}
		if cur.nlegs == n {
			i++ // else leg i was dropped and the next took its place
		}
	}
	return nil
}

// addLeg adds a leg in group, added to the statement by a binding of
// kind, unless group is "" or has a leg already: a group is charged once.
func (c *statement) addLeg(group string, kind legKind) {
	if group == "" {
		return
	}
	for i := range c.nlegs {
		if c.legs[i].group == group {
			return
		}
	}
	c.legs[c.nlegs] = leg{group: group, kind: kind}
	c.nlegs++
}

// dropLeg removes leg i (not the statement's own), moving those after it
// down.
func (c *statement) dropLeg(i int) {
	copy(c.legs[i:c.nlegs], c.legs[i+1:c.nlegs])
	c.nlegs--
	c.legs[c.nlegs] = leg{}
}

// price sets what the statement is expected to cost: its before-cost and
// its prepaid cost, the larger of that and its shape's estimate.
func (s *session) price(st *mysqlproto.Statement) {
	cur := &s.cur
	cur.req = ru.RequestInfo{Class: costClass(st), WriteBytes: st.PayloadBytes}
	cur.before = s.p.cost.BeforeCost(cur.req)
	cur.prepaid = cur.before
	if cur.before.IsZero() {
		return // free
	}
	cur.shape = shapeKey{group: cur.group, hash: st.Scan.DigestHash}
	// A shape's executions: not COM_STMT_PREPARE (its EXECUTEs are) nor
	// COM_STMT_FETCH (part of the EXECUTE that opened the cursor).
	cur.hasShape = st.Scan.Digest != nil && cur.req.Class != ru.ClassFetch && st.Command != mysql.COM_STMT_PREPARE
	s.estimate()
}

// chargeLeg takes the statement's prepaid cost from the bucket of its
// i-th group within what is left of maxWait.
func (s *session) chargeLeg(ctx context.Context, st *mysqlproto.Statement, i int, maxWait time.Duration) *mysqlproto.Reply {
	cur := &s.cur
	l := &cur.legs[i]
	left := max(maxWait-cur.waited, 0)
	share, waited, err := s.led.take(ctx, l.group, i == 0, cur.prepaid, cur.before.RU(), left)
	if errors.Is(err, tokenclient.ErrUnknownGroup) && l.group != resourcegroup.DefaultGroup {
		if i > 0 {
			// A tag's or digest's group dropped under us: it adds no
			// limit any more.
			cur.dropLeg(i)
			return nil
		}
		// Dropped under us: the session falls back to default.
		cur.group, l.group = resourcegroup.DefaultGroup, resourcegroup.DefaultGroup
		cur.shape.group = cur.group
		s.estimate()
		left = max(maxWait-cur.waited-waited, 0)
		var more time.Duration
		share, more, err = s.led.take(ctx, l.group, i == 0, cur.prepaid, cur.before.RU(), left)
		waited += more
	}
	l.prepaid, l.share, l.waited = cur.prepaid, share, waited > 0
	cur.waited += waited
	if share.Mode == resourcegroup.ModeWarn && (err == nil || errors.Is(err, tokenclient.ErrThrottled)) {
		// A group in MODE WARN is unlimited: its tokens came at once.
		s.wouldCharge(st, l, maxWait)
	}
	switch {
	case err == nil:
		l.charged = true
		return nil
	case ctx.Err() != nil:
		// The client left while it waited: nothing was charged.
		return &mysqlproto.Reply{Err: errInterrupted}
	case errors.Is(err, tokenclient.ErrThrottled):
		why := ""
		if st.InTransaction {
			// Inside a transaction a statement runs on the session's debt
			// rather than hold locks longer, within the debt's bounds; the
			// debt is repaid before the next statement outside a
			// transaction.
			if why = s.runOnDebt(l); why == "" {
				return nil
			}
		}
		if s.p.logger.Enabled(ctx, slog.LevelDebug) {
			// Statements are logged only as digests: literals may be secrets.
			s.p.logger.Debug("statement throttled", "resource_group", l.group,
				"digest", string(st.Scan.Digest), "waited", cur.waited, "in_transaction", st.InTransaction)
		}
		if st.InTransaction {
			return s.refused(l.group, fmt.Sprintf("inside a transaction, after %s, %s; "+
				"the debt is repaid before the next statement outside a transaction",
				waitDetail(cur.waited, maxWait, true), why))
		}
		return s.refused(l.group, s.tokensDetail(l.group, cur.before.RU(), cur.prepaid.RU(), share.Tokens, maxWait, false))
	}
	s.p.logger.Warn("acquiring tokens failed", "resource_group", l.group, "err", err)
	return &mysqlproto.Reply{Err: errInterrupted}
}

// wouldCharge records, for a group in MODE WARN, what ENFORCE would have
// done with the statement's tokens: made it wait, or refused it (inside a
// transaction: made it wait its wait, then run on debt).
func (s *session) wouldCharge(st *mysqlproto.Statement, l *leg, maxWait time.Duration) {
	cur := &s.cur
	wait, refused := s.p.tokens.WouldAcquire(l.group, cur.prepaid, cur.before.RU(), maxWait, st.InTransaction)
	would := ""
	switch {
	case refused && !st.InTransaction:
		would = "8252"
		s.p.metrics.wouldThrottle(l.group)
	case refused:
		wait = maxWait
		fallthrough
	case wait > 0:
		would = "wait " + formatFloat(float64(wait)/float64(time.Millisecond)) + "ms"
		s.p.metrics.wouldWait(l.group, wait)
	}
	if cur.would == "" {
		cur.would = would
	}
}

// estimate raises the statement's prepaid cost to what its shape cost
// lately, part by part.
func (s *session) estimate() {
	cur := &s.cur
	cur.prepaid, cur.short, cur.known = cur.before, false, false
	if !cur.hasShape {
		return
	}
	if est, ok := s.p.shapes.estimate(cur.shape, &s.shapes); ok {
		cur.known = true
		cur.prepaid = raise(cur.before, est)
		cur.short = est.Short
	}
}

// raise returns c with its RRU and WRU each raised to the estimate's.
func raise(c ru.Consumption, est shapeEstimate) ru.Consumption {
	c.RRU, c.WRU = max(c.RRU, est.RRU), max(c.WRU, est.WRU)
	return c
}

// endsTxn: the statement is COMMIT or ROLLBACK (XA COMMIT/ROLLBACK too),
// as text or as the execute of a prepared one. Such a statement never
// waits: not for tokens, the group's gate, the backend concurrency cap nor
// COOLDOWN, so throttling never holds a transaction's locks longer.
func endsTxn(st *mysqlproto.Statement) bool {
	return st.Scan.EndsTxn && (st.Command == mysql.COM_QUERY || st.Command == mysql.COM_STMT_EXECUTE)
}

// costClass is the statement's class, but fetch for COM_STMT_FETCH,
// which pays only for the bytes it reads.
func costClass(st *mysqlproto.Statement) ru.Class {
	if st.Command == mysql.COM_STMT_FETCH {
		return ru.ClassFetch
	}
	return st.Class
}
