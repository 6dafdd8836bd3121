package rgpolicy

import (
	"context"
	"time"

	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// stmtLedger is the one owner of a session's statements' RU, from the
// before-cost a statement takes to the last charge that reaches it late.
// Every RU that moves goes through it, once:
//
//   - take: each leg's prepaid cost from its group's bucket (charge);
//   - refund: what the legs took, when the statement is refused after
//     charge began (abort);
//   - denied and waited: the estimate of a statement refused before it
//     ran, or that waited for its tokens, for its groups' reports (the
//     usage history);
//   - settle: the measured cost against what the legs took (After);
//   - late: written bytes found after the statement — the estimate
//     (FollowUp, on the session's goroutine) or the binary log (a claim,
//     on the reader's);
//   - debt: a session's debt repaid before its next statement outside a
//     transaction, or left to the group when nothing can hold it.
//
// and it writes every record those movements are read from: the groups'
// buckets through tokenclient (whose consumption reports are what rgserver
// counts in rgserver_ru_consumed_total), rgproxy_ru_consumed_total and the
// other per-group series, the shapes (estimates and statements_summary),
// and the session's record that SHOW LAST STATEMENT RU shows. Nothing
// else in the policy calls Tokens.TakeShare or Settle for a statement, nor
// adds RU to a metric, so that the four agree.
//
// Tokens and records move apart. take and repay only reserve tokens; a
// refund only gives them back; settle moves the difference between the
// cost and what the legs took, and records the cost (counted: what the
// series count, no part below zero) — in tokenclient's report as in the
// series — and late charges record what they charge. So rgserver hears
// each statement's cost once, when it is known, and never a negative
// figure: a reservation recorded at once and partly given back after a
// report could reach rgserver only netted against later consumption, and
// a group whose last statement gave some back stayed counted for it.
//
// p, purse and last are set when the session opens and never change; the
// late path for the binary log touches only p (safe for concurrent use),
// so a claim may resolve on the reader's goroutine.
type stmtLedger struct {
	p *Policy
	// purse is the session's advance on its group's tokens; last the
	// session's record of its last statement.
	purse *tokenclient.Purse
	last  *lastStatement
}

// take takes cons (of which required can get the statement refused) from
// group's bucket within left; own: the leg in the statement's own group,
// served from the session's purse when it can.
func (lg *stmtLedger) take(ctx context.Context, group string, own bool, cons ru.Consumption, required float64, left time.Duration) (tokenclient.Share, time.Duration, error) {
	purse := lg.purse
	if !own {
		purse = nil // the session's purse is its own group's
	}
	return lg.p.tokens.TakeShare(ctx, purse, group, cons, required, left)
}

// refund gives back what the statement's legs took from their buckets:
// the statement was refused after charge began. Nothing was recorded.
func (lg *stmtLedger) refund(cur *statement) {
	for i := range cur.nlegs {
		if l := &cur.legs[i]; l.charged {
			lg.p.tokens.Settle(nil, l.group, -l.prepaid.RU(), ru.Consumption{})
			l.charged = false
		}
	}
}

// counted is c as the series count it (groupSeries.added): no part below
// zero, so that what tokenclient reports of a statement is what
// rgproxy_ru_consumed_total counted of it (a failed write's byte refund
// lowers the bucket's charge, not the count).
func counted(c ru.Consumption) ru.Consumption {
	c.RRU, c.WRU = max(c.RRU, 0), max(c.WRU, 0)
	c.ReadBytes, c.WriteBytes = max(c.ReadBytes, 0), max(c.WriteBytes, 0)
	c.BackendSeconds, c.CPUSeconds = max(c.BackendSeconds, 0), max(c.CPUSeconds, 0)
	return c
}

// recordRefused records a statement refused (errCode 8252, or 8254 for a
// quarantined one) as the session's last: it cost nothing, waited what it
// waited, and would have cost its prepaid.
func (lg *stmtLedger) recordRefused(cur *statement, errCode uint16) {
	*lg.last = lastStatement{valid: true, group: cur.group, tagGroup: cur.tagGroup, shapeGroup: cur.shapeGroup,
		waited: cur.waited, errCode: errCode, estimate: cur.prepaid}
}

// denied counts a statement refused before it ran in group — throttled
// (8252), or refused otherwise (a budget's REFUSE) — with its prepaid
// cost, the RU it would have cost: the usage history's demand not served.
func (lg *stmtLedger) denied(group string, cur *statement, throttled bool) {
	if throttled {
		lg.p.tokens.CountThrottled(group, cur.prepaid.RU())
		return
	}
	lg.p.tokens.CountRefused(group, cur.prepaid.RU())
}

// settlement is what After measured of a statement, for settle.
type settlement struct {
	// after is the cost measured after the statement (ru.AfterCost);
	// chargeTo the group that pays it (a SWITCH_GROUP watch's target,
	// else the statement's group).
	after    ru.Consumption
	chargeTo string
	class    ru.Class // the statement's class
	errCode  uint16   // as SHOW LAST STATEMENT RU shows it
	// ran: the statement reached the backend; a shaped one teaches its
	// shape (observe) with its digest, latency and failure.
	ran     bool
	digest  digestText
	latency time.Duration
	failed  bool
}

// settle charges each leg the statement's cost beyond what it took (or
// gives back what it took beyond its cost), records the statement as the
// session's last, teaches its shape and adds its cost to its groups'
// series; it returns the cost. own is the series of the statement's
// group. Each leg paid its prepaid up front (or owes it as the session's
// debt) and owes before + after. After SWITCH_GROUP the target pays what
// came after, and the statement's group gets back what it paid beyond the
// before-cost.
func (lg *stmtLedger) settle(cur *statement, own *groupSeries, memo *shapeMemo, st settlement) ru.Consumption {
	tok := lg.p.tokens
	total := cur.before
	total.Add(st.after)
	switched := st.chargeTo != cur.group
	for i := range cur.nlegs {
		l := &cur.legs[i]
		if l.waited {
			// The demand that waited: only a statement that slept for its
			// tokens adds to the group's next report.
			tok.CountWaited(l.group, l.prepaid.RU())
		}
		if i == 0 && switched {
			tok.Settle(nil, l.group, cur.before.RU()-l.prepaid.RU(), counted(cur.before))
			tok.Settle(nil, st.chargeTo, st.after.RU(), counted(st.after))
			lg.attribute(l.group, &cur.bill, cur.before)
			lg.attribute(st.chargeTo, &cur.bill, st.after)
			continue
		}
		lg.attribute(l.group, &cur.bill, total)
		var purse *tokenclient.Purse
		if i == 0 {
			purse = lg.purse
		}
		tok.Settle(purse, l.group, total.RU()-l.prepaid.RU(), counted(total))
	}
	lg.p.calib.totals.add(total) // once per statement, however many legs paid it
	*lg.last = lastStatement{valid: true, group: cur.group, cost: total, waited: cur.waited, would: cur.would,
		estimate: cur.prepaid, errCode: st.errCode}
	for _, l := range cur.legs[1:cur.nlegs] {
		switch l.kind {
		case legTag:
			lg.last.tagGroup = l.group
		case legShape:
			lg.last.shapeGroup = l.group
		}
	}
	if cur.hasShape && st.ran { // a statement that never ran teaches nothing
		lg.p.shapes.observe(cur.shape, memo, st.digest, total, st.latency, cur.waited, st.failed, cur.start)
		for _, l := range cur.legs[1:cur.nlegs] {
			// A tag's or digest's group paid the statement too: its
			// summary shows it.
			lg.p.shapes.observe(shapeKey{group: l.group, hash: cur.shape.hash}, nil, st.digest, total,
				st.latency, cur.waited, st.failed, cur.start)
		}
	}
	if switched {
		// The statement and its before-cost in its group, what came after
		// in the target, as their buckets were charged.
		own.charged(st.class, cur.before)
		lg.p.metrics.seeGroup(st.chargeTo, cur.start).added(st.after)
	} else {
		own.charged(st.class, total)
	}
	for _, l := range cur.legs[1:cur.nlegs] {
		lg.p.metrics.seeGroup(l.group, cur.start).charged(st.class, total)
	}
	return total
}

// lateTo is where a statement's late charges go: its groups (its own and,
// in strict mode, a bound tag's and a bound digest's), with their series,
// and its shape. It is
// taken when the statement ends, so that a charge resolved after the
// session moved on still finds them.
type lateTo struct {
	groups  [maxLegs]groupRef
	ngroups int
	// shape is the statement's; hasShape says it has one. learn: the
	// shape's estimate learns the charge (a statement's own write);
	// otherwise (a transaction's bytes, charged at its end) only its
	// summary counts it.
	shape    shapeKey
	hasShape bool
	learn    bool
	// bill is the statement's billing (chargeback).
	bill billing
}

// lateTargets is where the statement in flight's late charges go; own is
// the series of its group, learn as lateTo's.
func (lg *stmtLedger) lateTargets(cur *statement, own *groupSeries, learn bool) lateTo {
	to := lateTo{ngroups: 1, shape: cur.shape, hasShape: cur.hasShape, learn: learn, bill: cur.bill}
	to.groups[0] = groupRef{cur.group, own}
	for _, l := range cur.legs[1:cur.nlegs] {
		to.groups[to.ngroups] = groupRef{l.group, lg.p.metrics.seeGroup(l.group, cur.start)}
		to.ngroups++
	}
	return to
}

// wrotePacket counts the bytes the statement's own packet wrote (charged
// in its before-cost) in its groups' written-bytes series.
func (lg *stmtLedger) wrotePacket(to *lateTo, bytes float64) {
	if bytes > 0 {
		for _, g := range to.groups[:to.ngroups] {
			g.series.written[srcPacket].Add(bytes)
		}
	}
}

// late charges extra, written bytes that src found beyond those charged,
// to the statement's groups, their series and its shape. session: on the
// session's goroutine, right after the statement (the estimate): its own
// group is charged through the purse and the session's record counts it;
// otherwise (a binary-log claim, on the reader's goroutine) neither is
// touched, and the claim keeps what it charged.
func (lg *stmtLedger) late(to *lateTo, extra ru.Consumption, src wsrc, session bool) {
	if extra.IsZero() {
		return
	}
	lg.p.calib.totals.add(extra)
	for i, g := range to.groups[:to.ngroups] {
		var purse *tokenclient.Purse
		if i == 0 && session {
			purse = lg.purse
		}
		lg.p.tokens.Settle(purse, g.name, extra.RU(), extra)
		lg.attribute(g.name, &to.bill, extra)
		g.series.wru.Add(extra.WRU)
		g.series.written[src].Add(extra.WriteBytes)
		if to.hasShape {
			lg.p.shapes.lateWRU(shapeKey{group: g.name, hash: to.shape.hash}, extra.WRU, to.learn)
		}
	}
	if session {
		lg.last.cost.Add(extra)
	}
}

// repay takes a session's debt to d.group from the group's bucket within
// left; the statements behind it were counted (and recorded) when they
// ran.
func (lg *stmtLedger) repay(ctx context.Context, d debt, left time.Duration) (tokenclient.Share, time.Duration, error) {
	return lg.p.tokens.TakeShare(ctx, nil, d.group, d.cons, d.required, left)
}

// leaveToGroup takes a debt nobody can repay any more (no room to keep it
// for the user's next session) from its group's bucket; like repay, it
// records nothing.
func (lg *stmtLedger) leaveToGroup(d debt) {
	lg.p.tokens.Settle(nil, d.group, d.cons.RU(), ru.Consumption{})
}

// chargeExpiredDebts charges the debts of ended sessions whose users did
// not come back within ledgerMemory to their groups (Run, now and then).
func (p *Policy) chargeExpiredDebts() {
	lg := stmtLedger{p: p} // no session: leaveToGroup touches only p
	for _, d := range p.ledger.expire(p.clk.Now()) {
		lg.leaveToGroup(d)
	}
}
