package tokenserver

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
)

// A proxy credential speaks only for itself (docs/security.md, "What a
// proxy credential can and cannot do"). The credBook keeps, per
// credential, what bounds what it may say about the cluster:
//
//   - its consumption reports, per group, against what this leader granted
//     its proxies, plus a bounded debt and its degraded-mode allowance
//     (account);
//   - its runaway events, against a per-credential rate (the history's
//     share is runaways.go's eviction);
//   - the instance names it answers cluster views and records runaway
//     events as (an instance held by one credential cannot be spoken for
//     by another);
//   - what it took, reported and had dropped or refused, for the metrics
//     labelled credential and the console.
//
// Administrators are trusted (they may change groups anyway) and are only
// counted; with authentication off nobody is bounded.

// Bounds of what a proxy credential reports.
const (
	// debtWindow is the debt a credential's reports may run ahead of its
	// grants, in seconds of the group's RU_PER_SEC. tokenclient lets a
	// group's local bucket go negative only by post-charges (measured
	// cost beyond what a statement took before it ran) and by
	// statements run inside a transaction on their session's debt (at
	// most one second of the group's rate per session); that debt is
	// repaid out of the next grants before a new statement runs. Ten
	// seconds of the rate is ten sessions owing at once.
	debtWindow = 10.0
	// awayWindow bounds the degraded-mode allowance, in seconds: while
	// none of a credential's proxies streams tokens to this server they
	// may run on their local refill (tokenclient degraded mode: RU_PER_SEC
	// ÷ proxies each, up to the capacity), and report it when they come
	// back. A credential earns RU_PER_SEC × the time it had no stream
	// (each absence counted up to awayWindow) plus the capacity; a
	// credential new to this server (a restart, a new leader) starts
	// with one awayWindow. An outage longer than awayWindow loses the
	// rest of its report, counted as dropped.
	awayWindow = 60 * time.Second
	// countRate bounds statements and throttled statements a credential
	// reports, per second and per stream it is configured for (a proxy
	// runs far fewer); its burst is awayWindow of it.
	countRate = 100_000.0
	// eventRate and eventBurst bound the runaway events a credential
	// records (per stream it is configured for): tokenclient sends at
	// most 500 per 100 ms and queues 4,096.
	eventRate  = 1000.0
	eventBurst = 5000.0
	// instanceHold is how long an instance name stays bound to the
	// credential that last used it.
	instanceHold = 10 * time.Minute
)

// Errors of the credential book.
var (
	// ErrInstanceTaken: the instance is bound to another credential.
	ErrInstanceTaken = errors.New("tokenserver: instance bound to another credential")
)

// What rgserver_credential_dropped_total{what} counts.
const (
	droppedRU        = "ru"
	droppedStmts     = "statements"
	droppedThrottled = "throttled"
	droppedRows      = "cluster_view_rows"
)

// Reasons of rgserver_credential_refused_total{reason}.
const (
	refusedInstance     = "instance_taken"
	refusedUnknownGroup = "unknown_group"
	refusedEventRate    = "event_rate"
)

// rate is a token bucket of counts.
type rate struct {
	tokens float64
	last   time.Time
}

// take takes up to n at now from a bucket filling at perSec up to burst
// (a new bucket starts full) and returns how many it took.
func (r *rate) take(n, perSec, burst float64, now time.Time) float64 {
	if r.last.IsZero() {
		r.tokens = burst
	} else if el := now.Sub(r.last).Seconds(); el > 0 {
		r.tokens = min(r.tokens+el*perSec, burst)
	}
	r.last = now
	got := min(max(n, 0), max(r.tokens, 0))
	r.tokens -= got
	return got
}

// account is what a credential may still report in one group.
type account struct {
	// balance is what was granted (and allowed for degraded mode) less
	// what was reported, in RU; reports may take it down to −debt.
	balance float64
	// awaySeen is the credential's away seconds already turned into
	// allowance.
	awaySeen float64
	// statements are the statements reported (kept), for the bound of
	// the cluster views' execution counts.
	statements float64
}

// credEntry is one credential's book.
type credEntry struct {
	name string
	// streams are its open AcquireTokens streams; awayFrom is when the
	// last one ended (zero while one is open); away sums its absences in
	// seconds, each at most awayWindow.
	streams  int
	awayFrom time.Time
	away     float64
	accounts map[string]*account
	stmts    rate
	thr      rate
	events   rate
	// refusedStmts bounds the statements reported refused other than by
	// 8252 (the usage history's refused).
	refusedStmts rate
	// Totals for the console.
	granted, reported, dropped float64
	refused                    float64
	// cGranted and cReported are its series of the two counters every
	// grant moves (looked up once, not per grant).
	cGranted, cReported prometheus.Counter
}

// instanceOwner is the credential an instance name is bound to.
type instanceOwner struct {
	cred string
	last time.Time
	// live counts the Inspect streams answering as it.
	live int
}

// credBook is the server's per-credential book.
type credBook struct {
	mu        sync.Mutex
	creds     map[string]*credEntry
	instances map[string]*instanceOwner

	granted  *prometheus.CounterVec
	reported *prometheus.CounterVec
	dropped  *prometheus.CounterVec
	refused  *prometheus.CounterVec
}

func newCredBook() *credBook {
	return &credBook{creds: map[string]*credEntry{}, instances: map[string]*instanceOwner{},
		granted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgserver_credential_granted_ru_total",
			Help: "Tokens (RU) the leader granted to the proxies of each credential, all groups.",
		}, []string{"credential"}),
		reported: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgserver_credential_reported_ru_total",
			Help: "RU the proxies of each credential reported consumed and rgserver counted (in rgserver_ru_consumed_total), all groups.",
		}, []string{"credential"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgserver_credential_dropped_total",
			Help: "What rgserver did not count of what a credential's proxies sent, beyond its bounds (see docs/security.md): RU (ru), statements and throttled statements (throttled) of consumption reports, cluster-view rows (cluster_view_rows).",
		}, []string{"credential", "what"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgserver_credential_refused_total",
			Help: "Calls and events of a credential refused: instance_taken (it named an instance bound to another credential), unknown_group (runaway events of groups that do not exist), event_rate (runaway events beyond its rate).",
		}, []string{"credential", "reason"}),
	}
}

func (b *credBook) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{b.granted, b.reported, b.dropped, b.refused} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// label is a principal's credential label: "" (authentication off) shows
// as "anonymous".
func label(p Principal) string {
	if p.Name == "" {
		return "anonymous"
	}
	return p.Name
}

// bounded reports whether p's reports are bounded: proxy credentials.
func bounded(p Principal) bool { return p.Role == RoleProxy }

// entry returns p's entry, made at now if new. Called with mu held.
func (b *credBook) entry(p Principal, now time.Time) *credEntry {
	n := label(p)
	e := b.creds[n]
	if e == nil {
		// New to this server: its proxies may have run degraded before.
		e = &credEntry{name: n, accounts: map[string]*account{}, away: awayWindow.Seconds(), awayFrom: now}
		b.creds[n] = e
		// Its series exist from its first call, at 0, so that rate()
		// sees the first drop.
		e.cGranted, e.cReported = b.granted.WithLabelValues(n), b.reported.WithLabelValues(n)
		for _, w := range []string{droppedRU, droppedStmts, droppedThrottled, droppedRows} {
			b.dropped.WithLabelValues(n, w)
		}
		for _, r := range []string{refusedInstance, refusedUnknownGroup, refusedEventRate} {
			b.refused.WithLabelValues(n, r)
		}
	}
	return e
}

// streamOpened and streamClosed follow p's AcquireTokens streams, for the
// degraded-mode allowance.
func (b *credBook) streamOpened(p Principal, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entry(p, now)
	if e.streams == 0 && !e.awayFrom.IsZero() {
		e.away += min(max(now.Sub(e.awayFrom).Seconds(), 0), awayWindow.Seconds())
		e.awayFrom = time.Time{}
	}
	e.streams++
}

func (b *credBook) streamClosed(p Principal, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entry(p, now)
	if e.streams--; e.streams <= 0 {
		e.streams, e.awayFrom = 0, now
	}
}

// newTerm starts a leader's term: what an earlier leader granted is not
// known here, so every credential gets one awayWindow of allowance again.
func (b *credBook) newTerm() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range b.creds {
		e.away += awayWindow.Seconds()
	}
}

// forget drops what the book holds of credentials no longer configured
// (their streams are being ended) and frees their instance names.
func (b *credBook) forget(names map[string]bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for n := range names {
		delete(b.creds, n)
	}
	for in, o := range b.instances {
		if names[o.cred] {
			delete(b.instances, in)
		}
	}
}

// holdsLocked reports whether group exists as far as the leader knows:
// its allocator holds it, or it is `default`, which always exists.
// Called with s.mu held.
func (s *Server) holdsLocked(group string) bool {
	return group == resourcegroup.DefaultGroup || s.alloc.Group(group) != nil
}

// ForgetCredentials drops what the server holds of credentials a reload
// revoked (their streams are being ended): their book, and the instance
// names bound to them, which another credential may then take.
func (s *Server) ForgetCredentials(names []string) {
	if len(names) == 0 {
		return
	}
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	s.creds.forget(m)
}

// grant adds tokens granted to p's proxies in group.
func (b *credBook) grant(p Principal, group string, tokens float64, now time.Time) {
	b.settle(p, group, tokens, bound{unlimited: true}, ru.Consumption{}, 0, now)
}

// settle records, in one step, tokens granted to p's proxies in group
// and the consumption they reported with the request (report).
func (b *credBook) settle(p Principal, group string, tokens float64, gb bound, u ru.Consumption, throttled float64, now time.Time) (ru.Consumption, float64) {
	b.mu.Lock()
	e := b.entry(p, now)
	if tokens > 0 {
		e.granted += tokens
		e.cGranted.Add(tokens)
		if bounded(p) {
			e.account(group).balance += tokens
		}
	}
	return b.reportLocked(e, p, group, gb, u, throttled, now)
}

func (e *credEntry) account(group string) *account {
	a := e.accounts[group]
	if a == nil {
		a = &account{}
		e.accounts[group] = a
	}
	return a
}

// bound is what one group allows a report: its RU_PER_SEC and capacity;
// unlimited groups (UNLIMITED, MODE WARN/OFF) have no rate to bound RU by.
type bound struct {
	ruPerSec, capacity float64
	unlimited          bool
}

func boundOf(s Settings) bound {
	return bound{ruPerSec: float64(s.RUPerSec), capacity: s.Capacity(), unlimited: s.Unlimited()}
}

// report bounds a consumption p's proxies reported in group at now and
// returns what counts; what does not is counted dropped.
func (b *credBook) report(p Principal, group string, gb bound, u ru.Consumption, throttled float64, now time.Time) (ru.Consumption, float64) {
	b.mu.Lock()
	return b.reportLocked(b.entry(p, now), p, group, gb, u, throttled, now)
}

// reportLocked is report with mu held; it unlocks mu.
func (b *credBook) reportLocked(e *credEntry, p Principal, group string, gb bound, u ru.Consumption, throttled float64, now time.Time) (ru.Consumption, float64) {
	if u == (ru.Consumption{}) && throttled == 0 {
		b.mu.Unlock()
		return u, throttled
	}
	var dRU, dStmts, dThr float64
	if bounded(p) {
		a := e.account(group)
		if gap := min(e.away-a.awaySeen, awayWindow.Seconds()); gap > 0 && !gb.unlimited {
			a.balance += gb.ruPerSec*gap + gb.capacity
		}
		a.awaySeen = e.away
		if total := u.RU(); total > 0 && !gb.unlimited {
			allowed := max(a.balance+debtWindow*gb.ruPerSec, 0)
			if total > allowed {
				f := allowed / total
				dRU = total - allowed
				u = ru.Consumption{RRU: u.RRU * f, WRU: u.WRU * f, ReadBytes: math.Floor(u.ReadBytes * f),
					WriteBytes: math.Floor(u.WriteBytes * f), BackendSeconds: u.BackendSeconds * f, Statements: u.Statements,
					CPUSeconds: u.CPUSeconds * f}
			}
			a.balance -= u.RU()
		}
		cr := countRate * float64(max(p.MaxStreams, 1))
		burst := cr * awayWindow.Seconds()
		kept := math.Floor(e.stmts.take(u.Statements, cr, burst, now))
		dStmts, u.Statements = u.Statements-kept, kept
		keptThr := math.Floor(e.thr.take(throttled, cr, burst, now))
		dThr, throttled = throttled-keptThr, keptThr
		a.statements += u.Statements
	}
	e.reported += u.RU()
	e.dropped += dRU
	if r := u.RU(); r > 0 {
		e.cReported.Add(r)
	}
	b.mu.Unlock()
	if dRU == 0 && dStmts == 0 && dThr == 0 {
		return u, throttled
	}
	l := label(p)
	for _, d := range []struct {
		what string
		n    float64
	}{{droppedRU, dRU}, {droppedStmts, dStmts}, {droppedThrottled, dThr}} {
		if d.n > 0 {
			b.dropped.WithLabelValues(l, d.what).Add(d.n)
		}
	}
	return u, throttled
}

// refusedCount bounds the statements p's proxies report refused other
// than by 8252 (a budget's REFUSE) by a count bucket like throttled's;
// it returns how many count. Administrators are not bounded.
func (b *credBook) refusedCount(p Principal, n float64, now time.Time) float64 {
	if !(n > 0) || !bounded(p) {
		return n
	}
	cr := countRate * float64(max(p.MaxStreams, 1))
	b.mu.Lock()
	defer b.mu.Unlock()
	return math.Floor(b.entry(p, now).refusedStmts.take(n, cr, cr*awayWindow.Seconds(), now))
}

// statementsOf is what p's proxies reported of group's statements on
// this server, plus the degraded-mode allowance of counts: the most a
// cluster view's row of theirs may claim as executions.
func (b *credBook) statementsOf(p Principal, group string) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n float64
	if e := b.creds[label(p)]; e != nil {
		if a := e.accounts[group]; a != nil {
			n = a.statements
		}
	}
	return n + countRate*float64(max(p.MaxStreams, 1))*awayWindow.Seconds()
}

// events takes n runaway events of p at now and returns how many it may
// record.
func (b *credBook) events(p Principal, n int, now time.Time) int {
	if !bounded(p) {
		return n
	}
	b.mu.Lock()
	e := b.entry(p, now)
	f := float64(max(p.MaxStreams, 1))
	got := int(e.events.take(float64(n), eventRate*f, eventBurst*f, now))
	e.refused += float64(n - got)
	b.mu.Unlock()
	if n > got {
		b.refused.WithLabelValues(label(p), refusedEventRate).Add(float64(n - got))
	}
	return got
}

// refuse counts a refusal of p.
func (b *credBook) refuse(p Principal, reason string, n float64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	if e := b.creds[label(p)]; e != nil {
		e.refused += n
	}
	b.mu.Unlock()
	b.refused.WithLabelValues(label(p), reason).Add(n)
}

// drop counts n dropped of what.
func (b *credBook) drop(p Principal, what string, n float64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	if e := b.creds[label(p)]; e != nil && what == droppedRU {
		e.dropped += n
	}
	b.mu.Unlock()
	b.dropped.WithLabelValues(label(p), what).Add(n)
}

// claimInstance binds instance to p at now. A proxy credential may not
// name an instance another credential used less than instanceHold ago
// (ErrInstanceTaken), and holds at most MaxStreams + 1 instances (a new
// one frees its least recently used). An administrator takes any name
// over; with authentication off nothing is bound.
func (b *credBook) claimInstance(p Principal, instance string, now time.Time) error {
	_, err := b.holdInstance(p, instance, now, false)
	return err
}

// holdInstance is claimInstance for an Inspect stream, which holds the
// name until release (at the time it is given), however long it lives.
func (b *credBook) holdInstance(p Principal, instance string, now time.Time, live bool) (release func(time.Time), err error) {
	if p.Name == "" {
		return func(time.Time) {}, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	o := b.instances[instance]
	if o != nil && o.cred != p.Name && p.Role != RoleAdmin && (o.live > 0 || now.Sub(o.last) < instanceHold) {
		return nil, fmt.Errorf("%w: instance %q is bound to credential %q; a proxy credential answers and records only as its own instances", ErrInstanceTaken, instance, o.cred)
	}
	if o == nil || o.cred != p.Name {
		o = b.bindLocked(p, instance, now)
	}
	o.last = now
	if !live {
		return func(time.Time) {}, nil
	}
	o.live++
	return func(at time.Time) {
		b.mu.Lock()
		defer b.mu.Unlock()
		o.live--
		o.last = at
	}, nil
}

// bindLocked binds instance to p. Called with mu held.
func (b *credBook) bindLocked(p Principal, instance string, now time.Time) *instanceOwner {
	if p.Role == RoleProxy {
		var mine []string
		for in, o := range b.instances {
			if o.cred == p.Name {
				mine = append(mine, in)
			}
		}
		if len(mine) >= p.MaxStreams+1 {
			slices.SortFunc(mine, func(x, y string) int {
				// Live names last, then least recently used first.
				ox, oy := b.instances[x], b.instances[y]
				if (ox.live > 0) != (oy.live > 0) {
					if ox.live > 0 {
						return 1
					}
					return -1
				}
				return ox.last.Compare(oy.last)
			})
			delete(b.instances, mine[0])
		}
	}
	// Bound the map: names unused for instanceHold go.
	if len(b.instances) > 4096 {
		for in, o := range b.instances {
			if o.live == 0 && now.Sub(o.last) >= instanceHold {
				delete(b.instances, in)
			}
		}
	}
	o := &instanceOwner{cred: p.Name, last: now}
	b.instances[instance] = o
	return o
}

// CredentialOverview is what one credential took, reported and had
// dropped or refused, for the console.
type CredentialOverview struct {
	Name string
	// Streams is its open AcquireTokens streams on this replica.
	Streams int
	// GrantedRU, ReportedRU and DroppedRU are tokens granted, RU reported
	// and counted, RU reported beyond its bound.
	GrantedRU, ReportedRU, DroppedRU float64
	// Refused counts its refused runaway events and calls.
	Refused float64
}

// credentials lists the book, by name.
func (b *credBook) credentials() []CredentialOverview {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]CredentialOverview, 0, len(b.creds))
	for _, e := range b.creds {
		out = append(out, CredentialOverview{Name: e.name, Streams: e.streams, GrantedRU: e.granted,
			ReportedRU: e.reported, DroppedRU: e.dropped, Refused: e.refused})
	}
	slices.SortFunc(out, func(x, y CredentialOverview) int {
		switch {
		case x.Name < y.Name:
			return -1
		case x.Name > y.Name:
			return 1
		}
		return 0
	})
	return out
}
