package rgpolicy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/sqlscan"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// recordingTokens is the policy's view of tokenclient for unit tests: it
// records what is acquired and charged and refuses when told to.
type recordingTokens struct {
	groups   map[string]resourcegroup.Group
	bindings map[string]resourcegroup.Binding
	refuse   bool
	// failFast: a refusal comes at once (AcquireShare's answer when the
	// wait cannot be paid in time), not after the whole wait.
	failFast bool
	// level is the bucket every Share reports (negative: owed).
	level float64
	// wait is how long every AcquireShare that succeeds says it waited.
	wait    time.Duration
	watches []resourcegroup.Watch
	// budgets are the groups' budget verdicts Budget answers.
	budgets  map[string]tokenclient.BudgetVerdict
	acquired []string // group:maxWait
	charged  []string // group
	required []float64
	amounts  []float64 // RU of each Charge
	store    resourcegroup.Store
	held     float64 // demand held by refused statements
	holds    map[*tokenclient.DemandHold]float64
	// What WouldAcquire answers.
	wouldWait   time.Duration
	wouldRefuse bool
	throttled   []string
	ru          float64
	// The usage history's counts: refusals other than 8252, the groups
	// of statements that waited, and the estimates denied and waited.
	refusedOther     []string
	waitedIn         []string
	denied, waitedRU float64
	// tags are the tag bindings by resourcegroup.TagBindingKey;
	// tagLookups counts TagGroup calls.
	tags       map[string]string
	tagLookups int
	// digests are the digest bindings by hash.
	digests map[uint64]string
	// billed is the RU attributed (Attribute) by "group key=value" and
	// "group user@host"; billedStmts the statements likewise.
	billed, billedStmts map[string]float64
	// gen is CacheGeneration: a test that changes groups, bindings or
	// tags under a session bumps it, as the Watch does.
	gen uint64
	// groupLookups, bindingLookups and hasBindingsLookups count Group,
	// Binding and HasBindings calls.
	groupLookups, bindingLookups, hasBindingsLookups int
	// pursesReturned counts ReturnPurse calls.
	pursesReturned int
	// recorded is what Settle recorded as consumed, by group; negative
	// the last record with a part below zero ("" = none).
	recorded map[string]ru.Consumption
	negative string
}

func (r *recordingTokens) TakeShare(ctx context.Context, _ *tokenclient.Purse, group string, c ru.Consumption, required float64, maxWait time.Duration) (tokenclient.Share, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return tokenclient.Share{}, 0, err
	}
	if _, ok := r.groups[group]; !ok {
		return tokenclient.Share{}, 0, tokenclient.ErrUnknownGroup
	}
	r.acquired = append(r.acquired, group+":"+maxWait.String())
	r.required = append(r.required, required)
	if r.refuse {
		if r.failFast {
			return r.share(group), 0, tokenclient.ErrThrottled
		}
		return r.share(group), maxWait, tokenclient.ErrThrottled
	}
	r.ru += c.RU()
	return r.share(group), r.wait, nil
}

func (r *recordingTokens) CountThrottled(group string, estimate float64) {
	r.throttled = append(r.throttled, group)
	r.denied += estimate
}

func (r *recordingTokens) CountRefused(group string, estimate float64) {
	r.refusedOther = append(r.refusedOther, group)
	r.denied += estimate
}

func (r *recordingTokens) CountWaited(group string, estimate float64) {
	r.waitedIn = append(r.waitedIn, group)
	r.waitedRU += estimate
}

func (r *recordingTokens) HoldDemand(h *tokenclient.DemandHold, group string, d float64) {
	r.ReleaseDemand(h)
	r.held += d
	r.holds[h] = d
}

func (r *recordingTokens) ReleaseDemand(h *tokenclient.DemandHold) {
	r.held -= r.holds[h]
	delete(r.holds, h)
}

func (r *recordingTokens) WouldAcquire(string, ru.Consumption, float64, time.Duration, bool) (time.Duration, bool) {
	return r.wouldWait, r.wouldRefuse
}

// share is the Share the fake returns with every AcquireShare.
func (r *recordingTokens) share(group string) tokenclient.Share {
	g, ok := r.groups[group]
	sh := tokenclient.Share{Proxies: 1, Mode: g.Mode, MaxConcurrency: int(g.MaxConcurrency)}
	if !ok || g.RUPerSec == resourcegroup.Unlimited || g.Burst == resourcegroup.BurstUnlimited || g.Mode != resourcegroup.ModeEnforce {
		sh.Unlimited = true
		return sh
	}
	sh.Rate, sh.BurstSeconds, sh.Tokens = float64(g.RUPerSec), 1, r.level
	return sh
}

func (r *recordingTokens) Attribute(_ *tokenclient.Purse, group string, tags []tokenclient.BilledTag, account string, c ru.Consumption) {
	if r.billed == nil {
		r.billed, r.billedStmts = map[string]float64{}, map[string]float64{}
	}
	for _, t := range tags {
		r.billed[group+" "+t.Key+"="+t.Value] += c.RU()
		r.billedStmts[group+" "+t.Key+"="+t.Value] += c.Statements
	}
	r.billed[group+" "+account] += c.RU()
	r.billedStmts[group+" "+account] += c.Statements
}

// Settle keeps the tokens moved, when any, as a charge, and what is
// recorded by group; recordingTokens keeps no purses.
func (r *recordingTokens) Settle(_ *tokenclient.Purse, group string, tokens float64, rec ru.Consumption) {
	if tokens != 0 { // a settlement that only records moves no tokens
		r.charged = append(r.charged, group)
		r.amounts = append(r.amounts, tokens)
		r.ru += tokens
	}
	if r.recorded == nil {
		r.recorded = map[string]ru.Consumption{}
	}
	c := r.recorded[group]
	c.Add(rec)
	r.recorded[group] = c
	if rec.RRU < 0 || rec.WRU < 0 || rec.ReadBytes < 0 || rec.WriteBytes < 0 || rec.Statements < 0 {
		r.negative = fmt.Sprintf("%s %+v", group, rec)
	}
}

func (r *recordingTokens) ReturnPurse(*tokenclient.Purse) { r.pursesReturned++ }

func (r *recordingTokens) Budget(group string) (tokenclient.BudgetVerdict, bool) {
	v, ok := r.budgets[group]
	return v, ok
}

func (r *recordingTokens) CacheGeneration() uint64 { return r.gen }

func (r *recordingTokens) Group(name string) (resourcegroup.Group, bool) {
	r.groupLookups++
	g, ok := r.groups[name]
	return g, ok
}

func (r *recordingTokens) Binding(user, host string) (resourcegroup.Binding, bool) {
	r.bindingLookups++
	b, ok := r.bindings[resourcegroup.AccountKey(user, host)]
	return b, ok
}

func (r *recordingTokens) HasBindings(user string) bool {
	r.hasBindingsLookups++
	for _, b := range r.bindings {
		if b.User == user {
			return true
		}
	}
	return false
}

func (r *recordingTokens) HasTagBindings() bool { return len(r.tags) > 0 }

func (r *recordingTokens) TagGroup(key, value string) (string, bool) {
	r.tagLookups++
	g, ok := r.tags[resourcegroup.TagBindingKey(key, value)]
	return g, ok
}

func (r *recordingTokens) DigestGroup(h uint64) (string, bool) {
	g, ok := r.digests[h]
	return g, ok
}

func (r *recordingTokens) HasDigestBindings() bool { return len(r.digests) > 0 }

func (r *recordingTokens) HasWatches() (bool, bool) { return len(r.watches) > 0, len(r.watches) > 0 }

func (r *recordingTokens) MatchGroupWatch(group, text, digest string) (resourcegroup.Watch, bool) {
	for _, w := range r.watches {
		if w.Group == group && ((w.Match == resourcegroup.WatchExact && w.Text == text) ||
			(w.Match == resourcegroup.WatchSimilar && w.Text == digest)) {
			return w, true
		}
	}
	return resourcegroup.Watch{}, false
}

func (r *recordingTokens) Store() resourcegroup.Store {
	if r.store == nil {
		r.store = resourcegroup.NewMemStore()
	}
	return r.store
}
func (r *recordingTokens) Usage(time.Time) []tokenclient.GroupUsage { return nil }

// Overview lists the fake's groups by name, each in use, at most limit.
func (r *recordingTokens) Overview(_ time.Time, limit int) tokenclient.Overview {
	o := tokenclient.Overview{Total: len(r.groups), InUse: len(r.groups)}
	for _, name := range slices.Sorted(maps.Keys(r.groups)) {
		if len(o.Groups) < limit {
			o.Groups = append(o.Groups, tokenclient.GroupOverview{Definition: r.groups[name], Defined: true, InUse: true})
		}
	}
	return o
}

// grants answers, like the backend would, CURRENT_USER() and the
// privilege and role questions (privilegesQuery, rolesQuery) of the
// account app@'%' holding these global privileges and no role.
type grants []string

func (g grants) Query(_ context.Context, sql string) ([]string, [][]*string, error) {
	const account = "app@%"
	switch sql {
	case "SELECT CURRENT_USER()":
		a := account
		return []string{"CURRENT_USER()"}, [][]*string{{&a}}, nil
	case privilegesQuery:
		var rows [][]*string
		for _, p := range g {
			if p == "SUPER" || p == "RESOURCE_GROUP_ADMIN" {
				cells := []string{hexUpper("'app'@'%'"), hexUpper(p), hexUpper(account)}
				rows = append(rows, []*string{&cells[0], &cells[1], &cells[2]})
			}
		}
		return []string{"GRANTEE", "PRIVILEGE_TYPE", "CURRENT_USER()"}, rows, nil
	case rolesQuery:
		return []string{"ROLE_NAME"}, nil, nil
	}
	return nil, nil, errors.New("unexpected query " + sql)
}

var (
	superGrants = grants{"USAGE", "SUPER"}
	plainGrants = grants{"USAGE"}
)

func newTestPolicy(tok *recordingTokens) *Policy {
	p, err := New(Config{Tokens: tok, Settings: Settings{Strict: true, MaxWait: 30 * time.Second, MaxWaitInTxn: 100 * time.Millisecond},
		CPU: CPUWall, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	return p
}

func testGroups() *recordingTokens {
	return &recordingTokens{holds: map[*tokenclient.DemandHold]float64{},
		groups: map[string]resourcegroup.Group{
			"default": resourcegroup.DefaultGroupDefinition(),
			"bound":   {Name: "bound", RUPerSec: 100},
			"other":   {Name: "other", RUPerSec: 100},
		},
		bindings: map[string]resourcegroup.Binding{"app@%": {User: "app", Host: "%", Group: "bound"}},
	}
}

// query is a COM_QUERY as a session hands it to the policy: scanned.
func query(q string) *mysqlproto.Statement {
	st := &mysqlproto.Statement{Command: mysql.COM_QUERY, Query: q, PayloadBytes: int64(len(q) + 1)}
	if err := mysqlproto.ScanStatement(st, ScanWords()); err != nil {
		panic(err)
	}
	return st
}

func TestPolicyResolvesGroups(t *testing.T) {
	tests := []struct {
		name   string
		user   string
		grants grants
		set    string // SET RESOURCE GROUP first, if any
		query  string
		want   string // group charged, or "1227"
	}{
		{"binding", "app", plainGrants, "", "SELECT 1", "bound"},
		{"no binding: default", "nobody", plainGrants, "", "SELECT 1", "default"},
		{"hint naming the bound group", "app", plainGrants, "", "SELECT /*+ RESOURCE_GROUP(bound) */ 1", "bound"},
		{"strict: a bound user may not hint default", "app", plainGrants, "", "SELECT /*+ RESOURCE_GROUP(default) */ 1", "1227"},
		{"an unbound user may hint default", "nobody", plainGrants, "", "SELECT /*+ RESOURCE_GROUP(default) */ 1", "default"},
		{"SUPER may hint default", "app", superGrants, "", "SELECT /*+ RESOURCE_GROUP(default) */ 1", "default"},
		{"strict: a bound user may not SET default", "app", plainGrants, "SET RESOURCE GROUP default", "SELECT 1", "1227"},
		{"SUPER's SET default switches", "app", superGrants, "SET RESOURCE GROUP default", "SELECT 1", "default"},
		{"hint of an unknown group, no SUPER: ignored", "app", plainGrants, "", "SELECT /*+ RESOURCE_GROUP(gone) */ 1", "bound"},
		{"strict: hint naming another group", "app", plainGrants, "", "SELECT /*+ RESOURCE_GROUP(other) */ 1", "1227"},
		{"SUPER may hint any group", "app", superGrants, "", "SELECT /*+ RESOURCE_GROUP(OTHER) */ 1", "other"},
		{"hint of an unknown group: the binding", "app", superGrants, "", "SELECT /*+ RESOURCE_GROUP(gone) */ 1", "bound"},
		{"SET wins over the binding", "app", superGrants, "SET RESOURCE GROUP other", "SELECT 1", "other"},
		{"hint wins over SET", "app", superGrants, "SET RESOURCE GROUP other", "SELECT /*+ RESOURCE_GROUP(bound) */ 1", "bound"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := testGroups()
			s := newTestPolicy(tok).Open(mysqlproto.SessionInfo{User: tc.user})
			ctx := context.Background()
			if tc.set != "" {
				v := s.Before(ctx, query(tc.set), tc.grants)
				if tc.want == "1227" {
					if v.Reply == nil || v.Reply.Err == nil || v.Reply.Err.Code != 1227 {
						t.Fatalf("%s: want 1227, got %+v", tc.set, v.Reply)
					}
					return
				}
				if v.Reply == nil || v.Reply.Err != nil {
					t.Fatalf("%s: %+v", tc.set, v.Reply)
				}
			}
			st := query(tc.query)
			v := s.Before(ctx, st, tc.grants)
			if tc.want == "1227" {
				if v.Reply == nil || v.Reply.Err == nil || v.Reply.Err.Code != 1227 {
					t.Fatalf("want 1227, got %+v", v.Reply)
				}
				if len(tok.acquired) != 0 {
					t.Fatalf("a refused statement acquired tokens: %v", tok.acquired)
				}
				return
			}
			if v.Reply != nil {
				t.Fatalf("statement answered locally: %+v", v.Reply.Err)
			}
			if len(tok.acquired) != 1 || tok.acquired[0] != tc.want+":30s" {
				t.Fatalf("acquired %v, want %s:30s", tok.acquired, tc.want)
			}
			s.After(st, &mysqlproto.Outcome{ResponseBytes: 100, BackendTime: 3 * time.Millisecond})
			if len(tok.charged) != 1 || tok.charged[0] != tc.want {
				t.Fatalf("post-charged %v, want %s", tok.charged, tc.want)
			}
		})
	}
}

func TestPolicyTransactionsAndThrottling(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	tok.groups["bound"] = resourcegroup.Group{Name: "bound", RUPerSec: 4}
	p := newTestPolicy(tok)
	s := p.Open(mysqlproto.SessionInfo{User: "app"}).(*session)
	inTxn := func(q string) *mysqlproto.Statement {
		st := query(q)
		st.InTransaction = true
		return st
	}
	// cost is a statement's before-cost: its tokens when it has no estimate.
	cost := func(st *mysqlproto.Statement) float64 {
		return ru.DefaultConfig().BeforeCost(ru.RequestInfo{Class: costClass(st), WriteBytes: st.PayloadBytes}).RU()
	}
	run := func(st *mysqlproto.Statement) *mysqlproto.Error {
		t.Helper()
		v := s.Before(ctx, st, plainGrants)
		if v.Reply != nil {
			return v.Reply.Err
		}
		s.After(st, &mysqlproto.Outcome{RequestBytes: st.PayloadBytes})
		return nil
	}

	// Outside a transaction, a refused statement gets 8252 and is not forwarded.
	tok.refuse = true
	if err := run(query("SELECT 1")); err == nil || err.Code != 8252 {
		t.Fatalf("want 8252, got %+v", err)
	}
	// Inside one it waits at most max-wait-in-txn, then runs on the
	// session's debt: the group's bucket is not charged.
	if err := run(inTxn("UPDATE t SET a = 1")); err != nil {
		t.Fatalf("in a transaction the statement must run on debt, got %+v", err)
	}
	if got := tok.acquired[len(tok.acquired)-1]; got != "bound:100ms" {
		t.Fatalf("in-transaction wait %s, want bound:100ms", got)
	}
	owed := cost(inTxn("UPDATE t SET a = 1"))
	if len(tok.charged) != 0 || !near(s.debtTo("bound"), owed) {
		t.Fatalf("charged %v, session owes %v; want nothing charged and %v owed", tok.charged, s.debtTo("bound"), owed)
	}
	// The debt is bounded: a second of the group's rate (4 RU), or one
	// statement of any size when the session owes nothing.
	if err := run(inTxn("UPDATE t SET a = 2")); err == nil || err.Code != 8252 {
		t.Fatalf("past the debt bound: want 8252, got %+v", err)
	}
	// COMMIT and ROLLBACK of an open transaction never wait: their cost
	// is session debt too.
	required := owed
	for _, q := range []string{"COMMIT", "commit work", "ROLLBACK", "/* app */ COMMIT", "XA COMMIT 'x'"} {
		n := len(tok.acquired)
		if err := run(inTxn(q)); err != nil {
			t.Fatalf("%s refused: %+v", q, err)
		}
		if len(tok.acquired) != n {
			t.Fatalf("%s waited for tokens", q)
		}
		owed += cost(inTxn(q))
	}
	required = owed
	if !near(s.debtTo("bound"), owed) || len(tok.charged) != 0 {
		t.Fatalf("after five commits the session owes %v (want %v), charged %v", s.debtTo("bound"), owed, tok.charged)
	}
	// The next statement outside a transaction repays first, within its
	// own wait; the debt stays while it cannot be paid.
	err := run(query("SELECT 2"))
	if err == nil || err.Code != 8252 {
		t.Fatalf("unpaid debt: want 8252, got %+v", err)
	}
	// It says that the session's debt is what waits, and for what.
	if want := "Exceeded resource group quota limitation (resource group bound): the user app owes " + formatRU(owed) +
		" RU its sessions ran on debt inside transactions and clears in about " + fmtDuration(ceilDuration(owed/4)) +
		" at its RU_PER_SEC 4; this statement's wait could pay none of it (waited 30s of --max-wait 30s)"; !strings.HasPrefix(err.Message, want) {
		t.Fatalf("unpaid debt: %q, want it to start %q", err.Message, want)
	}
	if !near(s.debtTo("bound"), owed) {
		t.Fatalf("a refused repayment changed the debt to %v", s.debtTo("bound"))
	}
	tok.refuse = false
	tok.ru, tok.required = 0, nil
	if err := run(query("SELECT 3")); err != nil {
		t.Fatalf("repaid, then the statement: %+v", err)
	}
	if s.debtTo("bound") != 0 || !near(tok.ru, owed+0.625) || !near(tok.required[0], required) {
		t.Fatalf("after repaying: owes %v, took %v RU (want %v) with %v required (want the before-costs, %v)",
			s.debtTo("bound"), tok.ru, owed+0.625, tok.required, required)
	}
	// A COMMIT outside a transaction ends nothing: it waits like any statement.
	n := len(tok.acquired)
	if err := run(query("COMMIT")); err != nil || len(tok.acquired) != n+1 {
		t.Fatalf("COMMIT outside a transaction: %+v, acquired %v", err, tok.acquired[n:])
	}

	// A session that ends owing leaves its debt to the user's next session.
	tok.refuse, tok.charged = true, nil
	if err := run(inTxn("UPDATE t SET a = 3")); err != nil {
		t.Fatal(err)
	}
	s.Event(mysqlproto.EventClose, mysqlproto.SessionInfo{})
	tok.refuse = false
	tok.ru = 0
	s2 := p.Open(mysqlproto.SessionInfo{User: "app"})
	st := query("SELECT 4")
	if v := s2.Before(ctx, st, plainGrants); v.Reply != nil {
		t.Fatalf("the next session: %+v", v.Reply.Err)
	}
	if want := cost(inTxn("UPDATE t SET a = 3")) + 0.625; !near(tok.ru, want) || len(tok.charged) != 0 {
		t.Fatalf("the next session took %v RU (want the debt and its own, %v), charged %v", tok.ru, want, tok.charged)
	}
}

// COMMIT and ROLLBACK are not held by the backend concurrency cap either
// (a transaction's locks would be held while the cap is full), and a
// session that closes gives back what its statement in flight held even
// if After never ran.
func TestPolicyCommitSkipsConcurrencyCapAndCloseReleases(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	p := newTestPolicy(tok)
	set := p.CurrentSettings()
	set.MaxBackendConcurrency = 1
	p.Reload(set)
	a := p.Open(mysqlproto.SessionInfo{User: "app"})
	b := p.Open(mysqlproto.SessionInfo{User: "app"})
	if v := a.Before(ctx, query("SELECT 1"), plainGrants); v.Reply != nil {
		t.Fatalf("first statement: %+v", v.Reply.Err)
	}
	// a holds the only slot: b's COMMIT runs at once all the same.
	for _, q := range []string{"COMMIT", "ROLLBACK"} {
		st := query(q)
		st.InTransaction = true
		done := make(chan mysqlproto.Verdict, 1)
		go func() { done <- b.Before(ctx, st, plainGrants) }()
		select {
		case v := <-done:
			if v.Reply != nil {
				t.Fatalf("%s: %+v", q, v.Reply.Err)
			}
			b.After(st, &mysqlproto.Outcome{})
		case <-time.After(5 * time.Second):
			t.Fatalf("%s waited for the backend concurrency cap", q)
		}
	}
	// Inside a transaction a statement waits for the cap at most
	// --max-wait-in-txn (100 ms here), then runs over it.
	st := query("UPDATE t SET a = 1")
	st.Class, st.InTransaction = sqlscan.ClassWrite, true
	done := make(chan mysqlproto.Verdict, 1)
	go func() { done <- b.Before(ctx, st, plainGrants) }()
	select {
	case v := <-done:
		if v.Reply != nil {
			t.Fatalf("in-transaction statement at the cap: %+v", v.Reply.Err)
		}
		b.After(st, &mysqlproto.Outcome{})
	case <-time.After(5 * time.Second):
		t.Fatal("an in-transaction statement waited for the cap past --max-wait-in-txn")
	}
	// a's session ends without After: its slot comes back, and its purse
	// goes back to the token client.
	a.Event(mysqlproto.EventClose, mysqlproto.SessionInfo{})
	if tok.pursesReturned != 1 {
		t.Fatalf("%d purses returned at the session's end, want 1", tok.pursesReturned)
	}
	shortCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if v := b.Before(shortCtx, query("SELECT 2"), plainGrants); v.Reply != nil {
		t.Fatalf("after the holder closed: %+v", v.Reply.Err)
	}
}

func TestPolicyAdminStatements(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	s := newTestPolicy(tok).Open(mysqlproto.SessionInfo{User: "app"})
	code := func(st *mysqlproto.Statement, g grants) uint16 {
		v := s.Before(ctx, st, g)
		if v.Reply == nil {
			t.Fatalf("%s was forwarded", st.Query)
		}
		if v.Reply.Err == nil {
			return 0
		}
		return v.Reply.Err.Code
	}
	if c := code(query("CREATE RESOURCE GROUP x RU_PER_SEC = 1"), plainGrants); c != 1227 {
		t.Fatalf("CREATE without SUPER: %d", c)
	}
	if c := code(query("CREATE RESOURCE GROUP x RU_PER_SEC = 1"), superGrants); c != 0 {
		t.Fatalf("CREATE with SUPER: %d", c)
	}
	prep := query("SELECT * FROM information_schema.resource_groups")
	prep.Command = mysql.COM_STMT_PREPARE
	if c := code(prep, superGrants); c != 1295 {
		t.Fatalf("prepared admin statement: %d", c)
	}
	multi := query("SELECT 1; DROP RESOURCE GROUP x")
	multi.Multi = true
	if c := code(multi, superGrants); c != 1295 {
		t.Fatalf("admin statement inside a multi-statement: %d", c)
	}
	if c := code(query("SET RESOURCE GROUP nope"), superGrants); c != 8249 {
		t.Fatalf("SET of an unknown group: %d", c)
	}
	if len(tok.acquired)+len(tok.charged) != 0 {
		t.Fatalf("admin statements are free: %v %v", tok.acquired, tok.charged)
	}
}

func TestPolicyWatchList(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	tok.watches = []resourcegroup.Watch{
		{ID: 1, Group: "bound", Match: resourcegroup.WatchExact, Text: "SELECT SLEEP(5)", Action: resourcegroup.ActionKill},
		{ID: 2, Group: "bound", Match: resourcegroup.WatchSimilar, Text: "SELECT * FROM t WHERE id = ?", Action: resourcegroup.ActionSwitchGroup, SwitchGroup: "other"},
		{ID: 3, Group: "bound", Match: resourcegroup.WatchSimilar, Text: "SELECT SLEEP(?)", Action: resourcegroup.ActionCooldown},
		{ID: 4, Group: "other", Match: resourcegroup.WatchExact, Text: "SELECT 1", Action: resourcegroup.ActionKill},
	}
	p := newTestPolicy(tok)
	s := p.Open(mysqlproto.SessionInfo{User: "app"})
	// KILL: 8254 before the backend.
	if v := s.Before(ctx, query("SELECT SLEEP(5)"), plainGrants); v.Reply == nil || v.Reply.Err == nil || v.Reply.Err.Code != 8254 {
		t.Fatalf("EXACT KILL watch: %+v", v.Reply)
	}
	// Another group's watch does not apply.
	st := query("SELECT 1")
	if v := s.Before(ctx, st, plainGrants); v.Reply != nil {
		t.Fatalf("a watch of another group applied: %+v", v.Reply.Err)
	}
	s.After(st, &mysqlproto.Outcome{})
	// SWITCH_GROUP by digest: charged to the target.
	tok.acquired = nil
	st = query("select * from t where id = 42")
	if v := s.Before(ctx, st, plainGrants); v.Reply != nil {
		t.Fatalf("SWITCH_GROUP watch: %+v", v.Reply.Err)
	}
	if len(tok.acquired) != 1 || tok.acquired[0] != "other:30s" {
		t.Fatalf("acquired %v, want other:30s", tok.acquired)
	}
	s.After(st, &mysqlproto.Outcome{})
	// COOLDOWN: one such statement at a time on this proxy.
	first := query("SELECT SLEEP(1)")
	if v := s.Before(ctx, first, plainGrants); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	s2 := p.Open(mysqlproto.SessionInfo{User: "app"})
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if v := s2.Before(wctx, query("SELECT SLEEP(2)"), plainGrants); v.Reply == nil || v.Reply.Err.Code != 1317 {
		t.Fatalf("a second COOLDOWN statement ran alongside the first: %+v", v.Reply)
	}
	s.After(first, &mysqlproto.Outcome{})
	st = query("SELECT SLEEP(3)")
	if v := s2.Before(ctx, st, plainGrants); v.Reply != nil {
		t.Fatalf("COOLDOWN slot not released: %+v", v.Reply.Err)
	}
	s2.After(st, &mysqlproto.Outcome{})
	if n := testutil.ToFloat64(p.metrics.runaway.WithLabelValues("bound", "COOLDOWN")); n != 3 {
		t.Fatalf("COOLDOWN watch hits counted %v, want 3", n)
	}
}

// A QUERY_LIMIT RU is crossed by the bytes a statement reads, as they
// stream, not only by its backend time.
func TestPolicyRunawayRUCrossedByReadBytes(t *testing.T) {
	tok := testGroups()
	tok.groups["capped"] = resourcegroup.Group{Name: "capped", RUPerSec: 1000,
		QueryLimit: &resourcegroup.QueryLimit{RU: 10, Action: resourcegroup.ActionDryRun}}
	p := newTestPolicy(tok)
	s := p.Open(mysqlproto.SessionInfo{User: "app"})
	st := query("SELECT /*+ RESOURCE_GROUP(capped) */ * FROM big")
	if v := s.Before(context.Background(), st, superGrants); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	po := s.(mysqlproto.ProgressObserver)
	po.Progress(st, 64<<10) // 1 RU so far
	if n := testutil.ToFloat64(p.metrics.runaway.WithLabelValues("capped", "DRYRUN")); n != 0 {
		t.Fatalf("fired at 1 RU of 10")
	}
	po.Progress(st, 1<<20) // 16 RU: over
	s.After(st, &mysqlproto.Outcome{ResponseBytes: 1 << 20})
	if n := testutil.ToFloat64(p.metrics.runaway.WithLabelValues("capped", "DRYRUN")); n != 1 {
		t.Fatalf("RU limit crossed by read bytes counted %v times, want 1", n)
	}
}

// A shape's estimate is charged before the statement runs; only the
// before-cost decides a refusal, and After settles the difference.
func TestPolicyChargesTheEstimateAndSettles(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	tok.groups["bound"] = resourcegroup.Group{Name: "bound", RUPerSec: 1000}
	p := newTestPolicy(tok)
	s := p.Open(mysqlproto.SessionInfo{User: "app"})
	scan := func() *mysqlproto.Statement { return query("SELECT COUNT(*) FROM t WHERE c LIKE '%7%'") }
	// First execution: only the base cost up front, then 150 ms of backend
	// time (50 RU) after.
	st := scan()
	if v := s.Before(ctx, st, plainGrants); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	if !near(tok.ru, 0.625) || !near(tok.required[0], 0.625) {
		t.Fatalf("first execution took %v up front (required %v), want the base 0.625", tok.ru, tok.required)
	}
	s.After(st, &mysqlproto.Outcome{BackendTime: 150 * time.Millisecond})
	if !near(tok.ru, 50.625) {
		t.Fatalf("after settling: %v RU, want 50.625", tok.ru)
	}
	// Second execution of the same shape (other literal): 50.625 up front,
	// of which only 0.625 is required.
	st = query("SELECT COUNT(*) FROM t WHERE c LIKE '%8%'")
	if v := s.Before(ctx, st, plainGrants); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	if got := tok.ru - 50.625; !near(got, 50.625) || !near(tok.required[1], 0.625) {
		t.Fatalf("second execution took %v up front (required %v), want the estimate 50.625", got, tok.required[1])
	}
	// It turns out cheaper: 30 ms, 10 RU; the rest comes back.
	s.After(st, &mysqlproto.Outcome{BackendTime: 30 * time.Millisecond})
	if got := tok.ru - 50.625; !near(got, 10.625) {
		t.Fatalf("second execution cost %v in the end, want 10.625", got)
	}
	if got := tok.amounts[len(tok.amounts)-1]; !near(got, -40) {
		t.Fatalf("settlement %v, want a refund of 40", got)
	}
	if got := p.shapes.String(shapeKey{group: "bound", hash: st.Scan.DigestHash}); got != "rru=38.625 wru=0.000 backend=0.1140s" {
		t.Fatalf("estimate after two: %s", got)
	}
	// A third whose session ends before it is forwarded: it never ran, so
	// it pays only the before-cost and leaves the estimate alone.
	before := tok.ru
	st = scan()
	if v := s.Before(ctx, st, plainGrants); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	s.After(st, &mysqlproto.Outcome{ErrCode: 1317, NotForwarded: true})
	if got := tok.ru - before; !near(got, 0.625) {
		t.Fatalf("a statement never forwarded cost %v, want the base 0.625", got)
	}
	if got := p.shapes.String(shapeKey{group: "bound", hash: st.Scan.DigestHash}); got != "rru=38.625 wru=0.000 backend=0.1140s" {
		t.Fatalf("estimate after one never forwarded: %s", got)
	}
}

// A refused statement is the session's last statement; a client that
// leaves while waiting is not charged.
func TestPolicyRefusedAndCancelled(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	p := newTestPolicy(tok)
	s := p.Open(mysqlproto.SessionInfo{User: "app"})
	tok.refuse = true
	if v := s.Before(ctx, query("SELECT 1"), plainGrants); v.Reply == nil || v.Reply.Err.Code != 8252 {
		t.Fatalf("want 8252: %+v", v.Reply)
	}
	// The refused statement is still wanted: its RU stays in the group's
	// demand until the session's next statement.
	if tok.held != 0.625 {
		t.Fatalf("demand held after a refusal: %v, want 0.625", tok.held)
	}
	v := s.Before(ctx, query("SHOW LAST STATEMENT RU"), plainGrants)
	if tok.held != 0 {
		t.Fatalf("demand still held at the next statement: %v", tok.held)
	}
	if v.Reply == nil || len(v.Reply.Rows) != 1 {
		t.Fatalf("SHOW LAST STATEMENT RU: %+v", v.Reply)
	}
	row := v.Reply.Rows[0]
	if *row[0] != "bound" || *row[1] != "0.000" || *row[6] != "30000.000" || *row[7] != "8252" {
		t.Fatalf("last statement after a refusal: %v %v %v %v", *row[0], *row[1], *row[6], *row[7])
	}
	// Cancelled inside a transaction: neither run on debt nor charged.
	tok.refuse = false
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	st := query("UPDATE t SET a = 1")
	st.InTransaction = true
	n := len(tok.charged)
	if v := s.Before(cctx, st, plainGrants); v.Reply == nil || v.Reply.Err.Code != 1317 {
		t.Fatalf("a cancelled wait: %+v", v.Reply)
	}
	if len(tok.charged) != n {
		t.Fatalf("a client that left was charged: %v", tok.charged[n:])
	}
}

// IF NOT EXISTS of an existing group answers OK with one warning, and the
// SHOW WARNINGS right after it shows note 8248; later statements forget it.
func TestPolicyNotesAndShowWarnings(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	s := newTestPolicy(tok).Open(mysqlproto.SessionInfo{User: "root"})
	if v := s.Before(ctx, query("CREATE RESOURCE GROUP rgn RU_PER_SEC = 5"), superGrants); v.Reply == nil || v.Reply.Err != nil {
		t.Fatalf("create: %+v", v.Reply)
	}
	v := s.Before(ctx, query("CREATE RESOURCE GROUP IF NOT EXISTS rgn RU_PER_SEC = 5"), superGrants)
	if v.Reply == nil || v.Reply.Err != nil || v.Reply.Warnings != 1 {
		t.Fatalf("IF NOT EXISTS of an existing group: %+v", v.Reply)
	}
	v = s.Before(ctx, query("show  warnings"), superGrants)
	if v.Reply == nil || len(v.Reply.Rows) != 1 || *v.Reply.Rows[0][0] != "Note" || *v.Reply.Rows[0][1] != "8248" ||
		*v.Reply.Rows[0][2] != "Resource group 'rgn' already exists" {
		t.Fatalf("SHOW WARNINGS: %+v", v.Reply)
	}
	// Once shown (or after any statement) the backend answers again.
	st := query("SHOW WARNINGS")
	if v := s.Before(ctx, st, superGrants); v.Reply != nil {
		t.Fatalf("a second SHOW WARNINGS was answered locally: %+v", v.Reply)
	}
	s.After(st, &mysqlproto.Outcome{})
	s.Before(ctx, query("DROP RESOURCE GROUP IF EXISTS nosuch"), superGrants)
	v = s.Before(ctx, query("SHOW COUNT(*) WARNINGS"), superGrants)
	if v.Reply == nil || *v.Reply.Rows[0][0] != "1" {
		t.Fatalf("SHOW COUNT(*) WARNINGS: %+v", v.Reply)
	}
}

// A group's series exist at 0 from its first statement (default's from
// the start), and go when the group has been idle past the expiry.
func TestPolicySeriesFromBirthAndIdleExpiry(t *testing.T) {
	reg := prometheus.NewRegistry()
	clk := clock.NewFake()
	tok := testGroups()
	p, err := New(Config{Tokens: tok, Registerer: reg, Clock: clk, CPU: CPUWall, IdleGroupExpiry: time.Hour,
		Settings: Settings{Strict: true, MaxWait: time.Second}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	series := func(group string) int {
		n := 0
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "resource_group" && l.GetValue() == group {
						n++
					}
				}
			}
		}
		return n
	}
	// rru, wru, four classes, the three of MODE WARN and written bytes by
	// source.
	if n := series("default"); n != 12 {
		t.Fatalf("default has %d series at start, want 12 at 0", n)
	}
	if v := testutil.ToFloat64(p.metrics.groupStatements.WithLabelValues("default", "read")); v != 0 {
		t.Fatalf("default's statements %v", v)
	}
	s := p.Open(mysqlproto.SessionInfo{User: "app"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	st := query("SELECT 1")
	if v := s.Before(ctx, st, plainGrants); v.Reply != nil {
		t.Fatal(v.Reply.Err)
	}
	if n := series("bound"); n != 12 {
		t.Fatalf("bound has %d series after its first statement, want 12", n)
	}
	s.After(st, &mysqlproto.Outcome{})
	for range 5 {
		clk.Advance(16 * time.Minute)
		time.Sleep(20 * time.Millisecond) // let Run sweep
	}
	deadline := time.Now().Add(5 * time.Second)
	for series("bound") != 0 && time.Now().Before(deadline) {
		clk.Advance(time.Minute)
		time.Sleep(10 * time.Millisecond)
	}
	if n := series("bound"); n != 0 {
		t.Fatalf("bound keeps %d series after an idle hour", n)
	}
	if n := series("default"); n != 12 {
		t.Fatalf("default lost its series: %d", n)
	}
	cancel()
	<-done
}

// MODE WARN: nothing waits or is refused, what ENFORCE would have done is
// counted and shown by SHOW LAST STATEMENT RU.
func TestPolicyWarnMode(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	tok.groups["bound"] = resourcegroup.Group{Name: "bound", RUPerSec: 10, Mode: resourcegroup.ModeWarn}
	p := newTestPolicy(tok)
	s := p.Open(mysqlproto.SessionInfo{User: "app"})
	last := func() string {
		v := s.Before(ctx, query("SHOW LAST STATEMENT RU"), plainGrants)
		return *v.Reply.Rows[0][8]
	}
	run := func() {
		st := query("SELECT 1")
		if v := s.Before(ctx, st, plainGrants); v.Reply != nil {
			t.Fatalf("a WARN group's statement was answered: %+v", v.Reply.Err)
		}
		s.After(st, &mysqlproto.Outcome{})
	}
	run()
	if w := last(); w != "" {
		t.Fatalf("nothing would have happened, got %q", w)
	}
	tok.wouldWait = 50 * time.Millisecond
	run()
	if w := last(); w != "wait 50.000ms" {
		t.Fatalf("would wait: %q", w)
	}
	tok.wouldWait, tok.wouldRefuse = 0, true
	run()
	if w := last(); w != "8252" {
		t.Fatalf("would refuse: %q", w)
	}
	if n := testutil.ToFloat64(p.metrics.wouldWaitN.WithLabelValues("bound")); n != 1 {
		t.Fatalf("would-wait count %v", n)
	}
	if v := testutil.ToFloat64(p.metrics.wouldWaitSec.WithLabelValues("bound")); v != 0.05 {
		t.Fatalf("would-wait seconds %v", v)
	}
	if n := testutil.ToFloat64(p.metrics.wouldRefuse.WithLabelValues("bound")); n != 1 {
		t.Fatalf("would-throttle count %v", n)
	}
}

// Copies of a shape the proxy has not measured yet, in a group with a
// limit, wait for the first one in flight (the probe) and then enter the
// gate at what it cost; other shapes, unlimited groups and a copy whose
// wait runs out are not held; a probe that ends without running wakes its
// copies, one of which becomes the next probe.
func TestPolicyProbeHoldsCopiesOfANewShape(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	tok.groups["bound"] = resourcegroup.Group{Name: "bound", RUPerSec: 1000}
	clk := clock.NewFake()
	p, err := New(Config{Tokens: tok, Settings: Settings{Strict: true, MaxWait: 30 * time.Second, MaxWaitInTxn: 100 * time.Millisecond},
		CPU: CPUWall, Clock: clk, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	open := func(user string) *session { return p.Open(mysqlproto.SessionInfo{User: user}).(*session) }
	before := func(s *session, st *mysqlproto.Statement) <-chan mysqlproto.Verdict {
		done := make(chan mysqlproto.Verdict, 1)
		go func() { done <- s.Before(ctx, st, plainGrants) }()
		return done
	}
	admitted := func(what string, done <-chan mysqlproto.Verdict) {
		t.Helper()
		select {
		case v := <-done:
			if v.Reply != nil {
				t.Fatalf("%s: %+v", what, v.Reply.Err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s is held", what)
		}
	}
	// held waits until n statements wait on the fake clock.
	held := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for clk.Pending() != n {
			if time.Now().After(deadline) {
				t.Fatalf("%d statements wait, want %d", clk.Pending(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	scan := func(lit string) *mysqlproto.Statement {
		return query("SELECT COUNT(*) FROM t WHERE c LIKE '" + lit + "'")
	}
	gt := p.gates.get("bound")

	a, b, c := open("app"), open("app"), open("app")
	stA := scan("%7%")
	admitted("the first scan", before(a, stA))
	if a.cur.probe != gt || gt.String() != "bound=250 max=0 inflight=0.625 running=1 waiting=0 probes=1" {
		t.Fatalf("the first scan of a new shape is not its probe: %s", gt)
	}
	bDone := before(b, scan("%8%"))
	held(1)
	// Another new shape is its own probe, not held by the scan's.
	stC := query("SELECT a FROM t WHERE id = 1")
	admitted("a point select beside the probe", before(c, stC))
	c.After(stC, &mysqlproto.Outcome{BackendTime: time.Millisecond})
	// The probe ends after 150 ms (50 RU): the copy enters at its cost.
	clk.Advance(150 * time.Millisecond)
	a.After(stA, &mysqlproto.Outcome{BackendTime: 150 * time.Millisecond})
	admitted("the copy after the probe", bDone)
	if !near(b.cur.main().gateRU, 50.625) || b.cur.waited != 150*time.Millisecond || !near(b.cur.prepaid.RU(), 0.625) {
		t.Fatalf("the copy holds %v RU of the gate after waiting %v (prepaid %v), want 50.625 after 150ms, prepaid 0.625",
			b.cur.main().gateRU, b.cur.waited, b.cur.prepaid.RU())
	}
	if gt.String() != "bound=250 max=0 inflight=50.625 running=1 waiting=0" {
		t.Fatalf("after the probe: %s", gt)
	}
	b.After(scan("%8%"), &mysqlproto.Outcome{BackendTime: 150 * time.Millisecond})

	// A copy whose wait runs out goes on at the base cost: never refused.
	stA = query("SELECT SUM(k) FROM t WHERE c LIKE '%5%'")
	admitted("a new report", before(a, stA))
	bDone = before(b, query("SELECT SUM(k) FROM t WHERE c LIKE '%6%'"))
	held(1)
	clk.Advance(30 * time.Second)
	admitted("a copy past its wait", bDone)
	if !near(b.cur.main().gateRU, 0.625) || b.cur.waited != 30*time.Second {
		t.Fatalf("a copy past its wait holds %v RU after %v, want 0.625 after 30s", b.cur.main().gateRU, b.cur.waited)
	}
	b.After(query("SELECT SUM(k) FROM t WHERE c LIKE '%6%'"), &mysqlproto.Outcome{})
	a.After(stA, &mysqlproto.Outcome{})

	// A probe whose session ends before After: its copy wakes, finds no
	// estimate, and becomes the next probe.
	admitted("a new join", before(a, query("SELECT * FROM t JOIN u USING (id)")))
	bDone = before(b, query("SELECT * FROM t JOIN u USING (id)"))
	held(1)
	a.Event(mysqlproto.EventClose, mysqlproto.SessionInfo{})
	admitted("the copy of a probe that left", bDone)
	if b.cur.probe != gt || !near(b.cur.main().gateRU, 0.625) {
		t.Fatalf("the copy of a probe that left: probe %v, %v RU; %s", b.cur.probe, b.cur.main().gateRU, gt)
	}
	b.After(query("SELECT * FROM t JOIN u USING (id)"), &mysqlproto.Outcome{})
	if gt.String() != "bound=250 max=0 inflight=0 running=0 waiting=0" {
		t.Fatalf("at the end: %s", gt)
	}

	// An unlimited group holds no copy.
	r1, r2 := open("root"), open("root")
	st := query("SELECT MAX(k) FROM t")
	admitted("a new shape in default", before(r1, st))
	admitted("its copy in default", before(r2, query("SELECT MAX(k) FROM t")))
	if r1.cur.probe != nil || r2.cur.probe != nil {
		t.Fatal("an unlimited group's statements are probes")
	}
}
