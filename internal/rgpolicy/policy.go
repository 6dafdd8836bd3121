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
	"math"
	"strconv"
	"sync"
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
	// TakeShare takes cons.RU() of the group's tokens, only the
	// required part of which can get the statement refused, and returns
	// the group's share as it stood then; from the session's purse when
	// it can. It records nothing (tokenclient.Client.TakeShare).
	TakeShare(ctx context.Context, p *tokenclient.Purse, group string, cons ru.Consumption, required float64, maxWait time.Duration) (tokenclient.Share, time.Duration, error)
	// Settle takes tokens of the group's (negative: gives them back), in
	// the session's purse p when it can, and records rec as consumed
	// (tokenclient.Client.Settle). ReturnPurse gives what the purse
	// holds back when the session ends.
	Settle(p *tokenclient.Purse, group string, tokens float64, rec ru.Consumption)
	ReturnPurse(p *tokenclient.Purse)
	// Budget is the group's budget verdict as rgserver last said
	// (tokenclient.Client.Budget); ok is false when none holds.
	Budget(group string) (tokenclient.BudgetVerdict, bool)
	// CountThrottled counts a statement refused with 8252, CountRefused
	// one refused otherwise before it ran, each with the RU it would have
	// cost; CountWaited the estimate of one that waited for its tokens
	// before it ran. They ride with the group's next consumption report
	// (the usage history).
	CountThrottled(group string, estimate float64)
	CountRefused(group string, estimate float64)
	CountWaited(group string, estimate float64)
	// Attribute records the chargeback of cons charged to group, in the
	// session's purse p when it can (tokenclient.Client.Attribute).
	Attribute(p *tokenclient.Purse, group string, tags []tokenclient.BilledTag, account string, cons ru.Consumption)
	// HoldDemand holds a refused statement's RU as its group's waiting
	// demand in h, for a couple of seconds at most; ReleaseDemand ends it.
	HoldDemand(h *tokenclient.DemandHold, group string, ru float64)
	ReleaseDemand(h *tokenclient.DemandHold)
	WouldAcquire(group string, cons ru.Consumption, required float64, maxWait time.Duration, onDebt bool) (time.Duration, bool)
	Group(name string) (resourcegroup.Group, bool)
	Binding(user, host string) (resourcegroup.Binding, bool)
	// CacheGeneration changes whenever what Group, Binding, HasBindings,
	// HasTagBindings, TagGroup and DigestGroup answer may have changed.
	CacheGeneration() uint64
	HasBindings(user string) bool
	// Tag bindings: HasTagBindings is asked before any comment is parsed.
	HasTagBindings() bool
	TagGroup(key, value string) (string, bool)
	// Digest bindings: DigestGroup is asked for every statement with a
	// digest, and must cost next to nothing while none is bound
	// (tokenclient.Client.DigestGroup: one atomic load);
	// HasDigestBindings says whether any is.
	DigestGroup(hash uint64) (string, bool)
	HasDigestBindings() bool
	Store() resourcegroup.Store
	Usage(now time.Time) []tokenclient.GroupUsage
	// Overview lists at most limit groups, those in use here first
	// (tokenclient.Client.Overview), for the status console.
	Overview(now time.Time, limit int) tokenclient.Overview
	// The runaway watch list, cached from rgserver.
	HasWatches() (exact, similar bool)
	MatchGroupWatch(group, text, digest string) (resourcegroup.Watch, bool)
}

// RoleChecker tells whether any of a session's enabled roles holds an
// administrator privilege (SUPER, RESOURCE_GROUP_ADMIN), which a session
// cannot read of its roles: rgproxy's service account (--admin-user)
// reads it from the grant tables, the role names passed as data. Safe
// for concurrent use.
type RoleChecker interface {
	RolesHoldAdmin(ctx context.Context, roles []string) (bool, error)
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
	// ChargebackTagKeys are the SQLCommenter tag keys whose values are
	// billed (chargeback.go), lower case, at most
	// tokenclient.ChargebackMaxKeys.
	ChargebackTagKeys []string
}

// Config configures a Policy.
type Config struct {
	// Tokens is the token client. Required.
	Tokens Tokens
	// Cost is the RU cost model. Default ru.DefaultConfig().
	Cost ru.Config
	// Roles reads the privileges of a session's enabled roles; nil = SUPER
	// granted only through a role does not count (the role rgproxy_admin
	// still does).
	Roles RoleChecker
	// Killer kills runaway statements; nil = QUERY_LIMIT ACTION=KILL is
	// refused at CREATE time.
	Killer Killer
	// Cluster gathers the cluster-wide views through rgserver
	// (tokenclient.Client); nil = they answer an error (cluster.go).
	Cluster ClusterInspector
	// Runaways keeps the runaway history through rgserver
	// (tokenclient.Client); nil = runaway_queries answers an error
	// (history.go).
	Runaways RunawayHistory
	// Usage reads the usage history rgserver keeps (tokenclient.Client);
	// nil = resource_group_usage_history answers an error (usage.go).
	Usage UsageHistory
	// Chargeback reads the chargeback history rgserver keeps
	// (tokenclient.Client); nil = resource_usage_by_tag and
	// resource_usage_by_account answer an error (billing_tables.go).
	Chargeback Chargeback
	// Instance names this proxy as the source of the watches it adds:
	// its INSTANCE (the MySQL address clients reach it at), the name the
	// runaway history and the cluster-wide views give it.
	Instance string
	// Settings are the reloadable settings.
	Settings Settings
	// Shapes is how many statement shapes (digest within a group) the
	// proxy remembers for cost estimates and statements_summary, least
	// recently used evicted. Default 10,000.
	Shapes int
	// SummaryWindow is the length of statements_summary_history's windows,
	// aligned to multiples of it since the Unix epoch. Default 30 min;
	// negative keeps no history.
	SummaryWindow time.Duration
	// SummaryWindows is how many closed windows the history keeps besides
	// the current one. Default 24.
	SummaryWindows int
	// CPU chooses where a statement's CPU time comes from; see CPUSource.
	// Default CPUAuto.
	CPU CPUSource
	// BackendAddr is the backend's host:port, to tell whether it runs on
	// this host (CPUAuto).
	BackendAddr string
	// ProcRoot is where the proc file system is mounted. Default /proc.
	ProcRoot string
	// BackendCPUs is the backend host's CPUs for CALIBRATE RESOURCE
	// (--backend-cpus); 0 = read them where the backend is co-located.
	BackendCPUs float64
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
	cluster  ClusterInspector
	history  RunawayHistory
	usage    UsageHistory
	charge   Chargeback
	roles    RoleChecker
	instance string
	settings atomic.Pointer[Settings]
	// cooldown lets one statement under a COOLDOWN watch run at a time.
	cooldown chan struct{}
	// newWatches carries the watches runaway statements ask for to Run's
	// goroutine that adds them (runaway.go); a full queue drops one.
	newWatches chan resourcegroup.Watch
	// ledger keeps the debts of sessions that ended owing (debt.go).
	ledger    ledger
	admission *admission
	gates     *gates
	shapes    *shapes
	cpu       *cpuSource
	calib     *calibrator
	metrics   *metrics
	writes    *writes
	logger    *slog.Logger
	clk       clock.Clock
	idle      time.Duration
	// unenforced: the groups whose QUERY_LIMIT this proxy cannot carry
	// out, sorted (enforcement.go).
	unenforced atomic.Pointer[[]string]
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
		return nil, fmt.Errorf("rgpolicy: cost model: %w", err)
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
	if cfg.SummaryWindow == 0 {
		cfg.SummaryWindow = defaultSummaryWindow
	}
	if cfg.SummaryWindows <= 0 {
		cfg.SummaryWindows = defaultSummaryWindows
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("rgpolicy: metrics: %w", err)
	}
	p := &Policy{
		tokens:     cfg.Tokens,
		cost:       cfg.Cost,
		killer:     cfg.Killer,
		cluster:    cfg.Cluster,
		history:    cfg.Runaways,
		usage:      cfg.Usage,
		charge:     cfg.Chargeback,
		roles:      cfg.Roles,
		instance:   cfg.Instance,
		cooldown:   make(chan struct{}, 1),
		newWatches: make(chan resourcegroup.Watch, watchQueue),
		admission:  newAdmission(cfg.Settings.MaxBackendConcurrency),
		gates:      newGates(),
		shapes:     newShapes(cfg.Shapes),
		cpu:        newCPUSource(cfg.CPU, cfg.BackendAddr, cfg.ProcRoot, cfg.Logger),
		metrics:    m,
		logger:     cfg.Logger,
		clk:        cfg.Clock,
		idle:       cfg.IdleGroupExpiry,
	}
	if p.calib, err = newCalibrator(cfg.ProcRoot, cfg.BackendCPUs, cfg.Registerer); err != nil {
		return nil, fmt.Errorf("rgpolicy: calibration metrics: %w", err)
	}
	if p.writes, err = newWrites(cfg.Writes, cfg.Binlog, cfg.Registerer); err != nil {
		return nil, fmt.Errorf("rgpolicy: write source: %w", err)
	}
	s := cfg.Settings
	p.settings.Store(&s)
	m.cpuSource(p.cpu.inForce())
	onCPU := m.cpuSource
	p.cpu.onChange.Store(&onCPU)
	m.seeGroup(resourcegroup.DefaultGroup, cfg.Clock.Now())
	p.shapes.startWindows(cfg.Clock.Now(), cfg.SummaryWindow, cfg.SummaryWindows)
	return p, nil
}

// Run forgets, until they are used again, the series of the groups idle on
// this proxy for IdleGroupExpiry, closes statements_summary_history's
// windows, and, without a Killer, keeps track of
// the KILL rules this proxy cannot carry out, and adds the watches that
// runaway statements ask for. It returns when ctx ends, once the
// goroutines it started have stopped.
func (p *Policy) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait() // Run returns only once ctx has ended: they are stopping
	if p.killer == nil {
		wg.Go(func() { p.followEnforcement(ctx) })
	}
	wg.Go(func() { p.addWatches(ctx) })
	wg.Go(func() { p.rollSummaries(ctx) })
	wg.Go(func() { p.runCalibrator(ctx) })
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
		p.chargeExpiredDebts()
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
// second look at its text (row_count: wru.go's rowCountRewrite; event,
// prepare, immediate: ddl.go's refuseEvent).
func ScanWords() []string {
	return []string{"resource", "watch", "last", "current_resource_group", "resource_groups",
		"runaway_watches", "statements_summary", "resource_group_bindings", "row_count",
		"cluster_statements_summary", "cluster_resource_group_usage", "runaway_queries",
		"event", "prepare", "immediate", "statements_summary_history", "resource_group_usage_history", "resource_group_budgets",
		"resource_usage_by_tag", "resource_usage_by_account", "binding"}
}

// Open implements mysqlproto.Policy.
func (p *Policy) Open(info mysqlproto.SessionInfo) mysqlproto.SessionPolicy {
	s := &session{p: p, user: info.User, connID: info.BackendConnID, clientHost: clientHost(info.ClientAddr)}
	s.led = stmtLedger{p: p, purse: &s.purse, last: &s.last}
	return s
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
	// clientHost is the client's address without its port: the host of
	// the session's account for chargeback when host is not known.
	clientHost string
	// acct is the account billed (account), for acctUser and acctHost.
	acct, acctUser, acctHost string
	// setGroup is the group named by SET RESOURCE GROUP, "" = none;
	// setGen is the cache generation it was last allowed under (strict
	// mode judges it again when the bindings change).
	setGroup    string
	setGen      uint64
	setSettings *Settings
	// debts are what the session owes its groups (debt.go), counted in
	// the policy's ledger among its user's open sessions' debts.
	debts []debt
	// super caches whether the session's user has SUPER (nil = unknown),
	// asked of the backend the first time it matters.
	super *bool
	// cpu reads the CPU time of the backend thread serving the session.
	cpu cpuReader

	// cur is the statement in flight, between Before and After.
	cur statement
	// guard watches the statement in flight against its QUERY_LIMIT.
	guard *runawayGuard

	// led moves the RU of the session's statements (ledger.go); last is
	// its record of the last one, written only by led.
	led  stmtLedger
	last lastStatement
	// notes are what rgproxy's own last statement noted (SHOW WARNINGS).
	notes []*resourcegroup.Error
	// seenGroup was last reported to the metrics as used, at seenAt: the
	// session tells them again only when the group changes or now and then.
	// hold is the RU of the session's last refused statement, held as
	// waiting demand of its group until the next statement (or for a
	// couple of seconds of silence); holding says it may hold something.
	hold        tokenclient.DemandHold
	holding     bool
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
	// cp is what Before read of a statement that may copy tables (ddl.go).
	cp copyState
}

// statement is what the policy keeps of the statement in flight.
type statement struct {
	// group is the statement's resource group (resolve, then a runaway
	// watch's SWITCH_GROUP); tagGroup, in strict mode, the group of a
	// bound SQLCommenter tag that is not group ("" = none): a tag binding
	// adds that group's limits and never removes the account's;
	// shapeGroup, in strict mode, likewise the group the statement's
	// digest is bound to (a digest binding), when it is neither.
	group, tagGroup, shapeGroup string
	// bill is what the statement is billed to (chargeback).
	bill    billing
	req     ru.RequestInfo
	before  ru.Consumption // the before-cost (base and up-front write bytes)
	prepaid ru.Consumption // what each leg takes before forwarding: >= before
	// legs are the statement's parts in its groups: legs[0] in group,
	// then one in tagGroup and one in shapeGroup when there are such
	// groups, each group once; nlegs says how many are set (0 for a free
	// statement).
	legs     [maxLegs]leg
	nlegs    int
	shape    shapeKey
	hasShape bool // the statement has a digest: it is estimated and summarized
	known    bool // its shape has an estimate
	// probe: the statement is the first of its unknown shape in flight in
	// this gate (session.awaitProbe).
	probe    *gate
	waited   time.Duration
	admitted bool // holds a backend concurrency slot
	cooling  bool // holds the proxy's COOLDOWN slot
	cpuStart time.Duration
	cpuOK    bool
	start    time.Time
	// short: the statement's shape is known to answer within
	// cpuMinEstimate; it is charged wall time up to cpuMinEstimate, its
	// CPU goes unread.
	short bool
	// would is what ENFORCE would have done to a statement of a group in
	// MODE WARN ("" = nothing: it would have run at once).
	would string
	// watched: a runaway watch matched the statement, which
	// rgproxy_runaway_total counted; its QUERY_LIMIT firing too does not
	// count it again.
	watched bool
	// ownSQL: one of rgproxy's own statements that the backend evaluates
	// (SHOW RESOURCE GROUP USAGE LIKE/WHERE): metered, but it repays no
	// debt, so that an administrator's statement is never refused for one.
	ownSQL bool
	// virtual: the statement reads rgproxy's information_schema tables
	// (rewritten), which a budget's REFUSE lets through: a refused user
	// can still read resource_group_budgets.
	virtual bool
}

// maxLegs: a statement's own group, a bound tag's and a bound digest's.
const maxLegs = 3

// legKind says why a statement has a leg in a group.
type legKind uint8

const (
	legOwn   legKind = iota // the statement's own group
	legTag                  // a bound tag's group (strict mode)
	legShape                // its digest's bound group (strict mode)
)

// leg is a statement's part in one of its groups: what it took from the
// group's bucket and what it holds of the group's gate.
type leg struct {
	group string
	kind  legKind
	// prepaid is what the leg took before forwarding: from the group's
	// bucket (charged), or, for a statement that ran inside a
	// transaction without its tokens, as the session's debt (onDebt).
	// counted: the debt is counted in the ledger already (runOnDebt),
	// with limit, the user's bound there.
	prepaid ru.Consumption
	charged bool
	onDebt  bool
	counted bool
	limit   float64
	// waited: the leg waited for its tokens (the usage history's
	// waited RU, counted when the statement settles).
	waited bool
	// share is this proxy's share of the group (tokenclient.Share).
	share  tokenclient.Share
	gate   *gate
	gateRU float64 // what it holds of the gate
}

// main is the statement's leg in its own group.
func (c *statement) main() *leg { return &c.legs[0] }

// lastStatement is what SHOW LAST STATEMENT RU reports.
type lastStatement struct {
	valid bool
	group string
	// tagGroup is the group of a bound tag the statement was also
	// charged to (strict mode), "" = none; shapeGroup the group its
	// digest is bound to, likewise.
	tagGroup, shapeGroup string
	cost                 ru.Consumption
	waited               time.Duration
	// errCode is the statement's error: rgproxy's (8252 refused, 8254
	// quarantined), the backend's (8253 for a runaway statement killed),
	// 0 when it succeeded.
	errCode uint16
	// estimate is what a refused statement would have been charged.
	estimate ru.Consumption
	would    string // MODE WARN: what ENFORCE would have done

	// write is how its written bytes were settled (FollowUp, wru.go).
	write *writeResult
}

// Before implements mysqlproto.SessionPolicy.
func (s *session) Before(ctx context.Context, st *mysqlproto.Statement, be mysqlproto.Backend) mysqlproto.Verdict {
	s.freshRoute()
	s.releaseHeld()
	if !s.hostKnown && !s.rt.unbound {
		if s.p.tokens.HasBindings(s.user) {
			s.learnAccount(ctx, be)
		} else {
			s.rt.unbound = true
		}
	}
	set := s.p.settings.Load()
	s.recheckSet(ctx, be, set)
	if s.notes != nil {
		if v, ok := s.showNotes(st); ok {
			return v
		}
	}
	var refs []virtualRef
	if (st.Command == mysql.COM_QUERY || st.Command == mysql.COM_STMT_PREPARE) && st.Scan.Mentions&virtualMentions != 0 {
		refs = findVirtual(st.Query, st.Mode(), func() bool { s.cpu.stale(); return inInformationSchema(ctx, be) })
		if refs != nil && st.Command == mysql.COM_STMT_PREPARE {
			// A prepared statement would keep a stale copy of the rows.
			return errReply(resourcegroup.NewNotAllowedInPrepare())
		}
	}
	var rewrite string
	ownSQL := false
	if refs == nil && (st.Command == mysql.COM_QUERY || st.Command == mysql.COM_STMT_PREPARE) {
		if st.Scan.Mentions != 0 && resourcegroup.IsAdmin(st.Query, st.Mode()) {
			v := s.admin(ctx, st, be)
			if v.Reply != nil || v.Rewrite == "" {
				return v
			}
			// An admin statement that the backend evaluates (SHOW ...
			// USAGE WHERE): metered and forwarded as a rewrite.
			rewrite, ownSQL = v.Rewrite, true
		}
		if st.Multi && st.Scan.Mentions != 0 && multiHasAdmin(st.Query, st.Mode()) {
			return errReply(errAdminInMulti)
		}
	}
	s.cur = statement{start: s.p.clk.Now(), ownSQL: ownSQL}
	if r := s.resolve(ctx, st, be, set); r != nil {
		return mysqlproto.Verdict{Reply: r}
	}
	if r := s.refuseEvent(ctx, st, be, set); r != nil {
		return mysqlproto.Verdict{Reply: r}
	}
	if f := s.p.metrics.forgets.Load(); s.cur.group != s.seenGroup || s.cur.start.Sub(s.seenAt) > 10*time.Second || f != s.seenForgets {
		s.see(s.cur.group, s.cur.start, f)
	}
	if col, ok := askedGroup(st, refs); ok {
		// The statement's group, its hint honoured, is rgproxy's to
		// answer: no tokens, so no debt nor empty bucket refuses it.
		return resultReply([]string{col}, [][]string{{s.cur.group}})
	}
	if refs != nil {
		var err error
		rewrite, err = rewriteVirtual(st.Query, st.NoBackslashEscapes, refs, s.cur.group,
			func(name string) (*vtable, error) { return s.virtualTable(ctx, name, be) })
		if err != nil {
			return errReply(err)
		}
		s.cur.virtual = true
	}
	s.learnAccountForHistory(ctx, be)
	cooldown, r := s.watch(st)
	if r != nil {
		return mysqlproto.Verdict{Reply: r}
	}
	s.cpu.open(ctx, s.p.cpu, be)
	s.writesBefore(ctx, st, be)
	s.copyBefore(ctx, st, be)
	if r := s.charge(ctx, st, set); r != nil {
		return s.abort(r)
	}
	if r := s.admit(ctx, st, set, cooldown); r != nil {
		return s.abort(r)
	}
	s.runs()
	if s.cur.req.Class != ru.ClassFree && !s.cur.short {
		s.cur.cpuStart, s.cur.cpuOK = s.cpu.start()
	} else {
		s.cpu.stale() // charged wall time: the thread's CPU goes unread
	}
	g, _ := s.group(s.cur.group)
	s.guard = s.armRunaway(g, st, s.cur.cpuStart, s.cur.cpuOK)
	return mysqlproto.Verdict{Rewrite: s.rowCountRewrite(st, rewrite)}
}

// The statement lifecycle. Once charge has run, a statement leaves Before
// one of two ways: refused, through abort, which gives back everything
// charge and admit took (tokens, gate places, the COOLDOWN and backend
// slots, its probe); or let through, after which After (or, for a session
// that ends with the statement in flight, EventClose) ends it through
// end. Steps that take something record it in s.cur and never give it
// back themselves, so that a new wait cannot leak a gate slot.

// abort ends a statement refused after charge began: what its legs took
// from their buckets is refunded, what they counted on debt is given
// back (a refusal never adds to a debt), and what it holds is released.
func (s *session) abort(r *mysqlproto.Reply) mysqlproto.Verdict {
	s.end()
	s.led.refund(&s.cur)
	for i := range s.cur.nlegs {
		if l := &s.cur.legs[i]; l.counted {
			s.p.ledger.release(s.user, l.group, l.prepaid.RU())
			l.counted = false
		}
	}
	return mysqlproto.Verdict{Reply: r}
}

// runs commits a statement that Before lets through: what its legs ran
// on debt (inside a transaction, without their tokens) becomes the
// session's debt to their groups, counted in the ledger (a COMMIT's, which
// no bound refuses, from now).
func (s *session) runs() {
	cur := &s.cur
	for i := range cur.nlegs {
		if l := &cur.legs[i]; l.onDebt {
			if !l.counted {
				s.p.ledger.owe(s.user, l.group, l.prepaid.RU())
			}
			s.addDebt(debt{group: l.group, cons: l.prepaid, required: cur.before.RU(), limit: l.limit})
		}
	}
}

// end releases what the statement in flight holds — its backend
// concurrency slot, its places in its groups' gates, the COOLDOWN slot and
// its probe — and disarms its runaway guard. It may be called more than
// once.
func (s *session) end() {
	cur := &s.cur
	if cur.admitted {
		s.p.admission.release()
		cur.admitted = false
	}
	for i := range cur.nlegs {
		if l := &cur.legs[i]; l.gate != nil {
			l.gate.release(l.gateRU)
			l.gate = nil
		}
	}
	if cur.cooling {
		<-s.p.cooldown
		cur.cooling = false
	}
	s.endProbe()
}

// After implements mysqlproto.SessionPolicy: it ends the statement,
// settles its measured cost against what charge took, and teaches the
// shape's estimate.
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
	killed := fired && s.guard.rule.Action == resourcegroup.ActionKill
	s.guard = nil
	errCode := out.ErrCode
	if killed && out.ErrCode == mysql.ER_QUERY_INTERRUPTED {
		errCode = errRunawayKilled.Code
	}
	if s.seenGroup != cur.group { // charge moved the statement to default
		s.see(cur.group, cur.start, s.p.metrics.forgets.Load())
	}
	s.led.settle(cur, s.series, &s.shapes, settlement{after: after, chargeTo: chargeTo, class: st.Class,
		errCode: errCode, ran: !out.NotForwarded, digest: digestText{b: st.Scan.Digest, cs: st.Charset, escapedDQ: st.Scan.EscapedDoubleQuote}, latency: out.BackendTime, failed: out.ErrCode != 0})
	s.end() // after settle's observe: the statements its probe wakes find its cost
}

// see tells the metrics the session used group at now and keeps its
// series; forgets is metrics.forgets as read before.
func (s *session) see(group string, now time.Time, forgets uint64) {
	s.series = s.p.metrics.seeGroup(group, now)
	s.seenGroup, s.seenAt, s.seenForgets = group, now, forgets
}

// Event implements mysqlproto.SessionPolicy.
func (s *session) Event(kind mysqlproto.EventKind, info mysqlproto.SessionInfo) {
	switch kind {
	case mysqlproto.EventChangeUser, mysqlproto.EventResetConnection:
		if info.User != s.user {
			// Another account's statements must not repay (or escape)
			// this one's debt.
			s.leaveDebts()
		}
		s.user = info.User
		s.setGroup = ""
		s.super = nil
		s.host, s.hostKnown = "", false
		s.rt.boundOK, s.rt.unbound = false, false
		s.wr = writeState{}
	case mysqlproto.EventClose:
		// A session that ends with a statement in flight (After never
		// came) releases what it holds rather than wedge its groups.
		s.end()
		s.guard.disarm()
		s.guard = nil
		s.cpu.close()
		s.p.tokens.ReturnPurse(&s.purse)
		s.releaseHeld()
		s.leaveDebts()
	}
}

// throttledError is 8252 for group: TiDB's text naming the group, then
// why (detail, which says what the statement waited for and how long, and
// what setting would let it through when nothing else can).
func throttledError(group, detail string) *mysqlproto.Error {
	msg := "Exceeded resource group quota limitation (resource group " + group + ")"
	if detail != "" {
		msg += ": " + detail
	}
	return &mysqlproto.Error{Code: resourcegroup.CodeThrottled, State: "HY000", Message: msg}
}

// refused refuses the statement with 8252 for group, the one place a
// refusal is counted (rgproxy_throttled_total, USAGE's THROTTLED). It
// records the statement as the session's last (it cost nothing, waited
// cur.waited, would have cost its prepaid), and holds its RU as waiting
// demand of the group for a while: a client refused and retrying still
// wants its statement.
func (s *session) refused(group, detail string) *mysqlproto.Reply {
	s.led.denied(group, &s.cur, true)
	s.led.recordRefused(&s.cur, resourcegroup.CodeThrottled)
	if n := s.cur.prepaid.RU(); n > 0 {
		s.p.tokens.HoldDemand(&s.hold, group, n)
		s.holding = true
	}
	return &mysqlproto.Reply{Err: throttledError(group, detail)}
}

// waitDetail says how long the statement waited of its wait budget.
func waitDetail(waited, maxWait time.Duration, inTxn bool) string {
	flag := "--max-wait"
	if inTxn {
		flag = "--max-wait-in-txn"
	}
	return fmt.Sprintf("waited %s of %s %s", fmtDuration(waited), flag, fmtDuration(maxWait))
}

// fmtDuration renders d for an error message: 1.5s, 100ms, 27.3s.
func fmtDuration(d time.Duration) string {
	switch {
	case d >= time.Second:
		return strconv.FormatFloat(math.Round(d.Seconds()*1000)/1000, 'f', -1, 64) + "s"
	case d >= time.Millisecond:
		return strconv.FormatFloat(math.Round(float64(d)/float64(time.Millisecond)*10)/10, 'f', -1, 64) + "ms"
	case d <= 0:
		return "0s"
	}
	return d.String()
}

// tokensDetail explains a refusal for want of tokens in group, naming
// which reason applies, with figures: required is the part of the
// statement's cost that can refuse it (its before-cost), estimate what it
// asked for (raised to its shape's estimate), tokens the group's bucket
// when it was refused (negative: owed); debt: what is refused is the
// session's debt of a transaction, not a statement's estimate. The
// reasons, first that applies:
//   - the estimate can never fit in the wait at RU_PER_SEC (even with a
//     full bucket): what to raise, and to how much;
//   - the group owes what its rate pays back only after the wait: how much,
//     and when it clears;
//   - it waited its wait while other statements took the tokens.
func (s *session) tokensDetail(group string, required, estimate, tokens float64, maxWait time.Duration, debt bool) string {
	estimate = max(estimate, required)
	what, whose := "the statement's estimate ", "the statement's "
	if debt {
		what, whose = "the debt of ", "the debt of "
	}
	waited := waitDetail(s.cur.waited, maxWait, false)
	g, ok := s.group(group)
	if !ok || g.RUPerSec == resourcegroup.Unlimited || g.RUPerSec == 0 {
		return fmt.Sprintf("%s for %s RU", waited, formatRU(estimate))
	}
	rate := float64(g.RUPerSec)
	capacity := rate * g.Burst.CapacitySeconds()
	most := rate*maxWait.Seconds() + capacity
	left := max(maxWait-s.cur.waited, 0).Seconds()
	owed := max(-tokens, 0)
	clears := fmtDuration(ceilDuration(owed / rate))
	switch {
	case estimate > most:
		needRate := uint64(math.Ceil(estimate / (maxWait.Seconds() + g.Burst.CapacitySeconds())))
		d := fmt.Sprintf("%s%s RU can never fit in --max-wait %s at RU_PER_SEC %d "+
			"(at most %s RU, the burst included): raise the group's RU_PER_SEC to %d or more, or --max-wait to %s or more, "+
			"or make the statement cheaper", what, formatRU(estimate), fmtDuration(maxWait), g.RUPerSec,
			formatRU(most), needRate, fmtDuration(ceilDuration((estimate-capacity)/rate)))
		if owed > 0 {
			d += fmt.Sprintf("; the group owes %s RU now, which clears in about %s", formatRU(owed), clears)
		}
		return d
	case owed > 0 && required <= rate*left && required+owed > rate*left:
		return fmt.Sprintf("the group owes %s RU and clears in about %s at its RU_PER_SEC %d; "+
			"%s%s RU cannot wait that long (%s)", formatRU(owed), clears, g.RUPerSec,
			whose, formatRU(estimate), waited)
	}
	return fmt.Sprintf("%s for %s RU at RU_PER_SEC %d", waited, formatRU(estimate), g.RUPerSec)
}

// ceilDuration is secs seconds, rounded up to the second from one second
// on, to the millisecond below: a time to wait or to raise a setting to
// is never understated.
func ceilDuration(secs float64) time.Duration {
	switch {
	case secs <= 0 || math.IsNaN(secs):
		return 0
	case secs >= 1<<33:
		return time.Duration(1<<33) * time.Second
	case secs >= 1:
		return time.Duration(math.Ceil(secs)) * time.Second
	}
	return time.Duration(math.Ceil(secs*1000)) * time.Millisecond
}

// formatRU renders an RU amount with at most 3 decimals.
func formatRU(v float64) string { return strconv.FormatFloat(math.Round(v*1000)/1000, 'f', -1, 64) }

// releaseHeld ends the demand held for the session's last refused
// statement.
func (s *session) releaseHeld() {
	if s.holding {
		s.p.tokens.ReleaseDemand(&s.hold)
		s.holding = false
	}
}
