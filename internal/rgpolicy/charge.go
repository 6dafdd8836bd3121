package rgpolicy

import (
	"context"
	"errors"
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
// lately — waiting as the transaction rules allow. Only the before-cost
// can get a statement refused (8252): the part of an estimate the wait
// cannot pay becomes debt. COMMIT and ROLLBACK never wait; inside an open
// transaction a statement waits at most --max-wait-in-txn, then runs on
// debt, so throttling never holds row locks.
func (s *session) charge(ctx context.Context, st *mysqlproto.Statement, set *Settings) *mysqlproto.Reply {
	cur := &s.cur
	cur.req = ru.RequestInfo{Class: costClass(st), WriteBytes: st.PayloadBytes}
	cur.before = s.p.cost.BeforeCost(cur.req)
	cur.prepaid = cur.before
	if cur.before.IsZero() {
		return nil // free
	}
	cur.shape = shapeKey{group: cur.group, hash: st.Scan.DigestHash}
	// A shape's executions: not COM_STMT_PREPARE (its EXECUTEs are) nor
	// COM_STMT_FETCH (part of the EXECUTE that opened the cursor).
	cur.hasShape = st.Scan.Digest != nil && cur.req.Class != ru.ClassFetch && st.Command != mysql.COM_STMT_PREPARE
	s.estimate()
	if endsTxn(st) {
		s.p.tokens.Charge(cur.group, cur.prepaid)
		return nil
	}
	maxWait := set.MaxWait
	if st.InTransaction {
		maxWait = set.MaxWaitInTxn
	}
	share, waited, err := s.p.tokens.AcquireShare(ctx, &s.purse, cur.group, cur.prepaid, cur.before.RU(), maxWait)
	if errors.Is(err, tokenclient.ErrUnknownGroup) && cur.group != resourcegroup.DefaultGroup {
		// Dropped under us: the session falls back to default.
		cur.group = resourcegroup.DefaultGroup
		cur.shape.group = cur.group
		s.estimate()
		share, waited, err = s.p.tokens.AcquireShare(ctx, &s.purse, cur.group, cur.prepaid, cur.before.RU(), maxWait)
	}
	cur.share, cur.waited = share, waited
	if share.Mode == resourcegroup.ModeWarn && (err == nil || errors.Is(err, tokenclient.ErrThrottled)) {
		// A group in MODE WARN is unlimited: its tokens came at once.
		s.wouldCharge(st, maxWait)
	}
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		// The client left while it waited: nothing was charged.
		return &mysqlproto.Reply{Err: errInterrupted}
	case errors.Is(err, tokenclient.ErrThrottled) && st.InTransaction:
		// Inside a transaction a statement runs on debt rather than hold
		// locks longer; later statements repay it.
		s.p.tokens.Charge(cur.group, cur.prepaid)
		return nil
	case errors.Is(err, tokenclient.ErrThrottled):
		if s.p.logger.Enabled(ctx, slog.LevelDebug) {
			// Statements are logged only as digests: literals may be secrets.
			s.p.logger.Debug("statement throttled", "resource_group", cur.group,
				"digest", string(st.Scan.Digest), "waited", waited)
		}
		return s.refused(waited)
	}
	s.p.logger.Warn("acquiring tokens failed", "resource_group", cur.group, "err", err)
	return &mysqlproto.Reply{Err: errInterrupted}
}

// wouldCharge records, for a group in MODE WARN, what ENFORCE would have
// done with the statement's tokens: made it wait, or refused it (inside a
// transaction: made it wait its wait, then run on debt).
func (s *session) wouldCharge(st *mysqlproto.Statement, maxWait time.Duration) {
	cur := &s.cur
	wait, refused := s.p.tokens.WouldAcquire(cur.group, cur.prepaid, cur.before.RU(), maxWait)
	switch {
	case refused && !st.InTransaction:
		cur.would = "8252"
		s.p.metrics.wouldThrottle(cur.group)
	case refused:
		wait = maxWait
		fallthrough
	case wait > 0:
		cur.would = "wait " + formatFloat(float64(wait)/float64(time.Millisecond)) + "ms"
		s.p.metrics.wouldWait(cur.group, wait)
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

// costClass maps the wire class (and command) to the cost model's class.
func costClass(st *mysqlproto.Statement) ru.Class {
	if st.Command == mysql.COM_STMT_FETCH {
		return ru.ClassFetch
	}
	switch st.Class {
	case mysqlproto.ClassRead:
		return ru.ClassRead
	case mysqlproto.ClassWrite:
		return ru.ClassWrite
	case mysqlproto.ClassOther:
		return ru.ClassOther
	}
	return ru.ClassFree
}
