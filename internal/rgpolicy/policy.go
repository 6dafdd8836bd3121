// Package rgpolicy is rgproxy's metering policy: the mysqlproto.Policy
// that resolves each statement's resource group, applies runaway watches,
// charges the statement's estimated cost in RU through tokenclient before
// it is forwarded, admits it to the backend, and settles the measured cost
// after its final packet. It also answers rgproxy's own SQL (the resource
// group statements and the virtual tables).
//
// Before a statement is forwarded, Before runs four named steps, in the
// spirit of PD's OnRequestWait / OnResponse interceptor:
//
//	resolve → watch → charge → admit
//
// resolve picks the group (hint, SET RESOURCE GROUP, tag binding, account
// binding, default);
// watch applies the runaway watch list; charge takes max(before-cost,
// the shape's estimate) from the group's bucket, waiting under the
// --max-wait rules; admit bounds what the group has in flight on this proxy
// and the backend's concurrency. After settles the difference between what
// was charged and what the statement cost, and teaches the estimate.
package rgpolicy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// Tokens is what the policy needs of tokenclient.Client; an interface so
// that the policy's decisions are unit-tested without a token server.
// Implementations must be safe for concurrent use.
type Tokens interface {
	// AcquireShare takes cons.RU() of the group's tokens, only the
	// required part of which can get the statement refused, and returns
	// the group's share as it stood then; from the session's purse when
	// it can (tokenclient.Client.AcquireShare).
	AcquireShare(ctx context.Context, p *tokenclient.Purse, group string, cons ru.Consumption, required float64, maxWait time.Duration) (tokenclient.Share, time.Duration, error)
	Charge(group string, cons ru.Consumption)
	// ChargePurse is Charge that settles in the session's purse when it
	// can; ReturnPurse gives what the purse holds back when the session
	// ends.
	ChargePurse(p *tokenclient.Purse, group string, cons ru.Consumption)
	ReturnPurse(p *tokenclient.Purse)
	CountThrottled(group string)
	HoldDemand(group string, d float64)
	WouldAcquire(group string, cons ru.Consumption, required float64, maxWait time.Duration) (time.Duration, bool)
	Group(name string) (resourcegroup.Group, bool)
	Binding(user, host string) (resourcegroup.Binding, bool)
	// CacheGeneration changes whenever what Group, Binding, HasBindings,
	// HasTagBindings and TagGroup answer may have changed.
	CacheGeneration() uint64
	HasBindings(user string) bool
	// Tag bindings: HasTagBindings is asked before any comment is parsed.
	HasTagBindings() bool
	TagGroup(key, value string) (string, bool)
	Store() resourcegroup.Store
	Usage(now time.Time) []tokenclient.GroupUsage
	// The runaway watch list, cached from rgserver.
	HasWatches() (exact, similar bool)
	MatchGroupWatch(group, text, digest string) (resourcegroup.Watch, bool)
}

// Killer kills a running statement on the backend: rgproxy's service
// account (--admin-user). Safe for concurrent use.
type Killer interface {
	KillQuery(ctx context.Context, backendConnID uint32) error
}

// Settings are the policy's settings that a reload (SIGHUP) may change
// while sessions run.
type Settings struct {
	// Strict: without SUPER a session may name only its bound group (or
	// default when it has none) by hint or SET RESOURCE GROUP.
	Strict bool
	// MaxWait is the longest a statement waits for tokens (and for its
	// group's in-flight bound) before 8252.
	MaxWait time.Duration
	// MaxWaitInTxn is the longest wait inside an open transaction; then
	// the statement runs on debt.
	MaxWaitInTxn time.Duration
	// MaxBackendConcurrency caps statements running on the backend at
	// once; 0 = unlimited.
	MaxBackendConcurrency int
}

// Config configures a Policy.
type Config struct {
	// Tokens is the token client. Required.
	Tokens Tokens
	// Cost is the RU cost model. Default ru.DefaultConfig().
	Cost ru.Config
	// Killer kills runaway statements; nil = QUERY_LIMIT ACTION=KILL is
	// refused at CREATE time.
	Killer Killer
	// ProxyID names this proxy as the source of the watches it adds.
	ProxyID string
	// Settings are the reloadable settings.
	Settings Settings
	// Shapes is how many statement shapes (digest within a group) the
	// proxy remembers for cost estimates and statements_summary, least
	// recently used evicted. Default 10,000.
	Shapes int
	// CPU chooses where a statement's CPU time comes from; see CPUSource.
	// Default CPUAuto.
	CPU CPUSource
	// BackendAddr is the backend's host:port, to tell whether it runs on
	// this host (CPUAuto).
	BackendAddr string
	// ProcRoot is where the proc file system is mounted. Default /proc.
	ProcRoot string
	// IdleGroupExpiry: a group with no statement on this proxy for this
	// long loses its per-group series until it is used again, so that many groups do not mean many series on every proxy.
	// Default 1 h.
	IdleGroupExpiry time.Duration
	// Writes is where the bytes a statement wrote come from (wru.go).
	// Default WriteAuto.
	Writes WriteSource
	// Binlog reads the backend's binary log; nil = none (WriteAuto then
	// means the estimate).
	Binlog Binlog
	// Registerer receives the policy's metrics; nil = not exported.
	Registerer prometheus.Registerer
	// Logger receives the policy's logs. Default slog.Default().
	Logger *slog.Logger
	// Clock is the time source, shared with tokenclient in tests.
	// Default the wall clock.
	Clock clock.Clock
}

// Policy is the metering policy. Open is safe for concurrent use.
type Policy struct {
	tokens   Tokens
	cost     ru.Config
	killer   Killer
	proxyID  string
	settings atomic.Pointer[Settings]
	// cooldown lets one statement under a COOLDOWN watch run at a time.
	cooldown  chan struct{}
	admission *admission
	gates     *gates
	shapes    *shapes
	cpu       *cpuSource
	metrics   *metrics
	writes    *writes
	logger    *slog.Logger
	clk       clock.Clock
	idle      time.Duration
}

// New returns a Policy for cfg.
func New(cfg Config) (*Policy, error) {
	if cfg.Tokens == nil {
		return nil, errors.New("rgpolicy: Config.Tokens is required")
	}
	if cfg.Cost == (ru.Config{}) {
		cfg.Cost = ru.DefaultConfig()
	}
	if err := cfg.Cost.Validate(); err != nil {
		return nil, err
	}
	if cfg.Shapes <= 0 {
		cfg.Shapes = 10000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.IdleGroupExpiry <= 0 {
		cfg.IdleGroupExpiry = time.Hour
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	p := &Policy{
		tokens:    cfg.Tokens,
		cost:      cfg.Cost,
		killer:    cfg.Killer,
		proxyID:   cfg.ProxyID,
		cooldown:  make(chan struct{}, 1),
		admission: newAdmission(cfg.Settings.MaxBackendConcurrency),
		gates:     newGates(),
		shapes:    newShapes(cfg.Shapes),
		cpu:       newCPUSource(cfg.CPU, cfg.BackendAddr, cfg.ProcRoot, cfg.Logger),
		metrics:   m,
		logger:    cfg.Logger,
		clk:       cfg.Clock,
		idle:      cfg.IdleGroupExpiry,
	}
	if p.writes, err = newWrites(cfg.Writes, cfg.Binlog, cfg.Registerer); err != nil {
		return nil, err
	}
	s := cfg.Settings
	p.settings.Store(&s)
	m.cpuSource(p.cpu.inForce())
	onCPU := m.cpuSource
	p.cpu.onChange.Store(&onCPU)
	m.seeGroup(resourcegroup.DefaultGroup, cfg.Clock.Now())
	return p, nil
}

// Run forgets, until they are used again, the series of the groups idle on
// this proxy for IdleGroupExpiry. It returns when ctx ends.
func (p *Policy) Run(ctx context.Context) {
	every := min(p.idle/4, time.Minute)
	for {
		t := p.clk.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		for _, g := range p.metrics.idleGroups(p.clk.Now().Add(-p.idle)) {
			p.ForgetGroup(g)
		}
	}
}

// ForgetGroup deletes the group's series because it was dropped or has
// been idle here for long; a later statement of the group brings them
// back, at 0. (Its in-flight gate, a few words, stays: removing it could
// race with a statement about to enter it.)
func (p *Policy) ForgetGroup(group string) { p.metrics.forgetGroup(group) }

// Reload replaces the reloadable settings; statements already waiting
// keep the rules they started with.
func (p *Policy) Reload(s Settings) {
	p.settings.Store(&s)
	p.admission.setLimit(s.MaxBackendConcurrency)
}

// CurrentSettings returns the settings in force.
func (p *Policy) CurrentSettings() Settings { return *p.settings.Load() }

// CPUSourceInForce names where CPU time comes from for the sessions opened
// most recently: "proc" or "wall".
func (p *Policy) CPUSourceInForce() string { return p.cpu.inForce().String() }

// ScanWords are the words the policy needs mysqlproto's scan to report
// (mysqlproto.Config.ScanWords): every statement rgproxy answers itself
// holds one of them, so a statement without any is forwarded without a
// second look at its text.
func ScanWords() []string {
	return []string{"resource", "watch", "last", "current_resource_group", "resource_groups",
		"runaway_watches", "statements_summary", "resource_group_bindings"}
}

// Open implements mysqlproto.Policy.
func (p *Policy) Open(info mysqlproto.SessionInfo) mysqlproto.SessionPolicy {
	return &session{p: p, user: info.User, connID: info.BackendConnID}
}

// session is one client session's policy state; mysqlproto calls it from
// the session goroutine only.
type session struct {
	p    *Policy
	user string
	// host is the host pattern of the account the backend matched at login
	// (CURRENT_USER()), asked once per login and only when some account of
	// the user name is bound; hostKnown says it was asked.
	host      string
	hostKnown bool
	// connID is the backend's id of this session's connection (KILL QUERY).
	connID uint32
	// setGroup is the group named by SET RESOURCE GROUP, "" = none.
	setGroup string
	// super caches whether the session's user has SUPER (nil = unknown),
	// asked of the backend the first time it matters.
	super *bool
	// cpu reads the CPU time of the backend thread serving the session.
	cpu cpuReader

	// cur is the statement in flight, between Before and After.
	cur statement
	// guard watches the statement in flight against its QUERY_LIMIT.
	guard *runawayGuard

	last lastStatement
	// notes are what rgproxy's own last statement noted (SHOW WARNINGS).
	notes []*resourcegroup.Error
	// seenGroup was last reported to the metrics as used, at seenAt: the
	// session tells them again only when the group changes or now and then.
	// heldGroup and held: the RU of the session's last refused statement,
	// held as waiting demand of its group until the next statement.
	heldGroup   string
	held        float64
	seenGroup   string
	seenAt      time.Time
	seenForgets uint64
	// series are seenGroup's per-statement series.
	series *groupSeries
	// rt keeps the session's route between statements.
	rt route
	// purse is the session's advance on its group's tokens
	// (tokenclient.Purse).
	purse tokenclient.Purse
	// shapes is the session's memo of the shapes it used lately.
	shapes shapeMemo
	// wr is the session's write accounting (wru.go).
	wr writeState
}

// statement is what the policy keeps of the statement in flight.
type statement struct {
	group    string
	req      ru.RequestInfo
	before   ru.Consumption // the before-cost (base and up-front write bytes)
	prepaid  ru.Consumption // what was taken before forwarding: >= before
	shape    shapeKey
	hasShape bool // the statement has a digest: it is estimated and summarized
	known    bool // its shape has an estimate
	// probe: the statement is the first of its unknown shape in flight in
	// this gate (session.awaitProbe).
	probe    *gate
	waited   time.Duration
	admitted bool // holds a backend concurrency slot
	gate     *gate
	gateRU   float64 // what it holds of the gate
	cooling  bool    // holds the proxy's COOLDOWN slot
	cpuStart time.Duration
	cpuOK    bool
	start    time.Time
	// short: the statement's shape is known to answer within
	// cpuMinEstimate; it is charged wall time up to cpuMinEstimate, its
	// CPU goes unread.
	short bool
	// share is this proxy's share of the group (tokenclient.Share).
	share tokenclient.Share
	// would is what ENFORCE would have done to a statement of a group in
	// MODE WARN ("" = nothing: it would have run at once).
	would string
}

// lastStatement is what SHOW LAST STATEMENT RU reports.
type lastStatement struct {
	valid   bool
	group   string
	cost    ru.Consumption
	waited  time.Duration
	errCode uint16 // the error rgproxy answered with (8252), 0 if it ran
	would   string // MODE WARN: what ENFORCE would have done

	// write is how its written bytes were settled (FollowUp, wru.go).
	write *writeResult
}

// Before implements mysqlproto.SessionPolicy.
func (s *session) Before(ctx context.Context, st *mysqlproto.Statement, be mysqlproto.Backend) mysqlproto.Verdict {
	s.freshRoute()
	if s.held != 0 {
		s.p.tokens.HoldDemand(s.heldGroup, -s.held)
		s.held = 0
	}
	if !s.hostKnown && !s.rt.unbound {
		if s.p.tokens.HasBindings(s.user) {
			s.learnAccount(ctx, be)
		} else {
			s.rt.unbound = true
		}
	}
	if s.notes != nil {
		if v, ok := s.showNotes(st); ok {
			return v
		}
	}
	var refs []virtualRef
	if (st.Command == mysql.COM_QUERY || st.Command == mysql.COM_STMT_PREPARE) && st.Scan.Mentions&virtualMentions != 0 {
		refs = findVirtual(st.Query, st.NoBackslashEscapes, func() bool { s.cpu.stale(); return inInformationSchema(ctx, be) })
		if refs != nil && st.Command == mysql.COM_STMT_PREPARE {
			// A prepared statement would keep a stale copy of the rows.
			return errReply(resourcegroup.NewNotAllowedInPrepare())
		}
	}
	var rewrite string
	if refs == nil && (st.Command == mysql.COM_QUERY || st.Command == mysql.COM_STMT_PREPARE) {
		if st.Scan.Mentions != 0 && resourcegroup.IsAdmin(st.Query) {
			v := s.admin(ctx, st, be)
			if v.Reply != nil || v.Rewrite == "" {
				return v
			}
			// An admin statement that the backend evaluates (SHOW ...
			// USAGE WHERE): metered and forwarded as a rewrite.
			rewrite = v.Rewrite
		}
		if st.Multi && st.Scan.Mentions != 0 && multiHasAdmin(st.Query, st.NoBackslashEscapes) {
			return errReply(errAdminInMulti)
		}
	}
	s.cur = statement{start: s.p.clk.Now()}
	set := s.p.settings.Load()
	if r := s.resolve(ctx, st, be, set); r != nil {
		return mysqlproto.Verdict{Reply: r}
	}
	if f := s.p.metrics.forgets.Load(); s.cur.group != s.seenGroup || s.cur.start.Sub(s.seenAt) > 10*time.Second || f != s.seenForgets {
		s.see(s.cur.group, s.cur.start, f)
	}
	if refs != nil {
		var err error
		rewrite, err = rewriteVirtual(st.Query, st.NoBackslashEscapes, refs, s.cur.group,
			func(name string) (*vtable, error) { return s.virtualTable(ctx, name, be) })
		if err != nil {
			return errReply(err)
		}
	}
	cooldown, r := s.watch(st)
	if r != nil {
		return mysqlproto.Verdict{Reply: r}
	}
	s.cpu.open(ctx, s.p.cpu, be)
	s.writesBefore(ctx, st, be)
	if r := s.charge(ctx, st, set); r != nil {
		return mysqlproto.Verdict{Reply: r}
	}
	if r := s.admit(ctx, st, set, cooldown); r != nil {
		s.endProbe()
		s.p.tokens.Charge(s.cur.group, negate(s.cur.prepaid))
		return mysqlproto.Verdict{Reply: r}
	}
	if s.cur.req.Class != ru.ClassFree && !s.cur.short {
		s.cur.cpuStart, s.cur.cpuOK = s.cpu.start()
	} else {
		s.cpu.stale() // charged wall time: the thread's CPU goes unread
	}
	g, _ := s.group(s.cur.group)
	s.guard = s.armRunaway(g, st.Query, s.cur.cpuStart, s.cur.cpuOK)
	return mysqlproto.Verdict{Rewrite: rewrite}
}

// After implements mysqlproto.SessionPolicy: it releases what admit
// holds, settles the statement's measured cost against what charge took,
// and teaches the shape's estimate.
func (s *session) After(st *mysqlproto.Statement, out *mysqlproto.Outcome) {
	cur := &s.cur
	var cpu time.Duration
	cpuOK := false
	switch {
	case cur.cpuOK:
		if end, ok := s.cpu.end(); ok && end >= cur.cpuStart {
			cpu, cpuOK = end-cur.cpuStart, true
		}
	case cur.short && s.cpu.readable():
		// Its CPU went unread: wall time, but no more than a short
		// statement's CPU (cpuMinEstimate).
		cpu, cpuOK = min(max(out.BackendTime, 0), cpuMinEstimate), true
	}
	s.release()
	res := ru.ResponseInfo{
		ReadBytes:   out.ResponseBytes,
		WriteBytes:  out.RequestBytes - st.PayloadBytes,
		BackendTime: out.BackendTime,
		CPUTime:     cpu,
		CPUKnown:    cpuOK,
		Failed:      out.ErrCode != 0,
	}
	after := s.p.cost.AfterCost(cur.req, res)
	fired := s.guard.disarm()
	chargeTo := s.chargeGroupAfter(s.guard, fired)
	s.guard = nil
	total := cur.before
	total.Add(after)
	// Settle: the statement paid prepaid up front; it owes total. After
	// SWITCH_GROUP the target pays what came after, and the group gets
	// back the estimate it paid beyond the before-cost.
	if chargeTo == cur.group {
		settle := total
		settle.Sub(cur.prepaid)
		if !settle.IsZero() {
			s.p.tokens.ChargePurse(&s.purse, cur.group, settle)
		}
	} else {
		extra := cur.prepaid
		extra.Sub(cur.before)
		if !extra.IsZero() {
			s.p.tokens.Charge(cur.group, negate(extra))
		}
		s.p.tokens.Charge(chargeTo, after)
	}
	s.last = lastStatement{valid: true, group: cur.group, cost: total, waited: cur.waited, would: cur.would}
	if cur.hasShape && !out.NotForwarded { // a statement that never ran teaches nothing
		s.p.shapes.observe(cur.shape, &s.shapes, st.Scan.Digest, total, out.BackendTime, cur.waited, out.ErrCode != 0, cur.start)
	}
	s.endProbe()                  // after observe: the statements it wakes find its cost
	if s.seenGroup != cur.group { // charge moved the statement to default
		s.see(cur.group, cur.start, s.p.metrics.forgets.Load())
	}
	s.series.charged(st.Class.String(), total)
}

// see tells the metrics the session used group at now and keeps its
// series; forgets is metrics.forgets as read before.
func (s *session) see(group string, now time.Time, forgets uint64) {
	s.series = s.p.metrics.seeGroup(group, now)
	s.seenGroup, s.seenAt, s.seenForgets = group, now, forgets
}

// release frees what the statement in flight holds: its backend
// concurrency slot, its share of the group's in-flight bound and the
// COOLDOWN slot.
func (s *session) release() {
	cur := &s.cur
	if cur.admitted {
		s.p.admission.release()
		cur.admitted = false
	}
	if cur.gate != nil {
		cur.gate.release(cur.gateRU)
		cur.gate = nil
	}
	if cur.cooling {
		<-s.p.cooldown
		cur.cooling = false
	}
}

// Event implements mysqlproto.SessionPolicy.
func (s *session) Event(kind mysqlproto.EventKind, info mysqlproto.SessionInfo) {
	switch kind {
	case mysqlproto.EventChangeUser, mysqlproto.EventResetConnection:
		s.user = info.User
		s.setGroup = ""
		s.super = nil
		s.host, s.hostKnown = "", false
		s.rt.boundOK, s.rt.unbound = false, false
		s.wr = writeState{}
	case mysqlproto.EventClose:
		// After runs for every statement Before let through; in case a
		// path ever misses it, what a statement holds goes with its
		// session rather than wedge its group (a leaked gate slot would
		// keep the group's heavy statements waiting for ever).
		s.release()
		s.endProbe()
		s.guard.disarm()
		s.guard = nil
		s.cpu.close()
		s.p.tokens.ReturnPurse(&s.purse)
		if s.held != 0 {
			s.p.tokens.HoldDemand(s.heldGroup, -s.held)
			s.held = 0
		}
	}
}

// errInterrupted answers a statement whose session ended while it waited.
var errInterrupted = &mysqlproto.Error{Code: 1317, State: "70100", Message: "Query execution was interrupted"}

// codeThrottled is TiDB's "Exceeded resource group quota limitation".
const codeThrottled = 8252

func throttledError(group string) *mysqlproto.Error {
	return &mysqlproto.Error{Code: codeThrottled, State: "HY000",
		Message: fmt.Sprintf("Exceeded resource group quota limitation (resource group %s)", group)}
}

// refused records a statement that rgproxy refused with 8252 as the
// session's last statement: it cost nothing and waited waited.
func (s *session) refused(waited time.Duration) *mysqlproto.Reply {
	s.last = lastStatement{valid: true, group: s.cur.group, waited: waited, errCode: codeThrottled}
	if n := s.cur.prepaid.RU(); n > 0 {
		s.heldGroup, s.held = s.cur.group, n
		s.p.tokens.HoldDemand(s.heldGroup, n)
	}
	return &mysqlproto.Reply{Err: throttledError(s.cur.group)}
}

func negate(c ru.Consumption) ru.Consumption {
	var z ru.Consumption
	z.Sub(c)
	return z
}
