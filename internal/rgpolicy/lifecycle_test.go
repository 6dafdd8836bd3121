package rgpolicy

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
)

// fakePolicy is a policy on a fake clock, with a helper to run Before on
// its own goroutine and wait until n statements wait on the clock.
type fakePolicy struct {
	t   *testing.T
	p   *Policy
	clk *clock.Fake
}

func newFakePolicy(t *testing.T, tok *recordingTokens, set Settings) *fakePolicy {
	clk := clock.NewFake()
	p, err := New(Config{Tokens: tok, Settings: set, CPU: CPUWall, Clock: clk,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return &fakePolicy{t: t, p: p, clk: clk}
}

func (f *fakePolicy) open(user string) *session {
	return f.p.Open(mysqlproto.SessionInfo{User: user}).(*session)
}

func (f *fakePolicy) before(s *session, st *mysqlproto.Statement) <-chan mysqlproto.Verdict {
	done := make(chan mysqlproto.Verdict, 1)
	go func() { done <- s.Before(context.Background(), st, plainGrants) }()
	return done
}

// waiting waits until n timers are pending on the fake clock.
func (f *fakePolicy) waiting(n int) {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for f.clk.Pending() != n {
		if time.Now().After(deadline) {
			f.t.Fatalf("%d timers pending, want %d", f.clk.Pending(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// verdict returns what Before answered, failing if it is still blocked.
func (f *fakePolicy) verdict(what string, done <-chan mysqlproto.Verdict) mysqlproto.Verdict {
	f.t.Helper()
	select {
	case v := <-done:
		return v
	case <-time.After(5 * time.Second):
		f.t.Fatalf("%s is still waiting", what)
	}
	return mysqlproto.Verdict{}
}

func errCode(v mysqlproto.Verdict) uint16 {
	if v.Reply == nil || v.Reply.Err == nil {
		return 0
	}
	return v.Reply.Err.Code
}

// A statement waiting for the COOLDOWN slot holds no place in its group's
// gate (an unrelated statement of the group runs meanwhile, under
// MAX_CONCURRENCY = 1), and waits at most --max-wait: then 8252.
func TestPolicyCooldownWaitIsBoundedAndHoldsNoGate(t *testing.T) {
	tok := testGroups()
	tok.groups["bound"] = resourcegroup.Group{Name: "bound", RUPerSec: 1000, MaxConcurrency: 1}
	tok.watches = []resourcegroup.Watch{{Group: "bound", Action: resourcegroup.ActionCooldown,
		Match: resourcegroup.WatchExact, Text: "SELECT SLEEP(10)"}}
	f := newFakePolicy(t, tok, Settings{Strict: true, MaxWait: 2 * time.Second, MaxWaitInTxn: 100 * time.Millisecond})
	a, b, c := f.open("app"), f.open("app"), f.open("app")

	first := query("SELECT SLEEP(10)")
	if v := f.verdict("the first cooled-down statement", f.before(a, first)); v.Reply != nil {
		t.Fatalf("first: %+v", v.Reply.Err)
	}
	// It holds the cooldown slot and the group's only place; the second
	// waits for the cooldown slot, holding no place in the gate.
	bDone := f.before(b, query("SELECT SLEEP(10)"))
	f.waiting(1)
	a.After(first, &mysqlproto.Outcome{}) // frees the gate and the slot: b enters
	if v := f.verdict("the second cooled-down statement", bDone); v.Reply != nil {
		t.Fatalf("second: %+v", v.Reply.Err)
	}
	// Now b runs, holding the slot and the group's place; a third waits
	// for the slot without taking the place away from anyone...
	cDone := f.before(c, query("SELECT SLEEP(10)"))
	f.waiting(1)
	// (b may or may not be its shape's probe: that depends on whether it
	// reached the gate before a's After ended a's probe.)
	if got := strings.TrimSuffix(f.p.gates.get("bound").String(), " probes=1"); got != "bound=250 max=1 inflight=0.625 running=1 waiting=0" {
		t.Fatalf("the gate while a statement waits for the cooldown slot: %s", got)
	}
	// ...and gives up after --max-wait: 8252, counted as throttled.
	f.clk.Advance(2 * time.Second)
	if v := f.verdict("the third cooled-down statement", cDone); errCode(v) != 8252 || v.Reply.Err.Message !=
		"Exceeded resource group quota limitation (resource group bound): waited 2s of --max-wait 2s "+
			"for the proxy's COOLDOWN slot (a runaway watch lets one such statement run at a time)" {
		t.Fatalf("a cooldown wait past --max-wait: %+v", v.Reply)
	}
	if len(tok.throttled) != 1 {
		t.Fatalf("throttled %v, want one", tok.throttled)
	}
	b.After(query("SELECT SLEEP(10)"), &mysqlproto.Outcome{})
	// An unrelated statement of the group enters while a cooled-down one
	// waits for the slot: the waiter holds no place in MAX_CONCURRENCY.
	if v := f.verdict("a cooled-down statement", f.before(a, first)); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	cDone = f.before(c, query("SELECT SLEEP(10)"))
	f.waiting(1)
	a.After(first, &mysqlproto.Outcome{})
	// c takes the slot and the place; then b's unrelated SELECT waits for
	// the place (MAX_CONCURRENCY = 1), not for the cooldown.
	if v := f.verdict("the cooled-down statement", cDone); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	bDone = f.before(b, query("SELECT 1"))
	f.waiting(1)
	c.After(query("SELECT SLEEP(10)"), &mysqlproto.Outcome{})
	if v := f.verdict("an unrelated statement", bDone); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	b.After(query("SELECT 1"), &mysqlproto.Outcome{})
	if got := f.p.gates.get("bound").String(); got != "bound=250 max=1 inflight=0 running=0 waiting=0" {
		t.Fatalf("at the end: %s", got)
	}
}

// Inside a transaction MAX_CONCURRENCY still holds: a statement that
// cannot enter within --max-wait-in-txn is refused (it does not run over
// the cap), while the in-flight RU bound lets it through on its debt.
func TestPolicyMaxConcurrencyHoldsInsideTransactions(t *testing.T) {
	tok := testGroups()
	tok.groups["bound"] = resourcegroup.Group{Name: "bound", RUPerSec: 1000, MaxConcurrency: 1}
	f := newFakePolicy(t, tok, Settings{Strict: true, MaxWait: 30 * time.Second, MaxWaitInTxn: 100 * time.Millisecond})
	a, b := f.open("app"), f.open("app")
	st := query("SELECT SLEEP(1)")
	st.InTransaction = true
	if v := f.verdict("the first", f.before(a, st)); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	bDone := f.before(b, st)
	f.waiting(1)
	f.clk.Advance(100 * time.Millisecond)
	if v := f.verdict("the second", bDone); errCode(v) != 8252 {
		t.Fatalf("a second statement in a transaction at MAX_CONCURRENCY = 1: %+v, want 8252", v.Reply)
	}
	// Its COMMIT is never held.
	commit := query("COMMIT")
	commit.InTransaction = true
	if v := f.verdict("COMMIT", f.before(b, commit)); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	b.After(commit, &mysqlproto.Outcome{})
	a.After(st, &mysqlproto.Outcome{})
}

// Outside a transaction the backend concurrency cap holds a statement at
// most --max-wait, then refuses it.
func TestPolicyBackendCapWaitIsBounded(t *testing.T) {
	tok := testGroups()
	f := newFakePolicy(t, tok, Settings{Strict: true, MaxWait: time.Second, MaxWaitInTxn: 100 * time.Millisecond,
		MaxBackendConcurrency: 1})
	a, b := f.open("app"), f.open("app")
	st := query("SELECT 1")
	if v := f.verdict("the first", f.before(a, st)); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	bDone := f.before(b, query("SELECT 2 FROM DUAL")) // another shape: no probe to wait for
	f.waiting(1)
	f.clk.Advance(time.Second)
	if v := f.verdict("the second", bDone); errCode(v) != 8252 {
		t.Fatalf("at the backend cap past --max-wait: %+v, want 8252", v.Reply)
	}
	// It gave back its tokens and its gate place.
	if len(tok.charged) != 1 || !near(tok.amounts[0], -0.625) {
		t.Fatalf("refunds %v %v, want one of -0.625", tok.charged, tok.amounts)
	}
	a.After(st, &mysqlproto.Outcome{})
}

// SET RESOURCE GROUP is judged again when the bindings change: a pooled
// session that set default while unbound returns to its binding's group
// once the account is bound.
func TestPolicySetGroupJudgedAgainWhenBindingsChange(t *testing.T) {
	tok := testGroups()
	delete(tok.bindings, "app@%")
	f := newFakePolicy(t, tok, Settings{Strict: true, MaxWait: time.Second, MaxWaitInTxn: 100 * time.Millisecond})
	s := f.open("app")
	if v := f.verdict("SET", f.before(s, query("SET RESOURCE GROUP default"))); errCode(v) != 0 {
		t.Fatalf("SET default while unbound: %+v", v.Reply)
	}
	st := query("SELECT 1")
	if v := f.verdict("a statement", f.before(s, st)); v.Reply != nil || s.cur.group != "default" {
		t.Fatalf("unbound: %+v in %s", v.Reply, s.cur.group)
	}
	s.After(st, &mysqlproto.Outcome{})
	// The administrator binds the account: the next statement runs in its group.
	tok.bindings["app@%"] = resourcegroup.Binding{User: "app", Host: "%", Group: "bound"}
	tok.gen++
	if v := f.verdict("a statement", f.before(s, st)); v.Reply != nil || s.cur.group != "bound" {
		t.Fatalf("after the binding: %+v in %s, want bound", v.Reply, s.cur.group)
	}
	s.After(st, &mysqlproto.Outcome{})
	if s.setGroup != "" {
		t.Fatalf("the session still names %q", s.setGroup)
	}
	// A SUPER session keeps what it set.
	r := f.open("root")
	done := make(chan mysqlproto.Verdict, 1)
	go func() { done <- r.Before(context.Background(), query("SET RESOURCE GROUP other"), superGrants) }()
	if v := f.verdict("SET", done); errCode(v) != 0 {
		t.Fatal(v.Reply.Err)
	}
	tok.gen++
	go func() { done <- r.Before(context.Background(), st, superGrants) }()
	if v := f.verdict("a statement", done); v.Reply != nil || r.cur.group != "other" {
		t.Fatalf("SUPER after a binding change: %+v in %s, want other", v.Reply, r.cur.group)
	}
	r.After(st, &mysqlproto.Outcome{})
}

// A tagged statement (strict mode) passes both groups: refused by the
// tag's group, it gets 8252 naming that group and its own group's tokens
// back; admitted, it holds a place in both gates and settles in both.
func TestPolicyTagAddsItsGroupsLimits(t *testing.T) {
	tok := tagGroups()
	tok.groups["reports"] = resourcegroup.Group{Name: "reports", RUPerSec: 100, MaxConcurrency: 1}
	f := newFakePolicy(t, tok, Settings{Strict: true, MaxWait: time.Second, MaxWaitInTxn: 100 * time.Millisecond})
	a, b := f.open("app"), f.open("nobody")
	tagged := query("SELECT 1 /*route='%2Freport'*/")
	if v := f.verdict("a tagged statement", f.before(a, tagged)); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	if got := f.p.gates.get("reports").String(); got != "bound=25 max=1 inflight=0.625 running=1 waiting=0" {
		t.Fatalf("the tag's gate: %s", got)
	}
	if got := f.p.gates.get("bound").String(); got != "bound=25 max=0 inflight=0.625 running=1 waiting=0 probes=1" {
		t.Fatalf("the account's gate: %s", got)
	}
	// Another user's statement with the same tag waits for the tag
	// group's MAX_CONCURRENCY, and is refused after --max-wait with its
	// own group's tokens given back.
	bDone := f.before(b, tagged)
	f.waiting(1)
	f.clk.Advance(time.Second)
	v := f.verdict("the second tagged statement", bDone)
	if errCode(v) != 8252 || v.Reply.Err.Message != "Exceeded resource group quota limitation (resource group reports): "+
		"waited 1s of --max-wait 1s for one of the group's MAX_CONCURRENCY places (1 on this proxy)" {
		t.Fatalf("refused by the tag's group: %+v", v.Reply)
	}
	if len(tok.charged) != 2 || tok.charged[0] != "default" || tok.charged[1] != "reports" {
		t.Fatalf("refunds after the refusal: %v %v, want default's and reports' tokens back", tok.charged, tok.amounts)
	}
	tok.charged, tok.amounts = nil, nil
	a.After(tagged, &mysqlproto.Outcome{RequestBytes: tagged.PayloadBytes, BackendTime: 3 * time.Millisecond})
	// Both groups pay the statement's cost: 1 RU of CPU beyond what each took.
	if len(tok.charged) != 2 || tok.charged[0] != "bound" || tok.charged[1] != "reports" ||
		!near(tok.amounts[0], 1) || !near(tok.amounts[1], 1) {
		t.Fatalf("settled %v %v, want 1 RU in bound and in reports", tok.charged, tok.amounts)
	}
	for _, g := range []string{"bound", "reports"} {
		if got := f.p.gates.get(g).String(); got != "bound=25 max="+map[string]string{"bound": "0", "reports": "1"}[g]+" inflight=0 running=0 waiting=0" {
			t.Fatalf("%s's gate at the end: %s", g, got)
		}
	}
}

// 8252 says why: the group, its limit, how long the statement waited and,
// when its cost can never be granted within the wait, what would let it
// through; SHOW LAST STATEMENT RU shows the refused statement's estimate.
func TestPolicyThrottledSaysWhy(t *testing.T) {
	tok := testGroups()
	tok.groups["bound"] = resourcegroup.Group{Name: "bound", RUPerSec: 2}
	tok.refuse = true
	f := newFakePolicy(t, tok, Settings{Strict: true, MaxWait: 30 * time.Second, MaxWaitInTxn: 100 * time.Millisecond})
	s := f.open("app")
	insert := query("INSERT INTO t VALUES ('" + strings.Repeat("x", 200*1024) + "')")
	v := f.verdict("a 200 KB insert", f.before(s, insert))
	want := "Exceeded resource group quota limitation (resource group bound): the statement's estimate 202.025 RU can never fit " +
		"in --max-wait 30s at RU_PER_SEC 2 (at most 62 RU, the burst included): raise the group's RU_PER_SEC to 7 or more, " +
		"or --max-wait to 101s or more, or make the statement cheaper"
	if errCode(v) != 8252 || v.Reply.Err.Message != want {
		t.Fatalf("a statement that can never fit:\n got %+v\nwant %s", v.Reply, want)
	}
	last := f.verdict("SHOW LAST STATEMENT RU", f.before(s, query("SHOW LAST STATEMENT RU")))
	row := last.Reply.Rows[0]
	if *row[0] != "bound" || *row[1] != "0.000" || *row[7] != "8252" || *row[10] != "202.025" {
		t.Fatalf("SHOW LAST STATEMENT RU after the refusal: group %s RRU %s error %s estimate %s", *row[0], *row[1], *row[7], *row[10])
	}
	// A statement that could fit says how long it waited, nothing more.
	v = f.verdict("a point select", f.before(s, query("SELECT 1")))
	if want := "Exceeded resource group quota limitation (resource group bound): waited 30s of --max-wait 30s for 0.625 RU at RU_PER_SEC 2"; v.Reply.Err.Message != want {
		t.Fatalf("got %q, want %q", v.Reply.Err.Message, want)
	}
	// Counted once each, by the policy.
	if len(tok.throttled) != 2 {
		t.Fatalf("throttled %v, want two", tok.throttled)
	}
}

// 8252 names the reason that applies, with its figures: the group's debt
// and when it clears; a shape's estimate that no wait can pay (the
// estimate, not the statement's base cost); a wait spent while others
// took the tokens.
func TestPolicyThrottledSaysWhichReason(t *testing.T) {
	const prefix = "Exceeded resource group quota limitation (resource group bound): "
	newSession := func(level float64) (*fakePolicy, *recordingTokens, *session) {
		tok := testGroups()
		tok.groups["bound"] = resourcegroup.Group{Name: "bound", RUPerSec: 5}
		tok.level = level
		f := newFakePolicy(t, tok, Settings{Strict: true, MaxWait: 30 * time.Second, MaxWaitInTxn: 100 * time.Millisecond})
		return f, tok, f.open("app")
	}
	refuse := func(f *fakePolicy, s *session, st *mysqlproto.Statement) string {
		t.Helper()
		v := f.verdict(st.Query, f.before(s, st))
		if errCode(v) != 8252 {
			t.Fatalf("%s: %+v, want 8252", st.Query, v.Reply)
		}
		return strings.TrimPrefix(v.Reply.Err.Message, prefix)
	}

	// In debt: one statement cost far more than it prepaid (2,044 RU
	// owed at 5 RU/s), so even SELECT 1 is refused at once.
	f, tok, s := newSession(-2044.3)
	tok.refuse, tok.failFast = true, true
	if got, want := refuse(f, s, query("SELECT 1")), "the group owes 2044.3 RU and clears in about 409s at its RU_PER_SEC 5; "+
		"the statement's 0.625 RU cannot wait that long (waited 0s of --max-wait 30s)"; got != want {
		t.Errorf("in debt:\n got %s\nwant %s", got, want)
	}

	// Waited its whole wait while other statements took the tokens: the
	// group owes nothing it could not pay in time.
	f, tok, s = newSession(0)
	tok.refuse = true
	if got, want := refuse(f, s, query("SELECT 1")), "waited 30s of --max-wait 30s for 0.625 RU at RU_PER_SEC 5"; got != want {
		t.Errorf("a wait spent:\n got %s\nwant %s", got, want)
	}

	// A shape whose statements cost 1,000 RU (3 s of backend CPU): its
	// next execution asks for its estimate, which 30 s at 5 RU/s (plus a
	// 5 RU burst) can never pay, whatever its base cost (0.625 RU).
	f, tok, s = newSession(-995)
	heavy := query("SELECT BENCHMARK(8000000, MD5('x'))")
	if v := f.verdict("the first heavy statement", f.before(s, heavy)); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	s.After(heavy, &mysqlproto.Outcome{RequestBytes: heavy.PayloadBytes, BackendTime: 3 * time.Second})
	tok.refuse, tok.failFast = true, true
	got := refuse(f, s, query("SELECT BENCHMARK(8000000, MD5('y'))"))
	if want := "the statement's estimate 1000.625 RU can never fit in --max-wait 30s at RU_PER_SEC 5 (at most 155 RU, the burst included): " +
		"raise the group's RU_PER_SEC to 33 or more, or --max-wait to 200s or more, or make the statement cheaper; " +
		"the group owes 995 RU now, which clears in about 199s"; got != want {
		t.Errorf("an estimate that never fits:\n got %s\nwant %s", got, want)
	}
}

// 8252 after a wait for the group's in-flight bound, or for one of the
// proxy's backend slots, names that wait and its figures.
func TestPolicyThrottledByTheGates(t *testing.T) {
	const prefix = "Exceeded resource group quota limitation (resource group bound): "
	for _, tc := range []struct {
		name       string
		backendCap int
		cpu        time.Duration // the shape's cost besides its base
		want       string
	}{
		{"in-flight bound", 0, 60 * time.Millisecond, "waited 1s of --max-wait 1s for a place in the group's in-flight bound on this proxy " +
			"(25 RU of statements at once; this one 20.625 RU)"},
		{"backend slots", 1, 0, "waited 1s of --max-wait 1s for one of the proxy's --max-backend-concurrency 1 backend slots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := testGroups()
			f := newFakePolicy(t, tok, Settings{Strict: true, MaxWait: time.Second, MaxWaitInTxn: 100 * time.Millisecond,
				MaxBackendConcurrency: tc.backendCap})
			a, b := f.open("app"), f.open("app")
			// With 60 ms of CPU the shape costs 20 RU besides its base cost:
			// two at once are more than the group's bound of 25 RU (100 RU/s).
			heavy := query("SELECT SLEEP(0.06)")
			if v := f.verdict("the first statement", f.before(a, heavy)); v.Reply != nil {
				t.Fatal(v.Reply.Err)
			}
			a.After(heavy, &mysqlproto.Outcome{RequestBytes: heavy.PayloadBytes, BackendTime: tc.cpu})
			if v := f.verdict("the running statement", f.before(a, heavy)); v.Reply != nil {
				t.Fatal(v.Reply.Err)
			}
			bDone := f.before(b, heavy)
			f.waiting(1)
			f.clk.Advance(time.Second)
			v := f.verdict("the waiting statement", bDone)
			if errCode(v) != 8252 || v.Reply.Err.Message != prefix+tc.want {
				t.Fatalf("got %+v\nwant %s", v.Reply, prefix+tc.want)
			}
			a.After(heavy, &mysqlproto.Outcome{RequestBytes: heavy.PayloadBytes, BackendTime: tc.cpu})
		})
	}
}
