package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// tokens is what the policy needs of tokenclient.Client; an interface so
// that the policy's decisions are unit-tested without a token server.
// Implementations must be safe for concurrent use.
type tokens interface {
	Acquire(ctx context.Context, group string, cons ru.Consumption, maxWait time.Duration) (time.Duration, error)
	Charge(group string, cons ru.Consumption)
	Group(name string) (resourcegroup.Group, bool)
	Binding(user string) (resourcegroup.Binding, bool)
	Store() resourcegroup.Store
	Usage(now time.Time) []tokenclient.GroupUsage
	// The runaway watch list, cached from rgserver.
	HasWatches() (exact, similar bool)
	MatchGroupWatch(group, text, digest string) (resourcegroup.Watch, bool)
}

// Error codes of the resource-control surface (TiDB's numbers).
const (
	codeThrottled = 8252
)

// rgPolicy meters every statement in RU and charges it to the session's
// resource group; it answers rgproxy's admin statements itself.
type rgPolicy struct {
	tokens tokens
	cost   ru.Config
	// service is rgproxy's one backend account, for KILL QUERY; nil when
	// --admin-user is not set.
	service *serviceConn
	// proxyID names this proxy as the source of the watches it adds.
	proxyID string
	// cooldown lets one statement under a COOLDOWN watch run at a time.
	cooldown  chan struct{}
	strict    bool
	maxWait   time.Duration
	txnWait   time.Duration
	admission *admission
	metrics   *metrics
	logger    *slog.Logger
	now       func() time.Time
}

func (p *rgPolicy) Open(info mysqlproto.SessionInfo) mysqlproto.SessionPolicy {
	return &rgSession{p: p, user: info.User, connID: info.BackendConnID}
}

// rgSession is one client session's policy state; mysqlproto calls it from
// the session goroutine only.
type rgSession struct {
	p    *rgPolicy
	user string
	// connID is the backend's id of this session's connection (KILL QUERY).
	connID uint32
	// setGroup is the group named by SET RESOURCE GROUP, "" = none.
	setGroup string
	// super caches whether the session's user has SUPER (nil = unknown),
	// asked of the backend the first time it matters.
	super *bool

	// The statement in flight, between Before and After.
	group    string
	req      ru.RequestInfo
	before   ru.Consumption
	waited   time.Duration
	admitted bool
	guard    *runawayGuard
	// cooling: the statement holds the proxy's COOLDOWN slot.
	cooling bool

	last lastStatement
}

// lastStatement is what SHOW LAST STATEMENT RU reports.
type lastStatement struct {
	valid  bool
	group  string
	cost   ru.Consumption
	waited time.Duration
}

func (s *rgSession) Before(ctx context.Context, st *mysqlproto.Statement, be mysqlproto.Backend) mysqlproto.Verdict {
	if (st.Command == mysql.COM_QUERY || st.Command == mysql.COM_STMT_PREPARE) && resourcegroup.IsAdmin(st.Query) {
		return s.admin(ctx, st, be)
	}
	if st.Multi && st.Command == mysql.COM_QUERY && multiHasAdmin(st.Query) {
		return errReply(errAdminInMulti)
	}
	s.group = s.resolve(ctx, st, be)
	if s.group == "" { // a refused hint
		return errReply(resourcegroup.NewAccessDenied())
	}
	s.waited = 0
	if st.Command == mysql.COM_STMT_SEND_LONG_DATA {
		// Long data is part of the EXECUTE that follows, which pays the
		// base cost: here only its bytes, as written bytes, without waiting.
		s.req = ru.RequestInfo{Class: ru.ClassFree}
		s.before = ru.Consumption{}
		if st.Class == mysqlproto.ClassWrite {
			s.before = ru.Consumption{WRU: float64(st.PayloadBytes) * s.p.cost.WriteCostPerByte, WriteBytes: float64(st.PayloadBytes)}
			s.p.tokens.Charge(s.group, s.before)
		}
		return mysqlproto.Verdict{}
	}
	watched, cooldown := s.applyWatch(st)
	if watched != nil {
		return mysqlproto.Verdict{Reply: watched}
	}
	s.req = ru.RequestInfo{Class: costClass(st), WriteBytes: st.PayloadBytes}
	s.before = s.p.cost.BeforeCost(s.req)
	if !s.before.IsZero() {
		if reply := s.charge(ctx, st); reply != nil {
			return mysqlproto.Verdict{Reply: reply}
		}
	}
	g, _ := s.p.tokens.Group(s.group)
	prio := g.Priority
	if cooldown {
		prio = resourcegroup.PriorityLow
		select {
		case s.p.cooldown <- struct{}{}:
			s.cooling = true
		case <-ctx.Done():
			s.p.tokens.Charge(s.group, negate(s.before))
			return errReply(errInterrupted)
		}
	}
	if err := s.p.admission.acquire(ctx, prio); err != nil {
		s.releaseCooldown()
		s.p.tokens.Charge(s.group, negate(s.before))
		return errReply(errInterrupted)
	}
	s.admitted = true
	s.guard = s.armRunaway(g, st.Query)
	return mysqlproto.Verdict{}
}

// charge takes the before-cost, waiting as the transaction rules allow.
func (s *rgSession) charge(ctx context.Context, st *mysqlproto.Statement) *mysqlproto.Reply {
	if st.Command == mysql.COM_QUERY && endsTransaction(st.Query) {
		// COMMIT and ROLLBACK never wait: throttling must not hold row locks.
		s.p.tokens.Charge(s.group, s.before)
		return nil
	}
	maxWait := s.p.maxWait
	if st.InTransaction {
		maxWait = s.p.txnWait
	}
	waited, err := s.p.tokens.Acquire(ctx, s.group, s.before, maxWait)
	if errors.Is(err, tokenclient.ErrUnknownGroup) && s.group != resourcegroup.DefaultGroup {
		// Dropped under us: the session falls back to default.
		s.group = resourcegroup.DefaultGroup
		waited, err = s.p.tokens.Acquire(ctx, s.group, s.before, maxWait)
	}
	s.waited = waited
	if err == nil {
		return nil
	}
	if st.InTransaction && errors.Is(err, tokenclient.ErrThrottled) {
		// Inside a transaction a statement runs on debt rather than hold
		// locks longer; later statements repay it.
		s.p.tokens.Charge(s.group, s.before)
		return nil
	}
	if errors.Is(err, tokenclient.ErrThrottled) {
		if s.p.logger.Enabled(ctx, slog.LevelDebug) {
			// Statements are logged only as digests: literals may be secrets.
			s.p.logger.Debug("statement throttled", "resource_group", s.group,
				"digest", mysqlproto.Digest([]byte(st.Query)), "waited", waited)
		}
		return &mysqlproto.Reply{Err: &mysqlproto.Error{Code: codeThrottled, State: "HY000",
			Message: fmt.Sprintf("Exceeded resource group quota limitation (resource group %s)", s.group)}}
	}
	return &mysqlproto.Reply{Err: errInterrupted}
}

// errInterrupted answers a statement whose session ended while it waited.
var errInterrupted = &mysqlproto.Error{Code: 1317, State: "70100", Message: "Query execution was interrupted"}

func (s *rgSession) After(st *mysqlproto.Statement, out *mysqlproto.Outcome) {
	if s.admitted {
		s.p.admission.release()
		s.admitted = false
	}
	s.releaseCooldown()
	res := ru.ResponseInfo{
		ReadBytes:   out.ResponseBytes,
		WriteBytes:  out.RequestBytes - st.PayloadBytes,
		BackendTime: out.BackendTime,
		Failed:      out.ErrCode != 0,
	}
	after := s.p.cost.AfterCost(s.req, res)
	fired := s.guard.disarm()
	chargeTo := s.chargeGroupAfter(s.guard, fired)
	s.guard = nil
	if !after.IsZero() {
		s.p.tokens.Charge(chargeTo, after)
	}
	total := s.before
	total.Add(after)
	s.last = lastStatement{valid: true, group: s.group, cost: total, waited: s.waited}
	s.p.metrics.charged(s.group, st.Class.String(), total)
}

func (s *rgSession) Event(kind mysqlproto.EventKind, info mysqlproto.SessionInfo) {
	switch kind {
	case mysqlproto.EventChangeUser, mysqlproto.EventResetConnection:
		s.user = info.User
		s.setGroup = ""
		s.super = nil
	}
}

// resolve picks the statement's group: hint, else SET RESOURCE GROUP, else
// the user's binding, else default. A group that no longer exists falls
// back to default. It returns "" when strict mode refuses the hint.
func (s *rgSession) resolve(ctx context.Context, st *mysqlproto.Statement, be mysqlproto.Backend) string {
	if st.Command == mysql.COM_QUERY {
		if h, ok := resourcegroup.ExtractHint(st.Query); ok {
			h = resourcegroup.NormalizeName(h)
			if !s.mayUse(ctx, h, be) {
				return ""
			}
			if _, ok := s.p.tokens.Group(h); ok {
				return h
			}
		}
	}
	if s.setGroup != "" {
		if _, ok := s.p.tokens.Group(s.setGroup); ok {
			return s.setGroup
		}
	}
	return s.bound()
}

// currentGroup is the session's group: SET RESOURCE GROUP, else the
// binding, else default.
func (s *rgSession) currentGroup() string {
	if s.setGroup != "" {
		return s.setGroup
	}
	return s.bound()
}

// bound is the user's bound group if it exists, else default.
func (s *rgSession) bound() string {
	if b, ok := s.p.tokens.Binding(s.user); ok {
		if _, ok := s.p.tokens.Group(b.Group); ok {
			return b.Group
		}
	}
	return resourcegroup.DefaultGroup
}

// mayUse applies strict mode: without SUPER a session may name only its
// bound group or default.
func (s *rgSession) mayUse(ctx context.Context, group string, be mysqlproto.Backend) bool {
	if !s.p.strict || group == resourcegroup.DefaultGroup || group == s.bound() {
		return true
	}
	return s.hasSuper(ctx, be)
}

func (s *rgSession) hasSuper(ctx context.Context, be mysqlproto.Backend) bool {
	if s.super != nil {
		return *s.super
	}
	_, rows, err := be.Query(ctx, "SHOW GRANTS")
	if err != nil {
		s.p.logger.Warn("SHOW GRANTS failed", "err", err)
		return false
	}
	var lines []string
	for _, r := range rows {
		if len(r) > 0 && r[0] != nil {
			lines = append(lines, *r[0])
		}
	}
	v := resourcegroup.HasSuper(lines)
	s.super = &v
	return v
}

// admin answers one of rgproxy's own statements; nothing reaches the backend.
func (s *rgSession) admin(ctx context.Context, st *mysqlproto.Statement, be mysqlproto.Backend) mysqlproto.Verdict {
	if st.Command == mysql.COM_STMT_PREPARE {
		return errReply(resourcegroup.NewNotAllowedInPrepare())
	}
	if st.Multi {
		return errReply(errAdminInMulti)
	}
	stmt, err := resourcegroup.Parse(st.Query)
	if err != nil {
		return errReply(err)
	}
	switch a := stmt.(type) {
	case *resourcegroup.SetGroup:
		name := resourcegroup.NormalizeName(a.Name)
		if _, ok := s.p.tokens.Group(name); !ok {
			return errReply(resourcegroup.NewNotFound(name))
		}
		if !s.mayUse(ctx, name, be) {
			return errReply(resourcegroup.NewAccessDenied())
		}
		s.setGroup = name
		if name == resourcegroup.DefaultGroup {
			s.setGroup = ""
		}
		return mysqlproto.Verdict{Reply: &mysqlproto.Reply{}}
	case *resourcegroup.CurrentGroup:
		return resultReply([]string{"CURRENT_RESOURCE_GROUP()"}, [][]string{{s.currentGroup()}})
	case *resourcegroup.ShowLastStatementRU:
		return s.showLast()
	case *resourcegroup.ShowUsage:
		return s.showUsage()
	}
	if resourcegroup.RequiresSuper(stmt) && !s.hasSuperFresh(ctx, be) {
		return errReply(resourcegroup.NewAccessDenied())
	}
	if err := s.checkKillRule(stmt); err != nil {
		return errReply(err)
	}
	if a, ok := stmt.(*resourcegroup.QueryWatchAdd); ok {
		// What resourcegroup cannot know: the session's group, and the
		// digest of a SIMILAR text.
		if a.Group == "" {
			a.Group = s.currentGroup()
		}
		if a.Match == resourcegroup.WatchSimilar && a.Digest == "" {
			a.Digest = mysqlproto.Digest([]byte(a.Text))
		}
	}
	res, err := resourcegroup.Execute(ctx, stmt, s.p.tokens.Store())
	if err != nil {
		return errReply(err)
	}
	if resourcegroup.RequiresSuper(stmt) {
		s.p.logger.Info("resource group change", "user", s.user, "statement", mysqlproto.Digest([]byte(st.Query)))
	}
	if res.IsResultSet() {
		return mysqlproto.Verdict{Reply: &mysqlproto.Reply{Columns: res.Columns, Rows: res.Rows}}
	}
	return mysqlproto.Verdict{Reply: &mysqlproto.Reply{AffectedRows: res.AffectedRows}}
}

// hasSuperFresh re-reads the grants: a DDL is rare, and privileges revoked
// since the session started must count.
func (s *rgSession) hasSuperFresh(ctx context.Context, be mysqlproto.Backend) bool {
	s.super = nil
	return s.hasSuper(ctx, be)
}

func (s *rgSession) showLast() mysqlproto.Verdict {
	cols := []string{"RESOURCE_GROUP", "RRU", "WRU", "READ_BYTES", "WRITE_BYTES", "BACKEND_MS", "THROTTLE_WAIT_MS"}
	if !s.last.valid {
		return resultReply(cols, nil)
	}
	c := s.last.cost
	return resultReply(cols, [][]string{{
		s.last.group,
		formatFloat(c.RRU), formatFloat(c.WRU),
		strconv.FormatFloat(c.ReadBytes, 'f', 0, 64), strconv.FormatFloat(c.WriteBytes, 'f', 0, 64),
		formatFloat(c.BackendSeconds * 1000), formatFloat(float64(s.last.waited) / float64(time.Millisecond)),
	}})
}

func (s *rgSession) showUsage() mysqlproto.Verdict {
	cols := []string{"NAME", "RU_PER_SEC_LAST_10S", "TOKENS_LEFT", "THROTTLED", "DEGRADED"}
	var rows [][]string
	for _, u := range s.p.tokens.Usage(s.p.now()) {
		rows = append(rows, []string{u.Group, formatFloat(u.RUPerSec), formatFloat(u.Tokens),
			strconv.FormatUint(u.Throttled, 10), yesNo(u.Degraded)})
	}
	return resultReply(cols, rows)
}

// errAdminInMulti refuses an admin statement inside a multi-statement:
// rgproxy answers those itself, the backend would get the rest.
var errAdminInMulti = &mysqlproto.Error{Code: resourcegroup.CodeNotAllowedPrepare, State: "HY000",
	Message: "rgproxy: resource group statements must be sent alone, not inside a multi-statement"}

// multiHasAdmin reports whether any part of a multi-statement is one of
// rgproxy's admin statements.
func multiHasAdmin(q string) bool {
	for _, part := range mysqlproto.SplitStatements([]byte(q)) {
		if resourcegroup.IsAdmin(string(part)) {
			return true
		}
	}
	return false
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

// endsTransaction reports whether a query is COMMIT or ROLLBACK (not
// ROLLBACK TO SAVEPOINT, which keeps the transaction open).
func endsTransaction(q string) bool {
	q = strings.TrimLeft(q, " \t\r\n(")
	word := q
	if i := strings.IndexAny(q, " \t\r\n;"); i >= 0 {
		word = q[:i]
	}
	switch {
	case strings.EqualFold(word, "COMMIT"):
		return true
	case strings.EqualFold(word, "ROLLBACK"):
		rest := strings.TrimLeft(q[len(word):], " \t\r\n")
		if i := strings.IndexAny(rest, " \t\r\n;"); i >= 0 {
			rest = rest[:i]
		}
		if strings.EqualFold(rest, "WORK") {
			return true
		}
		return !strings.EqualFold(rest, "TO")
	}
	return false
}

func negate(c ru.Consumption) ru.Consumption {
	var z ru.Consumption
	z.Sub(c)
	return z
}

func errReply(err error) mysqlproto.Verdict {
	var re *resourcegroup.Error
	if errors.As(err, &re) {
		return mysqlproto.Verdict{Reply: &mysqlproto.Reply{Err: &mysqlproto.Error{Code: re.Code, State: re.State, Message: re.Message}}}
	}
	var me *mysqlproto.Error
	if errors.As(err, &me) {
		return mysqlproto.Verdict{Reply: &mysqlproto.Reply{Err: me}}
	}
	return mysqlproto.Verdict{Reply: &mysqlproto.Reply{Err: &mysqlproto.Error{Code: 1105, State: "HY000", Message: err.Error()}}}
}

func resultReply(cols []string, rows [][]string) mysqlproto.Verdict {
	out := make([][]*string, len(rows))
	for i, r := range rows {
		out[i] = make([]*string, len(r))
		for j := range r {
			v := r[j]
			out[i][j] = &v
		}
	}
	return mysqlproto.Verdict{Reply: &mysqlproto.Reply{Columns: cols, Rows: out}}
}

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }

func yesNo(b bool) string {
	if b {
		return "YES"
	}
	return "NO"
}
