package rgpolicy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// A session's debt is what its statements ran on without their tokens:
// statements inside a transaction that could not get them within
// --max-wait-in-txn, and the COMMIT or ROLLBACK that ends a transaction.
// It is owed to each group by the session, not by the group: the tokens
// are taken from the group's bucket — and the consumption reported — only
// when the session repays, before its next statement outside a
// transaction in that group, waiting its turn like any statement. So a
// transaction never holds its locks for lack of tokens, yet running
// everything inside transactions gains a session nothing but the short
// credit below, and the group's other sessions never pay for it.
//
// The user name is what owes in the end: the policy's ledger counts what
// all its sessions owe each group, open or ended, and bounds the sum
// (accountDebtSeconds), so that opening more sessions adds no credit and
// twenty sessions that end owing leave the user's next statement a wait
// of a few seconds, not a debt that no wait can pay. A debt is paid only
// by waiting: when a statement's wait cannot pay all of it, it pays what
// the wait can (debtChunkSeconds at a time) before its 8252, so a retry
// finds less; a refusal never adds to a debt nor keeps it longer in the
// ledger. A statement repays only its own groups' debts: an account an
// administrator bound to another group is not refused there for what it
// owes the old one (the old group gets that debt when the ledger forgets
// it), and rgproxy's own statements (admin.go, CURRENT_RESOURCE_GROUP())
// repay nothing.

// txnDebtSeconds bounds a session's debt to a group: a statement inside a
// transaction may run on debt while the session owes the group less than
// this many seconds of the proxy's share of its rate (a session that owes
// nothing may always run one, however heavy, if its user's sessions owe
// the group nothing either); beyond that it is refused with 8252 once
// --max-wait-in-txn is over. One second of the rate is what the group's
// bucket holds when BURSTABLE is OFF: over a minute, a session inside one
// transaction gets at most about 1/60 more than outside.
const txnDebtSeconds = 1.0

// accountDebtSeconds bounds what one user name owes a group on this
// proxy, summed over its sessions, open and ended, in seconds of the
// proxy's share of the group's rate: past it a statement inside a
// transaction is refused (8252) rather than run on debt, and what ended
// sessions leave beyond it is charged to the group (which happens only
// past the exceptions: the COMMITs and ROLLBACKs, and the one heavy
// statement a user that owes nothing may run). Three seconds lets a
// connection pool run a few transactions on credit at once (each
// session's own bound being one second) while the user's next statement
// outside a transaction waits at most about three seconds of the rate for
// what they left — a tenth of --max-wait's default — however many
// sessions end owing.
const accountDebtSeconds = 3.0

// debtChunkSeconds is the part of a debt, in seconds of the proxy's share
// of the rate, that a statement pays at a time when its wait cannot pay
// the whole: it pays chunks until the wait is over, so that every attempt
// leaves less owed.
const debtChunkSeconds = 0.25

// debt is what a session (or the ended sessions of a user) owes one
// group: cons, of which required (the before-costs of the statements
// behind it) can get a statement refused when the whole is repaid at
// once; the rest, as a statement's estimate, is paid by waiting for the
// fill (tokenclient's required part).
type debt struct {
	group    string
	cons     ru.Consumption
	required float64
	// limit is accountDebtSeconds of the proxy's share of the group's
	// rate when the debt was run up (0: unknown, a COMMIT's): what the
	// ledger keeps of the user's ended sessions' debt to the group.
	limit float64
	// since is when an ended session first left the debt in the ledger
	// (zero while only an open session owes it): the ledger hands it to
	// its group ledgerMemory after, however often sessions take it and
	// leave it back.
	since time.Time
}

// merge adds o to d.
func (d *debt) merge(o debt) {
	d.cons.Add(o.cons)
	d.required += o.required
	d.limit = max(d.limit, o.limit)
	if d.since.IsZero() || (!o.since.IsZero() && o.since.Before(d.since)) {
		d.since = o.since
	}
}

// split takes n RU (0 < n < d.cons.RU()) off d, each part of its
// consumption in proportion, and returns them.
func (d *debt) split(n float64) debt {
	f := n / d.cons.RU()
	part := *d
	part.cons = d.cons.Scale(f)
	part.required = d.required * f
	d.cons.Sub(part.cons)
	d.required -= part.required
	return part
}

// debtTo returns what the session owes group, in RU.
func (s *session) debtTo(group string) float64 {
	if i := s.debtIndex(group); i >= 0 {
		return s.debts[i].cons.RU()
	}
	return 0
}

func (s *session) debtIndex(group string) int {
	for i := range s.debts {
		if s.debts[i].group == group {
			return i
		}
	}
	return -1
}

// runOnDebt lets the statement's leg, refused its tokens inside a
// transaction, run on the session's debt when both bounds leave room —
// the session's (txnDebtSeconds, unless it owes the group nothing) and its
// user's (accountDebtSeconds, unless they owe the group nothing), the
// latter counted in the ledger at once so that sessions of the user
// racing for the last room cannot all take it. Otherwise it returns why
// not, for the 8252.
func (s *session) runOnDebt(l *leg) string {
	n := s.cur.prepaid.RU()
	owed := s.debtTo(l.group)
	if most := l.share.Rate * txnDebtSeconds; owed > 0 && owed+n > most {
		return fmt.Sprintf("the session already owes the group %s RU of at most %s (one second of its rate here)",
			formatRU(owed), formatRU(most))
	}
	limit := l.share.Rate * accountDebtSeconds
	if owed, ok := s.p.ledger.reserve(s.user, l.group, n, limit); !ok {
		return fmt.Sprintf("the sessions of user %s already owe the group %s RU of at most %s (%g seconds of its rate here, "+
			"over all of them)", s.user, formatRU(owed), formatRU(limit), accountDebtSeconds)
	}
	l.onDebt, l.counted, l.limit = true, true, limit
	return ""
}

// addDebt adds d to what the session owes d.group.
func (s *session) addDebt(d debt) {
	if i := s.debtIndex(d.group); i >= 0 {
		s.debts[i].merge(d)
		return
	}
	s.debts = append(s.debts, d)
}

// dropDebt forgets the session's i-th debt (repaid, or its group gone).
func (s *session) dropDebt(i int) {
	s.p.ledger.release(s.user, s.debts[i].group, s.debts[i].cons.RU())
	s.debts = append(s.debts[:i], s.debts[i+1:]...)
}

// repay pays what the session's user owes group — the session's own debt
// and what its ended sessions left — within what is left of maxWait,
// before a statement outside a transaction in group; it answers 8252 when
// the wait cannot pay it all, having paid what the wait could. A group
// dropped since is owed nothing.
func (s *session) repay(ctx context.Context, group string, maxWait time.Duration) *mysqlproto.Reply {
	if d, ok, expired := s.p.ledger.take(s.user, group, s.p.clk.Now()); ok {
		s.addDebt(d)
	} else if expired {
		s.led.leaveToGroup(d)
	}
	i := s.debtIndex(group)
	if i < 0 {
		return nil
	}
	left := max(maxWait-s.cur.waited, 0)
	share, waited, err := s.led.repay(ctx, s.debts[i], left)
	s.cur.waited += waited
	switch {
	case err == nil, errors.Is(err, tokenclient.ErrUnknownGroup):
		s.dropDebt(i)
		return nil
	case ctx.Err() != nil:
		return &mysqlproto.Reply{Err: errInterrupted}
	case errors.Is(err, tokenclient.ErrThrottled):
		paid, tokens, r := s.repayPart(ctx, i, share, maxWait)
		if r != nil || s.debtIndex(group) < 0 {
			return r
		}
		return s.refused(group, s.debtDetail(group, paid, tokens, maxWait))
	}
	s.p.logger.Warn("repaying a session's debt failed", "resource_group", group, "err", err)
	return &mysqlproto.Reply{Err: errInterrupted}
}

// repayPart pays, a chunk at a time, what the rest of maxWait can of the
// session's i-th debt, which could not be paid whole; share is the
// group's as the whole was refused. It returns the RU paid and the
// group's bucket when it stopped (negative: owed).
func (s *session) repayPart(ctx context.Context, i int, share tokenclient.Share, maxWait time.Duration) (paid, tokens float64, r *mysqlproto.Reply) {
	tokens = share.Tokens
	chunk := share.Rate * debtChunkSeconds
	if !(chunk > 0) || math.IsInf(chunk, 0) {
		return 0, tokens, nil
	}
	for {
		d := &s.debts[i]
		owed := d.cons.RU()
		left := max(maxWait-s.cur.waited, 0)
		if left <= 0 {
			return paid, tokens, nil
		}
		part := *d
		if owed > chunk {
			part = d.split(chunk)
		}
		// All of a chunk is required: the fill pays it, the group's bucket
		// is not put in debt for it.
		try := part
		try.required = part.cons.RU()
		sh, waited, err := s.led.repay(ctx, try, left)
		s.cur.waited += waited
		tokens = sh.Tokens
		switch {
		case err == nil:
			paid += part.cons.RU()
			s.p.ledger.release(s.user, d.group, part.cons.RU())
			if owed <= chunk {
				s.debts = append(s.debts[:i], s.debts[i+1:]...)
				return paid, tokens, nil
			}
			continue
		case errors.Is(err, tokenclient.ErrUnknownGroup):
			if owed > chunk {
				d.merge(part)
			}
			s.dropDebt(i)
			return paid, tokens, nil
		}
		if owed > chunk {
			d.merge(part) // not paid: owed as before
		}
		if ctx.Err() != nil {
			return paid, tokens, &mysqlproto.Reply{Err: errInterrupted}
		}
		return paid, tokens, nil
	}
}

// debtDetail explains a refusal for a debt to group that the statement's
// wait could not pay: what the user still owes, when that clears at the
// group's RU_PER_SEC (after what the group's bucket owes, tokens when
// negative), and what this statement paid of it.
func (s *session) debtDetail(group string, paid, tokens float64, maxWait time.Duration) string {
	owed := s.debtTo(group)
	waited := waitDetail(s.cur.waited, maxWait, false)
	d := fmt.Sprintf("the user %s owes %s RU its sessions ran on debt inside transactions", s.user, formatRU(owed))
	if g, ok := s.group(group); ok && g.RUPerSec != resourcegroup.Unlimited && g.RUPerSec > 0 {
		groupOwed := max(-tokens, 0)
		d += fmt.Sprintf(" and clears in about %s at its RU_PER_SEC %d", fmtDuration(ceilDuration((owed+groupOwed)/float64(g.RUPerSec))), g.RUPerSec)
		if groupOwed >= 0.001 {
			d += fmt.Sprintf(" (after the %s RU the group owes)", formatRU(groupOwed))
		}
	}
	if paid > 0 {
		return d + fmt.Sprintf("; this statement paid %s RU of it (%s), and each retry pays what its wait can", formatRU(paid), waited)
	}
	return d + fmt.Sprintf("; this statement's wait could pay none of it (%s), each retry pays what its wait can", waited)
}

// leaveDebts hands what the session still owes to the policy's ledger
// under its user name, so that the user's next statement in each group
// repays it: reconnecting does not wipe a debt.
func (s *session) leaveDebts() {
	if len(s.debts) == 0 {
		return
	}
	excess, expired := s.p.ledger.put(s.user, s.debts, s.p.clk.Now())
	for _, d := range append(excess, expired...) {
		// Past the user's bound, no room in the ledger, or forgotten
		// there: the group takes the debt, as it took a transaction's
		// debt before sessions owed their own.
		s.led.leaveToGroup(d)
	}
	s.debts = nil
}

// ledger counts what each user name owes each group — the debts of its
// open sessions, which the sessions hold, and those of sessions that
// ended owing, which it keeps for ledgerMemory — and bounds the sum
// (accountDebtSeconds). A debt it forgets (its user did not come back in
// time) is handed back to be charged to its group, so that the RU the
// statements were counted for reach the group's bucket (and rgserver) all
// the same. Safe for concurrent use.
type ledger struct {
	mu sync.Mutex
	// ended holds, by user name, one debt per group left by its ended
	// sessions; endedUsers is len(ended), read without the lock so that
	// a statement finds nothing to take without taking it.
	ended      map[string][]debt
	endedUsers atomic.Int64
	// open is what the user's open sessions owe the group, in RU.
	open map[owedKey]float64
}

type owedKey struct{ user, group string }

const (
	// ledgerMemory is how long an ended session's debt waits for its
	// user's next statement in its group.
	ledgerMemory = 10 * time.Minute
	// ledgerMax bounds the users the ledger remembers ended sessions of.
	ledgerMax = 10000
)

// owedLocked is what user owes group, open and ended, in RU.
func (l *ledger) owedLocked(user, group string) float64 {
	owed := l.open[owedKey{user, group}]
	for _, d := range l.ended[user] {
		if d.group == group {
			owed += d.cons.RU()
		}
	}
	return owed
}

// reserve counts n more RU owed by user's open sessions to group when
// that keeps what the user owes the group within limit, or when it owes
// the group nothing; it returns what the user owed before.
func (l *ledger) reserve(user, group string, n, limit float64) (float64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	owed := l.owedLocked(user, group)
	if owed > 0 && owed+n > limit {
		return owed, false
	}
	if l.open == nil {
		l.open = map[owedKey]float64{}
	}
	l.open[owedKey{user, group}] += n
	return owed, true
}

// owe counts n more RU owed by user's open sessions to group, unbounded
// (a COMMIT or ROLLBACK, which never waits).
func (l *ledger) owe(user, group string, n float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open == nil {
		l.open = map[owedKey]float64{}
	}
	l.open[owedKey{user, group}] += n
}

// release counts n RU fewer owed by user's open sessions to group: repaid,
// refused, or handed on.
func (l *ledger) release(user, group string, n float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(user, group, n)
}

func (l *ledger) releaseLocked(user, group string, n float64) {
	k := owedKey{user, group}
	if v := l.open[k] - n; v > 1e-9 {
		l.open[k] = v
	} else {
		delete(l.open, k)
	}
}

// put records the debts an ended session of user owed (counted among its
// open sessions' until now) and returns what it keeps none of: beyond
// the debt's limit for the user's ended sessions, no room, or, to make
// room, other users' debts it forgot.
func (l *ledger) put(user string, debts []debt, now time.Time) (excess, expired []debt) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range debts {
		l.releaseLocked(user, d.group, d.cons.RU())
	}
	if l.ended == nil {
		l.ended = map[string][]debt{}
	}
	kept, ok := l.ended[user]
	if !ok && len(l.ended) >= ledgerMax {
		expired = l.expireLocked(now) // then give up
		if len(l.ended) >= ledgerMax {
			return debts, expired
		}
	}
	for _, d := range debts {
		if d.cons.IsZero() {
			continue
		}
		if d.since.IsZero() {
			d.since = now
		}
		i := 0
		for i < len(kept) && kept[i].group != d.group {
			i++
		}
		if i == len(kept) {
			kept = append(kept, d)
		} else {
			kept[i].merge(d)
		}
		if k := &kept[i]; k.limit > 0 && k.cons.RU() > k.limit {
			excess = append(excess, k.split(k.cons.RU()-k.limit))
		}
	}
	if len(kept) > 0 {
		l.ended[user] = kept
		l.endedUsers.Store(int64(len(l.ended)))
	}
	return excess, expired
}

// take removes what user's ended sessions owe group and returns it
// (ok), counted among its open sessions' from now; or, when it was kept
// past ledgerMemory, returns it as expired, for its group.
func (l *ledger) take(user, group string, now time.Time) (d debt, ok, expired bool) {
	if l.endedUsers.Load() == 0 {
		return debt{}, false, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	kept := l.ended[user]
	i := 0
	for i < len(kept) && kept[i].group != group {
		i++
	}
	if i == len(kept) {
		return debt{}, false, false
	}
	d = kept[i]
	kept = append(kept[:i], kept[i+1:]...)
	if len(kept) == 0 {
		delete(l.ended, user)
		l.endedUsers.Store(int64(len(l.ended)))
	} else {
		l.ended[user] = kept
	}
	if now.Sub(d.since) > ledgerMemory {
		return d, false, true
	}
	if l.open == nil {
		l.open = map[owedKey]float64{}
	}
	l.open[owedKey{user, group}] += d.cons.RU()
	return d, true, false
}

// expire forgets the debts kept past ledgerMemory and returns them.
func (l *ledger) expire(now time.Time) []debt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expireLocked(now)
}

func (l *ledger) expireLocked(now time.Time) []debt {
	var out []debt
	for u, kept := range l.ended {
		n := 0
		for _, d := range kept {
			if now.Sub(d.since) > ledgerMemory {
				out = append(out, d)
			} else {
				kept[n] = d
				n++
			}
		}
		if n == 0 {
			delete(l.ended, u)
		} else {
			l.ended[u] = kept[:n]
		}
	}
	l.endedUsers.Store(int64(len(l.ended)))
	return out
}
