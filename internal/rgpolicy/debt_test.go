package rgpolicy

import (
	"context"
	"io"
	"log/slog"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// fillTokens is recordingTokens whose groups' buckets fill at their
// RU_PER_SEC on a fake clock, holding at most one second of it: a
// statement whose tokens the fill pays within its wait waits that long
// (the clock advances), one it cannot pay is refused at once and takes
// nothing, as tokenclient's AcquireShare does (every RU is required).
type fillTokens struct {
	*recordingTokens
	clk   *clock.Fake
	level map[string]float64
	at    map[string]time.Time
	paid  map[string]float64 // RU taken from each bucket: acquired and charged
}

func newFillTokens(clk *clock.Fake) *fillTokens {
	return &fillTokens{recordingTokens: testGroups(), clk: clk,
		level: map[string]float64{}, at: map[string]time.Time{}, paid: map[string]float64{}}
}

// refill brings group's bucket to now and returns its rate (0: unlimited).
func (f *fillTokens) refill(group string) float64 {
	g := f.groups[group]
	if g.RUPerSec == resourcegroup.Unlimited || g.Burst == resourcegroup.BurstUnlimited {
		return 0
	}
	rate := float64(g.RUPerSec)
	now := f.clk.Now()
	if last, ok := f.at[group]; ok {
		f.level[group] = min(f.level[group]+rate*now.Sub(last).Seconds(), rate)
	}
	f.at[group] = now
	return rate
}

func (f *fillTokens) TakeShare(ctx context.Context, _ *tokenclient.Purse, group string, c ru.Consumption, _ float64, maxWait time.Duration) (tokenclient.Share, time.Duration, error) {
	if _, ok := f.groups[group]; !ok {
		return tokenclient.Share{}, 0, tokenclient.ErrUnknownGroup
	}
	f.acquired = append(f.acquired, group+":"+maxWait.String())
	rate := f.refill(group)
	sh := f.share(group)
	sh.Tokens = f.level[group]
	var wait time.Duration
	if need := c.RU() - f.level[group]; rate > 0 && need > 0 {
		wait = time.Duration(need / rate * float64(time.Second))
		if wait > maxWait {
			return sh, 0, tokenclient.ErrThrottled
		}
		// The fill pays the reservation: more than the bucket holds.
		f.clk.Advance(wait)
		f.level[group] += rate * wait.Seconds()
		f.at[group] = f.clk.Now()
	}
	f.level[group] -= c.RU()
	f.paid[group] += c.RU()
	f.ru += c.RU()
	return sh, wait, nil
}

func (f *fillTokens) Settle(p *tokenclient.Purse, group string, tokens float64, rec ru.Consumption) {
	f.recordingTokens.Settle(p, group, tokens, rec)
	f.refill(group)
	f.level[group] -= tokens
	f.paid[group] += tokens
}

// newDebtPolicy is a policy on fillTokens with "bound" at 20 RU/s and an
// empty bucket, the user app bound to it.
func newDebtPolicy(t *testing.T, maxWait time.Duration) (*Policy, *fillTokens, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake()
	tok := newFillTokens(clk)
	tok.groups["bound"] = resourcegroup.Group{Name: "bound", RUPerSec: 20}
	tok.refill("bound")
	p, err := New(Config{Tokens: tok, Clock: clk, CPU: CPUWall,
		Settings: Settings{Strict: true, MaxWait: maxWait, MaxWaitInTxn: 100 * time.Millisecond},
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return p, tok, clk
}

// inTxn is q scanned, inside an open transaction.
func inTxn(q string) *mysqlproto.Statement {
	st := query(q)
	st.InTransaction = true
	return st
}

// insertOf is an INSERT whose before-cost is about n RU.
func insertOf(n int) string {
	return "INSERT INTO t VALUES ('" + strings.Repeat("x", (n-2)*1024) + "')"
}

// runDebt runs st through Before and, when it was let through, After;
// it returns the error rgproxy answered, if any.
func runDebt(s mysqlproto.SessionPolicy, st *mysqlproto.Statement) *mysqlproto.Error {
	v := s.Before(context.Background(), st, plainGrants)
	if v.Reply != nil {
		return v.Reply.Err
	}
	s.After(st, &mysqlproto.Outcome{RequestBytes: st.PayloadBytes})
	return nil
}

// owedBy is what user owes group in the ledger, open and ended.
func owedBy(p *Policy, user, group string) float64 {
	p.ledger.mu.Lock()
	defer p.ledger.mu.Unlock()
	return p.ledger.owedLocked(user, group)
}

// oweFiveSessions has five sessions of app each run a statement of
// about 11 RU on debt inside a transaction and end: the user owes about
// 55 RU, within its bound.
func oweFiveSessions(t *testing.T, p *Policy) float64 {
	t.Helper()
	for range 5 {
		s := p.Open(mysqlproto.SessionInfo{User: "app"}).(*session)
		if err := runDebt(s, inTxn(insertOf(11))); err != nil {
			t.Fatalf("inside a transaction: %s", err.Message)
		}
		s.Event(mysqlproto.EventClose, mysqlproto.SessionInfo{})
	}
	return owedBy(p, "app", "bound")
}

// What a user owes a group is bounded over all its sessions, open or
// ended: accountDebtSeconds of the rate (60 RU at 20 RU/s), past the one
// statement a user that owes nothing may run however heavy; the rest of
// its sessions' statements inside transactions are refused. Its next
// statement outside a transaction then waits about three seconds, well
// within --max-wait. Before, each session could owe a second of the rate
// and the ledger summed them: twenty sessions left 20 seconds of debt.
func TestDebtBoundedPerUser(t *testing.T) {
	cases := []struct {
		name string
		// sessions each run one statement of stmtRU inside a transaction,
		// all open at once (concurrent) or each closed before the next.
		sessions   int
		stmtRU     int
		concurrent bool
		wantRan    int
		// In the ledger once they ended: what ran, up to the bound
		// (60 RU); the excess is charged to the group.
	}{
		{name: "20 sessions one after another", sessions: 20, stmtRU: 11, wantRan: 5},
		{name: "20 sessions at once", sessions: 20, stmtRU: 11, concurrent: true, wantRan: 5},
		{name: "a statement heavier than the bound when nothing is owed", sessions: 20, stmtRU: 100, wantRan: 1},
		{name: "within the bound", sessions: 3, stmtRU: 11, wantRan: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, tok, _ := newDebtPolicy(t, 10*time.Second)
			st := inTxn(insertOf(tc.stmtRU))
			cost := p.cost.BeforeCost(ru.RequestInfo{Class: st.Class, WriteBytes: st.PayloadBytes}).RU()
			ran := 0
			var open []*session
			for range tc.sessions {
				s := p.Open(mysqlproto.SessionInfo{User: "app"}).(*session)
				err := runDebt(s, st)
				switch {
				case err == nil:
					ran++
				case err.Code != 8252:
					t.Fatalf("refused with %d: %s", err.Code, err.Message)
				case !strings.Contains(err.Message, "the sessions of user app already owe the group "):
					t.Fatalf("8252 inside a transaction does not name the user's bound: %s", err.Message)
				}
				if tc.concurrent {
					open = append(open, s)
				} else {
					s.Event(mysqlproto.EventClose, mysqlproto.SessionInfo{})
				}
			}
			for _, s := range open {
				s.Event(mysqlproto.EventClose, mysqlproto.SessionInfo{})
			}
			owed := owedBy(p, "app", "bound")
			t.Logf("%d sessions, statements of %.3f RU: %d ran on debt, the user owes %.3f RU", tc.sessions, cost, ran, owed)
			if ran != tc.wantRan {
				t.Errorf("%d statements ran on debt, want %d", ran, tc.wantRan)
			}
			ranRU := float64(tc.wantRan) * cost
			if want := min(ranRU, 60); !near(owed, want) || !near(tok.paid["bound"], ranRU-want) {
				t.Errorf("the user owes %.3f RU and the group was charged %.3f; want %.3f and %.3f", owed, tok.paid["bound"], want, ranRU-want)
			}
			// The next statement outside a transaction pays what ran on
			// debt by waiting: its user's debt, and the excess the group
			// took — at most owed ÷ 20 s, the one heavy statement aside.
			s := p.Open(mysqlproto.SessionInfo{User: "app"}).(*session)
			if err := runDebt(s, query("SELECT 1")); err != nil {
				t.Fatalf("the next statement: %s", err.Message)
			}
			if want := time.Duration(ranRU / 20 * float64(time.Second)); s.last.waited < want-50*time.Millisecond || s.last.waited > want+time.Second {
				t.Errorf("the next statement waited %v, want about %v", s.last.waited, want)
			}
			if left := owedBy(p, "app", "bound"); left != 0 {
				t.Errorf("the user still owes %v RU", left)
			}
		})
	}
}

// A refusal never adds to a debt, nor keeps it in the ledger longer:
// sessions that take the debt, are refused (it cannot be paid: the group
// owes far more) and end, leave it as it was, and the ledger hands it to
// its group ledgerMemory after the sessions that ran it up left it. Before, each
// session that ended put the debt back as new, so that it never expired
// while its user kept trying.
func TestDebtRefusalAddsNothing(t *testing.T) {
	cases := []struct {
		name string
		// inTxn: each session is also refused a statement inside a
		// transaction (the user is at its bound).
		inTxn bool
	}{
		{name: "refused outside a transaction"},
		{name: "refused inside a transaction too", inTxn: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, tok, clk := newDebtPolicy(t, time.Second)
			owed := oweFiveSessions(t, p)
			tok.Settle(nil, "bound", 1e6, ru.Consumption{RRU: 1e6}) // the group owes: no wait pays anything
			paid := tok.paid["bound"]
			for i := range 10 {
				clk.Advance(time.Minute)
				s := p.Open(mysqlproto.SessionInfo{User: "app"}).(*session)
				err := runDebt(s, query("SELECT 1"))
				if err == nil || err.Code != 8252 {
					t.Fatalf("attempt %d: %+v, want 8252", i, err)
				}
				if !strings.Contains(err.Message, "the user app owes "+formatRU(owed)+" RU") {
					t.Errorf("attempt %d: %s, want it to name the %s RU owed", i, err.Message, formatRU(owed))
				}
				if tc.inTxn {
					if err := runDebt(s, inTxn(insertOf(12))); err == nil || err.Code != 8252 {
						t.Fatalf("attempt %d inside a transaction: %+v, want 8252", i, err)
					}
				}
				s.Event(mysqlproto.EventClose, mysqlproto.SessionInfo{})
				if got := owedBy(p, "app", "bound"); got != owed {
					t.Fatalf("after refused attempt %d the user owes %v RU, want %v", i, got, owed)
				}
			}
			if tok.paid["bound"] != paid {
				t.Fatalf("the refusals took %v RU from the group", tok.paid["bound"]-paid)
			}
			// Ten minutes and a second after the first session left it, the
			// sweep hands the debt to its group.
			clk.Advance(ledgerMemory - 10*time.Minute + time.Second)
			p.chargeExpiredDebts()
			if got := owedBy(p, "app", "bound"); got != 0 || !near(tok.paid["bound"]-paid, owed) {
				t.Fatalf("after ledgerMemory the user owes %v, the group was charged %v; want 0 and %v",
					got, tok.paid["bound"]-paid, owed)
			}
		})
	}
}

// A debt is paid by waiting: when --max-wait cannot pay it whole, each
// attempt pays what its wait can and says what is still owed and when it
// clears, so a client that retries runs within about the debt's seconds
// of the rate. Before, a debt the wait could not pay whole was refused
// as it stood, every time.
func TestDebtPaidByWaiting(t *testing.T) {
	msg := regexp.MustCompile(`^Exceeded resource group quota limitation \(resource group bound\): the user app owes ([0-9.]+) RU ` +
		`its sessions ran on debt inside transactions and clears in about ([0-9.]+m?s) at its RU_PER_SEC 20; ` +
		`this statement paid ([0-9.]+) RU of it \(waited 1s of --max-wait 1s\), and each retry pays what its wait can$`)
	cases := []struct {
		name     string
		maxWait  time.Duration
		attempts int // the one that runs
	}{
		{name: "--max-wait pays it", maxWait: 30 * time.Second, attempts: 1},
		{name: "--max-wait 1s: each attempt pays a second", maxWait: time.Second, attempts: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, _, clk := newDebtPolicy(t, tc.maxWait)
			owed := oweFiveSessions(t, p)
			start := clk.Now()
			last := owed
			for i := 1; ; i++ {
				s := p.Open(mysqlproto.SessionInfo{User: "app"}).(*session)
				err := runDebt(s, query("SELECT 1"))
				s.Event(mysqlproto.EventClose, mysqlproto.SessionInfo{})
				if err == nil {
					t.Logf("%.3f RU owed: the statement ran at attempt %d, %v after the first", owed, i, clk.Now().Sub(start))
					if i != tc.attempts {
						t.Errorf("the statement ran at attempt %d, want %d", i, tc.attempts)
					}
					break
				}
				if i >= tc.attempts {
					t.Fatalf("attempt %d: %s", i, err.Message)
				}
				m := msg.FindStringSubmatch(err.Message)
				if m == nil {
					if now := owedBy(p, "app", "bound"); now == 0 && strings.Contains(err.Message, "for 0.625 RU") {
						continue // the debt is paid; the wait was spent on it
					}
					t.Fatalf("attempt %d: %q, want what is owed, when it clears and what it paid", i, err.Message)
				}
				now, clears, paid := num(t, m[1]), m[2], num(t, m[3])
				t.Logf("attempt %d: %s", i, err.Message)
				// The message's figures have three decimals.
				close := func(a, b float64) bool { return math.Abs(a-b) < 0.002 }
				if !close(now, owedBy(p, "app", "bound")) || now >= last || !close(last-now, paid) || clears != fmtDuration(ceilDuration(now/20)) {
					t.Errorf("attempt %d: owes %v (was %v) after paying %v, clears in %s", i, now, last, paid, clears)
				}
				last = now
			}
		})
	}
}

// A rebind or rgproxy's own statements are never refused for a debt: a
// user that owes its group more than any wait pays still asks
// CURRENT_RESOURCE_GROUP(), sets its group, reads its usage and its last
// statement, an administrator changes groups, and once the user is bound
// to another group its statements there run; back in the old group the
// debt is still owed. Before, all of them but the admin statements got
// 8252 for the debt.
func TestDebtNeverRefusesRebindOrOwnStatements(t *testing.T) {
	p, tok, _ := newDebtPolicy(t, time.Second) // a second pays 20 of the 55 RU owed
	oweFiveSessions(t, p)
	ctx := context.Background()
	s := p.Open(mysqlproto.SessionInfo{User: "app"}).(*session)
	steps := []struct {
		q      string
		grants grants
		want   string // the answer's single cell, "" = an OK or a rewrite
	}{
		{q: "SELECT CURRENT_RESOURCE_GROUP()", want: "bound"},
		{q: "SELECT /*+ RESOURCE_GROUP(bound) */ current_resource_group();", want: "bound"},
		{q: "SET RESOURCE GROUP bound"},
		{q: "SHOW RESOURCE GROUP USAGE LIKE 'b%'"},
		{q: "SHOW LAST STATEMENT RU"},
		{q: "CREATE RESOURCE GROUP rg_admin RU_PER_SEC = 10", grants: superGrants},
		{q: "ALTER RESOURCE GROUP rg_admin RU_PER_SEC = 20", grants: superGrants},
	}
	for _, step := range steps {
		g := step.grants
		if g == nil {
			g = plainGrants
		}
		n := len(tok.acquired)
		v := s.Before(ctx, query(step.q), g)
		if v.Reply != nil && v.Reply.Err != nil {
			t.Fatalf("%s: %d %s", step.q, v.Reply.Err.Code, v.Reply.Err.Message)
		}
		if step.want != "" {
			if v.Reply == nil || len(v.Reply.Rows) != 1 || *v.Reply.Rows[0][0] != step.want {
				t.Fatalf("%s: %+v, want %s answered by rgproxy", step.q, v, step.want)
			}
			if len(tok.acquired) != n {
				t.Fatalf("%s took tokens: %v", step.q, tok.acquired[n:])
			}
		}
		if v.Reply == nil {
			s.After(query(step.q), &mysqlproto.Outcome{})
		}
		for _, a := range tok.acquired[n:] {
			if a != "bound:1s" {
				t.Fatalf("%s acquired %v", step.q, tok.acquired[n:])
			}
		}
	}
	// Rebound to another group: its statements run there.
	tok.bindings["app@%"] = resourcegroup.Binding{User: "app", Host: "%", Group: "other"}
	tok.gen++
	s.setGroup = "" // SET RESOURCE GROUP bound would keep it; the rebind is the point
	n := len(tok.acquired)
	if err := runDebt(s, query("SELECT 1")); err != nil {
		t.Fatalf("after the rebind: %d %s", err.Code, err.Message)
	}
	if got := tok.acquired[n:]; len(got) != 1 || got[0] != "other:1s" {
		t.Fatalf("after the rebind the statement acquired %v, want other only", got)
	}
	// The debt to the old group is still owed.
	tok.bindings["app@%"] = resourcegroup.Binding{User: "app", Host: "%", Group: "bound"}
	tok.gen++
	if err := runDebt(s, query("SELECT 1")); err == nil || !strings.Contains(err.Message, "the user app owes ") {
		t.Fatalf("back in the old group: %+v, want 8252 for the debt", err)
	}
}

// The ledger's own rules: debts merge by group, keep the first time an
// ended session left them, are kept up to their limit (the rest is the
// group's), and taken by group.
func TestLedgerPutTake(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w := func(n float64) ru.Consumption { return ru.Consumption{WRU: n} }
	cases := []struct {
		name       string
		puts       [][]debt
		wantKept   float64 // owed to "g" once put
		wantExcess float64
	}{
		{name: "merged", puts: [][]debt{{{group: "g", cons: w(10), limit: 60}}, {{group: "g", cons: w(20), limit: 60}}}, wantKept: 30},
		{name: "capped at the limit", puts: [][]debt{{{group: "g", cons: w(50), limit: 60}}, {{group: "g", cons: w(50), limit: 60}}},
			wantKept: 60, wantExcess: 40},
		{name: "no limit known (a COMMIT's)", puts: [][]debt{{{group: "g", cons: w(100)}}}, wantKept: 100},
		{name: "other groups apart", puts: [][]debt{{{group: "g", cons: w(10), limit: 60}, {group: "h", cons: w(70), limit: 60}}},
			wantKept: 10, wantExcess: 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var l ledger
			excess := 0.0
			for i, debts := range tc.puts {
				for _, d := range debts {
					l.owe("u", d.group, d.cons.RU())
				}
				ex, expired := l.put("u", debts, t0.Add(time.Duration(i)*time.Minute))
				if expired != nil {
					t.Fatalf("expired %v", expired)
				}
				for _, d := range ex {
					excess += d.cons.RU()
				}
			}
			l.mu.Lock()
			kept, open := l.owedLocked("u", "g"), len(l.open)
			l.mu.Unlock()
			if !near(kept, tc.wantKept) || !near(excess, tc.wantExcess) || open != 0 {
				t.Fatalf("kept %v, excess %v, %d open counts; want %v, %v, 0", kept, excess, open, tc.wantKept, tc.wantExcess)
			}
			d, ok, expired := l.take("u", "g", t0.Add(5*time.Minute))
			if !ok || expired || !near(d.cons.RU(), tc.wantKept) || !d.since.Equal(t0) {
				t.Fatalf("take: %+v ok=%v expired=%v, want %v RU left at %v", d, ok, expired, tc.wantKept, t0)
			}
			if _, ok, _ := l.take("u", "g", t0); ok {
				t.Fatal("taken twice")
			}
		})
	}
}
