package rgpolicy

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// A session's debt is what its statements ran on without their tokens:
// statements inside a transaction that could not get them within
// --max-wait-in-txn, and the COMMIT or ROLLBACK that ends a transaction.
// It is owed to each group by the session, not by the group: the tokens
// are taken from the group's bucket — and the consumption reported — only
// when the session repays, before its next statement outside a
// transaction, waiting its turn like any statement. So a transaction
// never holds its locks for lack of tokens, yet running everything inside
// transactions gains a session nothing but the short credit below, and the
// group's other sessions never pay for it.

// txnDebtSeconds bounds a session's debt to a group: a statement inside a
// transaction may run on debt while the session owes the group less than
// this many seconds of the proxy's share of its rate (a session that owes
// nothing may always run one, however heavy); beyond that it is refused
// with 8252 once --max-wait-in-txn is over. One second of the rate is
// what the group's bucket holds when BURSTABLE is OFF: over a minute, a
// session inside one transaction gets at most about 1/60 more than
// outside.
const txnDebtSeconds = 1.0

// debt is what a session owes one group: cons, of which required (the
// before-costs of the statements behind it) can get a statement refused
// when it is repaid; the rest, as a statement's estimate, is paid by
// waiting for the fill (tokenclient's required part).
type debt struct {
	group    string
	cons     ru.Consumption
	required float64
}

// debtTo returns what the session owes group, in RU.
func (s *session) debtTo(group string) float64 {
	for _, d := range s.debts {
		if d.group == group {
			return d.cons.RU()
		}
	}
	return 0
}

// debtRoom reports whether the statement's leg may run on the session's
// debt: the session owes the leg's group nothing, or the statement keeps
// the debt within txnDebtSeconds of the group's share.
func (s *session) debtRoom(l *leg) bool {
	owed := s.debtTo(l.group)
	return owed == 0 || owed+s.cur.prepaid.RU() <= l.share.Rate*txnDebtSeconds
}

// addDebt adds d to what the session owes d.group.
func (s *session) addDebt(d debt) {
	for i := range s.debts {
		if s.debts[i].group == d.group {
			s.debts[i].cons.Add(d.cons)
			s.debts[i].required += d.required
			return
		}
	}
	s.debts = append(s.debts, d)
}

// repay pays what the session owes, group by group, within what is left
// of maxWait, before a statement outside a transaction; it answers 8252
// (naming the group) when a debt cannot be paid in time. The debt of an
// earlier session of the same user (one that ended owing) is taken on
// first. A group dropped since is owed nothing.
func (s *session) repay(ctx context.Context, maxWait time.Duration) *mysqlproto.Reply {
	if !s.ledgerChecked {
		s.ledgerChecked = true
		owed, expired := s.p.ledger.take(s.user, s.p.clk.Now())
		for _, d := range owed {
			s.addDebt(d)
		}
		for _, d := range expired {
			s.led.leaveToGroup(d)
		}
	}
	for len(s.debts) > 0 {
		d := s.debts[0]
		left := max(maxWait-s.cur.waited, 0)
		share, waited, err := s.led.repay(ctx, d, left)
		s.cur.waited += waited
		switch {
		case err == nil, errors.Is(err, tokenclient.ErrUnknownGroup):
			s.debts = s.debts[1:]
		case ctx.Err() != nil:
			return &mysqlproto.Reply{Err: errInterrupted}
		case errors.Is(err, tokenclient.ErrThrottled):
			return s.refused(d.group, "the session first repays "+formatRU(d.cons.RU())+
				" RU it ran on debt inside a transaction: "+s.tokensDetail(d.group, d.required, d.cons.RU(), share.Tokens, maxWait, true))
		default:
			s.p.logger.Warn("repaying a session's debt failed", "resource_group", d.group, "err", err)
			return &mysqlproto.Reply{Err: errInterrupted}
		}
	}
	s.debts = nil
	return nil
}

// leaveDebts hands what the session still owes to the policy's ledger
// under its user name, so that the user's next session repays it:
// reconnecting does not wipe a debt.
func (s *session) leaveDebts() {
	if len(s.debts) == 0 {
		return
	}
	noRoom, expired := s.p.ledger.put(s.user, s.debts, s.p.clk.Now())
	for _, d := range append(noRoom, expired...) {
		// No room in the ledger, or forgotten there: the group takes the
		// debt, as it took a transaction's debt before sessions owed
		// their own.
		s.led.leaveToGroup(d)
	}
	s.debts = nil
}

// ledger keeps the debts of sessions that ended owing, by user name, for
// ledgerMemory; a debt it forgets (its user did not come back in time) is
// handed back to be charged to its group, so that the RU the statements
// were counted for reach the group's bucket (and rgserver) all the same.
// Safe for concurrent use.
type ledger struct {
	mu sync.Mutex
	m  map[string]ledgerEntry
}

type ledgerEntry struct {
	debts []debt
	at    time.Time
}

const (
	// ledgerMemory is how long an ended session's debt waits for its
	// user's next session.
	ledgerMemory = 10 * time.Minute
	// ledgerMax bounds the users the ledger remembers.
	ledgerMax = 10000
)

// put records debts for user and returns those it had no room for, and
// those of other users it forgot to make room.
func (l *ledger) put(user string, debts []debt, now time.Time) (noRoom, expired []debt) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]ledgerEntry{}
	}
	e, ok := l.m[user]
	if !ok && len(l.m) >= ledgerMax {
		expired = l.expireLocked(now) // then give up
		if len(l.m) >= ledgerMax {
			return debts, expired
		}
	}
	for _, d := range debts {
		found := false
		for i := range e.debts {
			if e.debts[i].group == d.group {
				e.debts[i].cons.Add(d.cons)
				e.debts[i].required += d.required
				found = true
			}
		}
		if !found {
			e.debts = append(e.debts, d)
		}
	}
	e.at = now
	l.m[user] = e
	return nil, expired
}

// take removes and returns what user's ended sessions owe, or, when it
// was kept past ledgerMemory, returns it as expired.
func (l *ledger) take(user string, now time.Time) (owed, expired []debt) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.m[user]
	if !ok {
		return nil, nil
	}
	delete(l.m, user)
	if now.Sub(e.at) > ledgerMemory {
		return nil, e.debts
	}
	return e.debts, nil
}

// expire forgets the debts kept past ledgerMemory and returns them.
func (l *ledger) expire(now time.Time) []debt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expireLocked(now)
}

func (l *ledger) expireLocked(now time.Time) []debt {
	var out []debt
	for u, e := range l.m {
		if now.Sub(e.at) > ledgerMemory {
			delete(l.m, u)
			out = append(out, e.debts...)
		}
	}
	return out
}
