package rgpolicy

import (
	"context"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
)

// killTimeout bounds one KILL QUERY on the service connection.
const killTimeout = 5 * time.Second

// watchQueue bounds the watches waiting for Run to add them: a burst of
// runaways beyond it (rgserver unreachable) drops watches, not memory.
const watchQueue = 64

// errKillNeedsService refuses a QUERY_LIMIT with ACTION=KILL when rgproxy
// has no service account to kill with.
var errKillNeedsService = resourcegroup.NewInvalid(
	"QUERY_LIMIT ACTION=KILL needs rgproxy's service account: start every rgproxy with --admin-user and --admin-password-file")

// runawayGuard watches one statement against its group's QUERY_LIMIT.
// It fires from its timer's goroutine, or from Progress when the bytes
// read push the statement's RU over the limit; the session goroutine
// disarms it in After and, if it fired, waits for the action (a KILL) to
// have returned before the session's next command.
type runawayGuard struct {
	rule  resourcegroup.QueryLimit
	group string
	start time.Time
	clk   clock.Clock
	fire  func()
	fired atomic.Bool
	done  chan struct{} // closed when the fired action completed
	// counted: a runaway watch matched the statement and was counted; the
	// limit acts when crossed but counts the statement no second time.
	counted bool

	// With a known CPU time, an RU limit's timer fires when the statement
	// would cross the limit if it burnt CPU all the time; it then reads the
	// thread's CPU so far and re-arms for what is left.
	cpu      *os.File // the thread's schedstat; nil: wall time
	cpuStart time.Duration
	cpuBuf   [64]byte
	baseRU   float64 // the before-cost
	msCost   float64 // RU per ms of CPU

	mu       sync.Mutex
	timer    clock.Timer
	disarmed bool
	firing   bool
}

// armRunaway starts the guard of a statement about to be forwarded, or
// returns nil when its group has no QUERY_LIMIT. EXEC_ELAPSED fires after
// that wall time; RU fires when the statement's RU so far — its
// before-cost, plus its backend time and read bytes as they grow — reaches
// the limit (the timer covers time, Progress the bytes).
func (s *session) armRunaway(g resourcegroup.Group, st *mysqlproto.Statement, cpuStart time.Duration, cpuOK bool) *runawayGuard {
	q := g.QueryLimit
	if q == nil || (q.ExecElapsed <= 0 && q.RU == 0) {
		return nil
	}
	after := q.ExecElapsed
	if q.RU > 0 {
		after = time.Duration(math.MaxInt64)
		if left := float64(q.RU) - s.cur.before.RU(); s.p.cost.CPUMsCost > 0 {
			after = msDuration(left / s.p.cost.CPUMsCost)
		}
	}
	gd := &runawayGuard{rule: *q, group: g.Name, start: s.p.clk.Now(), clk: s.p.clk, done: make(chan struct{}),
		baseRU: s.cur.before.RU(), msCost: s.p.cost.CPUMsCost, counted: s.cur.watched}
	if cpuOK && q.RU > 0 {
		gd.cpu, gd.cpuStart = s.cpu.f, cpuStart
	}
	connID := s.connID
	acct := s.account() // read on the session's goroutine
	// The scan's digest is the session's buffer, which it does not reuse
	// before done: fire copies it for addWatch.
	query, mode, digest, hash := st.Query, st.Mode(), st.Scan.Digest, st.Scan.DigestHash
	if q.Watch != resourcegroup.WatchNone {
		query = strings.Clone(query) // kept past the statement
	}
	gd.fire = func() {
		defer close(gd.done)
		gd.fired.Store(true)
		action := gd.rule.Action.String()
		if gd.rule.Action == resourcegroup.ActionKill && s.p.killer == nil {
			action = actionKillUnenforced
		}
		if !gd.counted {
			// A statement that matched a watch was counted, and has its
			// history row, then: one event per statement.
			s.p.metrics.runaway.WithLabelValues(gd.group, action).Inc()
		}
		if action == actionKillUnenforced {
			// Never silent: the rule predates this proxy (rgserver
			// refuses a new one while it is live; enforcement.go).
			s.p.logger.Error("runaway statement not killed: this rgproxy has no service account (start it with --admin-user); the statement runs on",
				"resource_group", gd.group, "action", action,
				"exec_elapsed", gd.rule.ExecElapsed, "ru", gd.rule.RU, "backend_connection", connID)
		} else {
			s.p.logger.Info("runaway statement", "resource_group", gd.group, "action", action,
				"exec_elapsed", gd.rule.ExecElapsed, "ru", gd.rule.RU, "backend_connection", connID)
		}
		// The session waits for done before its next command: query is
		// still the statement's text here.
		if !gd.counted {
			s.recordRunaway(acct, gd.group, "IDENTIFY", action, gd.rule.SwitchGroup, limitRule(gd.rule), query, mode, hash)
		}
		if gd.rule.Watch != resourcegroup.WatchNone && query != "" {
			s.p.queueWatch(gd.group, gd.rule, query, string(digest))
		}
		if gd.rule.Action == resourcegroup.ActionKill && s.p.killer != nil {
			ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
			defer cancel()
			if err := s.p.killer.KillQuery(ctx, connID); err != nil {
				s.p.logger.Warn("killing a runaway statement failed", "err", err)
			}
		}
	}
	gd.mu.Lock()
	gd.timer = s.p.clk.AfterFunc(after, gd.check)
	gd.mu.Unlock()
	return gd
}

// msDuration converts ms milliseconds to a Duration, saturating: at the
// largest Duration for more than it holds (an RU limit of 10¹³ at a third
// of an RU per CPU millisecond is 3·10¹⁹ ns), at 0 for a negative or NaN
// count. A plain conversion of a float beyond int64 gives the smallest
// int64, a timer that fires at once.
func msDuration(ms float64) time.Duration {
	ns := ms * float64(time.Millisecond)
	switch {
	case !(ns > 0):
		return 0
	case ns >= math.MaxInt64:
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// check runs on the timer's goroutine: it fires the guard, or, for an RU
// limit of a statement whose CPU time is known and still under the limit,
// re-arms the timer for the rest.
func (gd *runawayGuard) check() {
	gd.mu.Lock()
	if gd.disarmed || gd.firing {
		gd.mu.Unlock()
		return
	}
	if gd.cpu != nil && gd.msCost > 0 {
		if n, err := gd.cpu.ReadAt(gd.cpuBuf[:], 0); n > 0 || err == nil {
			if now, ok := parseSchedstat(gd.cpuBuf[:n]); ok {
				used := float64(now-gd.cpuStart) / float64(time.Millisecond) * gd.msCost
				if left := float64(gd.rule.RU) - gd.baseRU - used; left > 0 {
					gd.timer = gd.clk.AfterFunc(msDuration(left/gd.msCost+1), gd.check)
					gd.mu.Unlock()
					return
				}
			}
		}
	}
	gd.firing = true
	gd.mu.Unlock()
	gd.fire()
}

// fireNow fires the guard from the session goroutine, if it has not fired.
func (gd *runawayGuard) fireNow() {
	gd.mu.Lock()
	defer gd.mu.Unlock()
	if gd.disarmed || gd.firing {
		return
	}
	gd.timer.Stop()
	gd.firing = true
	go gd.fire() // a KILL must not hold up the relay it interrupts
}

// disarm stops the guard once the statement's response is over and reports
// whether it fired; if so it waits for the action to be done.
func (gd *runawayGuard) disarm() bool {
	if gd == nil {
		return false
	}
	gd.mu.Lock()
	gd.disarmed = true
	gd.timer.Stop()
	firing := gd.firing
	gd.mu.Unlock()
	if firing {
		<-gd.done
	}
	return firing
}

// Progress implements mysqlproto.ProgressObserver: a QUERY_LIMIT RU is
// crossed by the read bytes as well as by the backend time.
func (s *session) Progress(_ *mysqlproto.Statement, responseBytes int64) {
	gd := s.guard
	if gd == nil || gd.rule.RU == 0 || gd.fired.Load() {
		return
	}
	cpuSoFar := gd.clk.Now().Sub(gd.start)
	if gd.cpu != nil {
		if now, ok := s.cpu.read(); ok {
			cpuSoFar = now - gd.cpuStart
		}
	}
	soFar := s.cur.before.RU() + float64(responseBytes)*s.p.cost.ReadCostPerByte +
		float64(cpuSoFar)/float64(time.Millisecond)*s.p.cost.CPUMsCost
	if soFar >= float64(gd.rule.RU) {
		gd.fireNow()
	}
}

// RewriteError implements mysqlproto.ErrorRewriter.
func (s *session) RewriteError(_ *mysqlproto.Statement, code uint16) *mysqlproto.Error {
	if gd := s.guard; gd != nil && code == mysql.ER_QUERY_INTERRUPTED && gd.rule.Action == resourcegroup.ActionKill && gd.fired.Load() {
		return errRunawayKilled
	}
	return nil
}

// checkKillRule refuses a CREATE or ALTER that would give a group a KILL
// action on a proxy without a service account.
func (s *session) checkKillRule(stmt resourcegroup.Statement) error {
	if s.p.killer != nil {
		return nil
	}
	var q *resourcegroup.QueryLimit
	switch st := stmt.(type) {
	case *resourcegroup.CreateGroup:
		q = st.Group.QueryLimit
	case *resourcegroup.AlterGroup:
		if st.Fields&resourcegroup.FieldQueryLimit != 0 {
			q = st.Options.QueryLimit
		}
	}
	if q != nil && q.Action == resourcegroup.ActionKill {
		return errKillNeedsService
	}
	return nil
}

// chargeGroupAfter is the group the rest of a statement is charged to:
// after SWITCH_GROUP fired, the target group.
func (s *session) chargeGroupAfter(gd *runawayGuard, fired bool) string {
	if fired && gd.rule.Action == resourcegroup.ActionSwitchGroup {
		if _, ok := s.p.tokens.Group(gd.rule.SwitchGroup); ok {
			return gd.rule.SwitchGroup
		}
	}
	return s.cur.group
}

// watch is Before's second step: it checks the statement against its
// group's runaway watch list before it is forwarded. KILL answers it with
// 8254, SWITCH_GROUP moves it to the target group, COOLDOWN makes it wait
// for the proxy's one cooldown slot at LOW priority (cooldown true), DRYRUN
// only counts. The digest comes from the statement's scan; it is made a
// string only while a SIMILAR watch exists.
func (s *session) watch(st *mysqlproto.Statement) (cooldown bool, reply *mysqlproto.Reply) {
	if st.Query == "" {
		return false, nil
	}
	exact, similar := s.p.tokens.HasWatches()
	if !exact && !similar {
		return false, nil
	}
	var digest string
	if similar {
		digest = string(st.Scan.Digest) // a policy's statements always have one
	}
	w, ok := s.p.tokens.MatchGroupWatch(s.cur.group, st.Query, digest)
	if !ok {
		return false, nil
	}
	s.p.metrics.runaway.WithLabelValues(s.cur.group, w.Action.String()).Inc()
	s.cur.watched = true
	if s.p.history != nil {
		s.recordRunaway(s.account(), s.cur.group, "WATCH", w.Action.String(), w.SwitchGroup, watchRule(w), st.Query, st.Mode(),
			st.Scan.DigestHash)
	}
	switch w.Action {
	case resourcegroup.ActionKill:
		// Recorded with what it would have cost (SHOW LAST STATEMENT RU).
		s.price(st)
		s.led.recordRefused(&s.cur, errQuarantined.Code)
		return false, &mysqlproto.Reply{Err: errQuarantined}
	case resourcegroup.ActionSwitchGroup:
		if _, ok := s.p.tokens.Group(w.SwitchGroup); ok {
			s.cur.group = w.SwitchGroup
		}
	case resourcegroup.ActionCooldown:
		return true, nil
	}
	return false, nil
}

// queueWatch asks Run's goroutine to record, through rgserver, a watch
// for the statement that just crossed its group's limit (digest is the
// scan's, for a SIMILAR watch), so that every proxy acts on its like as
// soon as it arrives. The session does not wait; with watchQueue watches
// already waiting this one is dropped.
func (p *Policy) queueWatch(group string, rule resourcegroup.QueryLimit, text, digest string) {
	if _, ok := p.tokens.Store().(resourcegroup.WatchStore); !ok {
		return
	}
	w := resourcegroup.Watch{Group: group, Action: rule.Action, SwitchGroup: rule.SwitchGroup,
		Match: rule.Watch, Text: text, Source: p.instance}
	if rule.Watch == resourcegroup.WatchSimilar {
		w.Text = digest
	}
	if rule.WatchDuration > 0 {
		w.Expires = p.clk.Now().Add(rule.WatchDuration)
	}
	select {
	case p.newWatches <- w:
	default:
		p.logger.Warn("runaway watch not added: too many waiting to be added", "resource_group", group)
	}
}

// addWatches adds the queued watches until ctx ends, each within
// killTimeout.
func (p *Policy) addWatches(ctx context.Context) {
	for {
		var w resourcegroup.Watch
		select {
		case <-ctx.Done():
			return
		case w = <-p.newWatches:
		}
		ws, ok := p.tokens.Store().(resourcegroup.WatchStore)
		if !ok {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, killTimeout)
		_, err := ws.AddWatch(actx, w)
		cancel()
		if err != nil {
			p.logger.Warn("adding a runaway watch failed", "resource_group", w.Group, "err", err)
		}
	}
}
