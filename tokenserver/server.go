// Package tokenserver is rgserver's core: one global token bucket per
// resource group shared by every proxy (Allocator), group settings and user
// bindings in etcd (EtcdStore), leader election among replicas, and the gRPC
// services of tokenpb (ResourceGroupService, TokenService, InspectService).
package tokenserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pingcap/failpoint"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// ErrNotLeader is returned by leader-only operations on a follower, and by
// fenced writes after leadership was lost.
var ErrNotLeader = errors.New("tokenserver: not the leader")

// Defaults of Config.
const (
	DefaultElectionTTL     = 3 * time.Second
	DefaultPersistInterval = 5 * time.Second
)

// How long the leader's chores and the loops that start over may take or
// wait. Each bound keeps a stalled etcd from holding up what comes next.
const (
	// electionRetryWait is the pause before campaigning again after an
	// election error: short beside ElectionTTL, long enough not to spin
	// on an etcd that refuses.
	electionRetryWait = time.Second
	// settingsRetryWait is the pause before following /rg/settings/ again
	// after its watch ended: proxies wait on the settings, so it is short.
	settingsRetryWait = 500 * time.Millisecond
	// resignTimeout bounds giving up a leadership this replica could not
	// take up; the lease's TTL frees the key anyway if it runs out.
	resignTimeout = 2 * time.Second
	// etcdProbeTimeout bounds one small etcd request on the election's
	// path (revoking a dead leader's lease, probing for an orphaned
	// leader, reading a lease for the log): a second is many round trips
	// to a healthy etcd, and the caller tries again or decides without it.
	etcdProbeTimeout = time.Second
	// leaderChoreTimeout bounds each of a new leader's one-off chores
	// (loading the runaway history, moving old bindings): large data may
	// take a while, but granting must not wait on a stalled etcd forever;
	// the next term tries again.
	leaderChoreTimeout = 30 * time.Second
	// handOverTimeout bounds saving the buckets when leadership is handed
	// over: what is not saved by then is lost to at most one persist
	// interval of drift.
	handOverTimeout = 3 * time.Second
	// persistRoundMax bounds one persistence round (the interval, if
	// shorter): a round that cannot finish is tried again next interval.
	persistRoundMax = 2 * time.Second
	// minExpiryTick and minRenewTick floor the expiry and lease-renewal
	// tickers, which follow ClientExpiry/4 and ElectionTTL/6, so that tiny
	// test settings do not spin.
	minExpiryTick = time.Second
	minRenewTick  = 100 * time.Millisecond
)

// Config configures a Server.
type Config struct {
	// Alloc tunes the token allocator (target period 5 s, client expiry 60 s).
	Alloc AllocConfig
	// AdvertiseAddr is the gRPC address proxies use to reach this replica;
	// followers send it to proxies as the leader's address. Required for
	// replicas; default "".
	AdvertiseAddr string
	// ElectionTTL is the leader's etcd session TTL: a dead leader is replaced
	// about this long after it stops. Rounded up to whole seconds; default 3 s.
	ElectionTTL time.Duration
	// PersistInterval is how often the leader saves bucket levels to etcd;
	// default 5 s.
	PersistInterval time.Duration
	// CapabilityWindow is how long a new leader waits, from the start of
	// its term, before it judges whether every live proxy can carry out a
	// new QUERY_LIMIT ACTION = KILL (capabilities.go). 0 =
	// DefaultCapabilityWindow; negative = no wait.
	CapabilityWindow time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Logger receives the server's logs; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the server's metrics; nil = none.
	Registerer prometheus.Registerer
	// RunawayRetention is how long the runaway history keeps a row after
	// its last event; default 7 days.
	RunawayRetention time.Duration
	// Auth authenticates callers; the gRPC server must run its
	// Interceptors. nil = authentication off (every caller an anonymous
	// administrator).
	Auth *Authenticator
	// BudgetLocation is the time zone budgets' windows align to
	// (resourcegroup.BudgetWindow; rgserver's --budget-time-zone); nil =
	// UTC. Every replica must be given the same one.
	BudgetLocation *time.Location
	// BudgetDayLength compresses budgets' calendar for tests and soak
	// runs (resourcegroup.BudgetCalendar; rgserver's --budget-day-length):
	// 0 or 24 h = real days in BudgetLocation.
	BudgetDayLength time.Duration
	// MaxDigestBindings bounds the digest bindings the store keeps
	// (rgserver's --max-digest-bindings); 0 =
	// resourcegroup.MaxDigestBindings.
	MaxDigestBindings int
	// ServiceLimit is the service limit in RU/s while etcd holds none
	// set by SQL (rgserver's --service-limit); 0 = none.
	ServiceLimit uint64
}

// Server implements tokenpb's ResourceGroupService and TokenService over etcd.
type Server struct {
	pb.UnimplementedResourceGroupServiceServer
	pb.UnimplementedTokenServiceServer

	cli   *clientv3.Client
	store *EtcdStore
	cfg   Config
	log   *slog.Logger
	m     *metrics

	// mu guards alloc and the fence.
	mu    sync.Mutex
	alloc *Allocator
	// leaderKey and leaderRev fence leader-only writes; empty when not leader.
	leaderKey string
	leaderRev int64

	leader     atomic.Bool
	leaderAddr atomic.Pointer[string]
	// orphan: the leader's etcd session lapsed while etcd could not be
	// reached; it grants from memory until etcd answers (see lead).
	orphan atomic.Bool
	// health is what the server last saw of etcd (health.go).
	health atomic.Pointer[etcdHealth]
	// synced is closed once the settings have been loaded.
	synced   chan struct{}
	syncOnce sync.Once

	auth *Authenticator
	// proxies binds proxy ids to credentials (proxies.go).
	proxies *proxyRegistry
	// misses remembers groups etcd said do not exist (tokens.go).
	misses *missCache
	// inspect holds the proxies' Inspect streams (inspect.go).
	inspect *inspectHub
	// caps holds what the proxies streaming tokens here can enforce
	// (capabilities.go); leaderSince is when this term began (nil when
	// not leader).
	caps        *capsRegistry
	leaderSince atomic.Pointer[time.Time]
	// runaways is the runaway history (runaways.go).
	runaways *runawayHistory
	// usage is the usage history (usage.go).
	usage *usageHistory
	// budgets is the budget book (budgets.go), guarded by mu; pushHub
	// wakes the token streams when a verdict changes or proxies are to
	// ask again; budgetActions counts the triggers crossed
	// (budget_service.go).
	budgets       *budgetBook
	pushHub       *pushHub
	budgetActions *prometheus.CounterVec
	// chargeAdmit bounds the chargeback's values per group, key and hour;
	// chargeDropped counts the entries dropped (chargeback.go). Guarded by
	// mu.
	chargeAdmit   chargeAdmit
	chargeDropped prometheus.Counter
	// creds is what each credential took, reported and may say
	// (credentials.go).
	creds *credBook
	// openStreams counts the AcquireTokens and settings streams open on this
	// replica, for the console (Overview).
	openStreams [numKinds]atomic.Int64
	// scrapes is what a /metrics scrape keeps for the next (metrics.go).
	scrapes scrapeCache
	// svc is the service limit as etcd and the flag say (guarded by mu;
	// servicelimit_service.go).
	svc svcState
}

// New returns a server over an etcd client. Call Run to load settings and
// take part in leader election, and Register to serve gRPC.
func New(cli *clientv3.Client, cfg Config) (*Server, error) {
	if cfg.ElectionTTL <= 0 {
		cfg.ElectionTTL = DefaultElectionTTL
	}
	if cfg.PersistInterval <= 0 {
		cfg.PersistInterval = DefaultPersistInterval
	}
	if cfg.CapabilityWindow == 0 {
		cfg.CapabilityWindow = DefaultCapabilityWindow
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.BudgetLocation == nil {
		cfg.BudgetLocation = time.UTC
	}
	if cfg.Auth == nil {
		a, err := NewAuthenticator(AuthConfig{})
		if err != nil {
			return nil, err
		}
		cfg.Auth = a
	}
	s := &Server{
		cli:      cli,
		store:    &EtcdStore{cli: cli, now: cfg.Now, maxDigests: cfg.MaxDigestBindings},
		cfg:      cfg,
		log:      cfg.Logger,
		m:        newMetrics(),
		alloc:    NewAllocator(cfg.Alloc),
		synced:   make(chan struct{}),
		auth:     cfg.Auth,
		proxies:  newProxyRegistry(cfg.Alloc.withDefaults().ClientExpiry),
		misses:   newMissCache(),
		inspect:  newInspectHub(clock.Real{}),
		caps:     newCapsRegistry(),
		runaways: newRunawayHistory(cfg.RunawayRetention),
		usage:    newUsageHistory(),
		creds:    newCredBook(),
		budgets:  newBudgetBook(resourcegroup.BudgetCalendar{Loc: cfg.BudgetLocation, DayLength: cfg.BudgetDayLength}),
		pushHub:  newPushHub(),
		budgetActions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgserver_budget_actions_total",
			Help: "Budget triggers crossed, by the budget's period and the trigger's action (notify, throttle, refuse); counted for MODE WARN groups too, which only report them.",
		}, []string{"resource_group", "period", "action"}),
		chargeDropped: newChargeDropped(),
	}
	s.alloc.SetServiceLimit(float64(cfg.ServiceLimit), cfg.Now())
	if cfg.ServiceLimit > 0 {
		s.log.Info("service limit from --service-limit, until SQL stores one", "ru_per_sec", cfg.ServiceLimit)
	}
	if cfg.Registerer != nil {
		if err := s.m.register(cfg.Registerer, s); err != nil {
			return nil, fmt.Errorf("tokenserver: register metrics: %w", err)
		}
		if err := s.auth.Register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("tokenserver: register metrics: %w", err)
		}
		if err := s.inspect.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("tokenserver: register metrics: %w", err)
		}
		if err := s.runaways.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("tokenserver: register metrics: %w", err)
		}
		if err := s.usage.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("tokenserver: register metrics: %w", err)
		}
		if err := cfg.Registerer.Register(s.chargeDropped); err != nil {
			return nil, fmt.Errorf("tokenserver: register metrics: %w", err)
		}
		if err := s.creds.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("tokenserver: register metrics: %w", err)
		}
		for _, c := range append([]prometheus.Collector{s.budgetActions, newBudgetCollector(s)}, s.serviceLimitCollectors()...) {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("tokenserver: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Insecure reports whether authentication is off: every caller is an
// administrator.
func (s *Server) Insecure() bool { return s.auth.Open() }

// BudgetLocation returns the time zone budgets' windows align to
// (Config.BudgetLocation).
func (s *Server) BudgetLocation() *time.Location { return s.cfg.BudgetLocation }

// Store returns the server's etcd-backed resourcegroup.Store.
func (s *Server) Store() *EtcdStore { return s.store }

// Register adds the services to a gRPC server.
func (s *Server) Register(g *grpc.Server) {
	pb.RegisterResourceGroupServiceServer(g, s)
	pb.RegisterTokenServiceServer(g, s)
	pb.RegisterInspectServiceServer(g, inspectService{s: s})
	pb.RegisterRunawayServiceServer(g, runawayService{s: s})
	pb.RegisterUsageServiceServer(g, usageService{s: s})
}

func (s *Server) now() time.Time { return s.cfg.Now() }

// IsLeader reports whether this replica is the leader now.
func (s *Server) IsLeader() bool { return s.leader.Load() }

// LeaderAddr returns the leader's advertised address, "" if unknown.
func (s *Server) LeaderAddr() string {
	if p := s.leaderAddr.Load(); p != nil {
		return *p
	}
	return ""
}

// Ready reports whether the server can serve: settings loaded, and it is the
// leader or knows who is.
func (s *Server) Ready() bool {
	select {
	case <-s.synced:
	default:
		return false
	}
	return s.IsLeader() || s.LeaderAddr() != ""
}

// Run loads the settings, keeps them in sync and campaigns for leadership
// until ctx ends. On the way out a leader persists its buckets and resigns.
func (s *Server) Run(ctx context.Context) error {
	if err := s.store.EnsureDefault(ctx); err != nil {
		return err
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		s.syncSettings(ctx)
	}()
	go func() {
		defer wg.Done()
		s.monitorEtcd(ctx)
	}()
	select {
	case <-s.synced:
	case <-ctx.Done():
		wg.Wait()
		return nil
	}
	for ctx.Err() == nil {
		if err := s.campaign(ctx); err != nil && ctx.Err() == nil {
			failpoint.InjectCall("electionRetry", err)
			s.log.Warn("leader election", "err", err)
			select {
			case <-time.After(electionRetryWait):
			case <-ctx.Done():
			}
		}
	}
	wg.Wait()
	return nil
}

// campaign runs one election session: wait to become leader (observing the
// current leader meanwhile), then lead until the session or ctx ends.
func (s *Server) campaign(ctx context.Context) error {
	ttl := int((s.cfg.ElectionTTL + time.Second - 1) / time.Second)
	sess, err := concurrency.NewSession(s.cli, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("%w: election session: %w", ErrEtcd, err)
	}
	defer sess.Close()
	el := concurrency.NewElection(sess, keyElection)

	// The goroutines below end with octx or cctx, cancelled on return;
	// campaign waits for them (deferred first, so it runs last).
	var wg sync.WaitGroup
	defer wg.Wait()
	octx, ocancel := context.WithCancel(ctx)
	defer ocancel()
	observed := make(chan leaderSeen, 1)
	wg.Go(func() {
		defer close(observed)
		for resp := range el.Observe(octx) {
			if len(resp.Kvs) > 0 {
				addr := string(resp.Kvs[0].Value)
				s.leaderAddr.Store(&addr)
				select {
				case <-observed: // keep only the newest
				default:
				}
				observed <- leaderSeen{addr: addr, lease: clientv3.LeaseID(resp.Kvs[0].Lease)}
			}
		}
	})
	wg.Go(func() { s.probeLeaderLiveness(octx, observed) })

	// A campaign outlives neither ctx nor the session: if the lease is lost
	// while waiting, start over with a new session.
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	wg.Go(func() {
		select {
		case <-sess.Done():
			ccancel()
		case <-cctx.Done():
		}
	})
	failpoint.Inject("campaignError", func() {
		failpoint.Return(fmt.Errorf("%w: campaign: %w", ErrEtcd, errFailpoint))
	})
	if err := el.Campaign(cctx, s.cfg.AdvertiseAddr); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("%w: campaign: %w", ErrEtcd, err)
	}
	if err := s.becomeLeader(ctx, el.Key(), el.Rev()); err != nil {
		s.stepDown()
		rctx, cancel := context.WithTimeout(context.Background(), resignTimeout)
		defer cancel()
		_ = el.Resign(rctx)
		return err
	}
	s.lead(ctx, sess, el)
	return nil
}

// leaderSeen is the current leader as observed on the election key.
type leaderSeen struct {
	addr  string
	lease clientv3.LeaseID
}

// Dead-leader detection: a follower probes the leader's address, and when
// connections are refused this many times in a row, this often apart, the
// leader's process is gone.
const (
	deadLeaderProbes   = 3
	deadLeaderInterval = 200 * time.Millisecond
)

// probeLeaderLiveness revokes the lease of a leader whose process is gone,
// so that a replica takes over at once instead of when the lease expires
// (up to the election TTL, plus etcd's extension when etcd's own leader
// died with it). Only a refused connection counts: a timeout may be a slow
// or partitioned leader, which the lease handles. A revoked leader that is
// somehow alive loses its session and steps down, and its writes are
// fenced on the election key's revision.
func (s *Server) probeLeaderLiveness(ctx context.Context, observed <-chan leaderSeen) {
	var cur leaderSeen
	refused := 0
	tick := time.NewTicker(deadLeaderInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case l, ok := <-observed:
			if !ok {
				return
			}
			cur, refused = l, 0
			continue
		case <-tick.C:
		}
		if cur.addr == "" || cur.addr == s.cfg.AdvertiseAddr || s.IsLeader() {
			refused = 0
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, deadLeaderInterval)
		conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", cur.addr)
		cancel()
		if err == nil {
			conn.Close()
			refused = 0
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			refused = 0
			continue
		}
		if refused++; refused < deadLeaderProbes {
			continue
		}
		s.log.Warn("leader refuses connections: revoking its lease", "leader", cur.addr)
		rctx, cancel := context.WithTimeout(ctx, etcdProbeTimeout)
		_, err = s.cli.Revoke(rctx, cur.lease)
		cancel()
		if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// etcd may be electing its own leader (it may have died with
			// ours): try again at the next tick.
			s.log.Debug("revoke dead leader's lease", "err", err)
			continue
		}
		cur, refused = leaderSeen{}, 0
	}
}

// becomeLeader restores the persisted bucket levels and starts serving tokens.
func (s *Server) becomeLeader(ctx context.Context, key string, rev int64) error {
	resp, err := s.cli.Get(ctx, keyStates, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("%w: load bucket states: %w", ErrEtcd, err)
	}
	states := make(map[string]BucketState, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var st BucketState
		if err := json.Unmarshal(kv.Value, &st); err != nil {
			s.log.Warn("bad bucket state; starting full", "key", string(kv.Key), "err", err)
			continue
		}
		states[strings.TrimPrefix(string(kv.Key), keyStates)] = st
	}
	resp = nil
	// The runaway history of earlier terms; bounded, like the chores below.
	lctx, lcancel := context.WithTimeout(ctx, leaderChoreTimeout)
	if err := s.loadRunaways(clientv3.WithRequireLeader(lctx), rev); err != nil {
		s.log.Warn("loading the runaway history", "err", err)
	}
	lcancel()
	// The new allocator is built once per term, under mu: no grant is
	// served until leader is set below, only scrapes wait.
	now := s.now()
	s.mu.Lock()
	// A new term starts with no slots: proxies reconnect and say who they are.
	s.alloc = s.freshAllocator(now)
	for name, st := range states {
		s.alloc.Restore(name, st, now)
	}
	s.leaderKey, s.leaderRev = key, rev
	// The usage history starts empty; lead loads the earlier terms' in
	// the background (usage_store.go).
	s.usage.mu.Lock()
	s.usage.newTerm(now)
	s.usage.mu.Unlock()
	// The budgets start over too: the history seeds them once loaded.
	s.newTermBudgetsLocked(now)
	s.mu.Unlock()
	addr := s.cfg.AdvertiseAddr
	s.leaderAddr.Store(&addr)
	s.leaderSince.Store(&now)
	// What an earlier leader granted is not known here (credentials.go).
	s.creds.newTerm()
	s.leader.Store(true)
	s.log.Info("became leader", "addr", addr, "election_rev", rev, "states", len(states))
	// Bindings an earlier version kept per user name move to their account.
	// Bounded, so a stalled etcd does not keep the new leader from its
	// chores; the next leader (or this one's next term) tries again.
	mctx, cancel := context.WithTimeout(ctx, leaderChoreTimeout)
	n, err := s.store.migrateBindings(clientv3.WithRequireLeader(mctx), key, rev)
	cancel()
	if err != nil {
		s.log.Warn("moving per-user bindings to per-account keys", "moved", n, "err", err)
	} else if n > 0 {
		s.log.Info("moved per-user bindings to per-account keys", "bindings", n)
	}
	return nil
}

// freshAllocator copies the current settings into an allocator with full
// buckets and no slots; the groups' counters carry over, so that they
// never go back within the process. Called with mu held, once per term.
func (s *Server) freshAllocator(now time.Time) *Allocator {
	a := NewAllocator(s.cfg.Alloc)
	a.Succeed(s.alloc)
	for name, old := range s.alloc.groups {
		a.SetGroup(name, old.settings, now)
		b := a.groups[name]
		b.usage, b.granted, b.throttled = old.usage, old.granted, old.throttled
	}
	v, _ := s.serviceLimitLocked()
	a.SetServiceLimit(float64(v), now)
	return a
}

// walkChunk is how many groups a walk over every group (metrics, expiry,
// persistence) handles per hold of mu, so that grants wait at most for a
// chunk, never for a walk.
const walkChunk = 256

// walkGroups calls fn for every group held, under mu, releasing mu every
// walkChunk groups. A group added or dropped meanwhile may or may not be
// seen (Go's map iteration allows changes between steps); every other
// group is seen once. If the allocator is replaced meanwhile (a new term),
// the walk finishes over the old one.
func (s *Server) walkGroups(fn func(*Bucket)) {
	s.mu.Lock()
	n := 0
	for _, b := range s.alloc.groups {
		fn(b)
		if n++; n%walkChunk == 0 {
			s.mu.Unlock()
			runtime.Gosched() // let waiting grants in
			s.mu.Lock()
		}
	}
	s.mu.Unlock()
}

// stepDown stops serving tokens; the leader's address is unknown until the
// next election observer reports it.
func (s *Server) stepDown() {
	s.leader.Store(false)
	s.leaderSince.Store(nil)
	none := ""
	s.leaderAddr.Store(&none)
	s.mu.Lock()
	s.leaderKey, s.leaderRev = "", 0
	s.newTermBudgetsLocked(s.now())
	s.mu.Unlock()
	// A follower keeps no usage history: the next term loads it from etcd.
	s.usage.mu.Lock()
	s.usage.newTerm(s.now())
	s.usage.mu.Unlock()
}

// lead runs the leader's chores until leadership or ctx ends.
//
// When the session's lease lapses because etcd cannot be reached (no
// quorum, or every member down), no other replica can be elected either:
// that needs etcd. So the leader keeps granting from memory, says so in
// /readyz and rgserver_etcd_degraded, and probes etcd; once etcd answers,
// it goes on with the same lease and election key if they are still the
// leader's, and steps down otherwise. (In a partition that leaves a
// majority of etcd members elsewhere, a replica there may be elected once
// the lease expires there: until this leader reaches etcd again, groups
// used through both may get up to twice their rate. docs/operating.md.)
func (s *Server) lead(ctx context.Context, sess *concurrency.Session, el *concurrency.Election) {
	persist := time.NewTicker(s.cfg.PersistInterval)
	defer persist.Stop()
	// Expiry walks every slot of every group (in chunks): do it a few
	// times per expiry period, not every second.
	expire := time.NewTicker(max(s.cfg.Alloc.withDefaults().ClientExpiry/4, minExpiryTick))
	defer expire.Stop()
	// The session renews its lease every TTL/3; under heavy load one late
	// renewal can cost the leadership, so the leader also renews on its own,
	// more often. Cheap: one small RPC per tick.
	renew := time.NewTicker(max(s.cfg.ElectionTTL/6, minRenewTick))
	defer renew.Stop()
	// The usage history of earlier terms loads while the term grants.
	stopLoad := s.startUsageLoad(ctx)
	defer stopLoad()
	// Budgets' windows roll over (and are seeded once the history has
	// loaded) on their own tick.
	budgetTicker := time.NewTicker(budgetTick)
	defer budgetTicker.Stop()
	// The service limit's rebalances fall due between requests too.
	serviceTicker := time.NewTicker(serviceTick)
	defer serviceTicker.Stop()
	lease := sess.Lease()
	lapsed := sess.Done()
	var probe <-chan time.Time // ticks while orphaned
	probeTicker := time.NewTicker(orphanProbeInterval)
	probeTicker.Stop()
	defer probeTicker.Stop()
	// Sessions that took over the lease after an orphaned spell; campaign
	// revokes the lease (closing the first session) when the term ends.
	var resumed []*concurrency.Session
	defer func() {
		for _, ns := range resumed {
			ns.Orphan()
		}
	}()
	resume := func() {
		if ns := s.resumeOrLose(ctx, el, lease); ns != nil {
			resumed = append(resumed, ns)
			lapsed = ns.Done()
			probe = nil
			probeTicker.Stop()
		}
	}
	for {
		select {
		case <-renew.C:
			if s.orphan.Load() || s.etcdDown() {
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, s.cfg.ElectionTTL/2)
			if _, err := s.cli.KeepAliveOnce(clientv3.WithRequireLeader(rctx), lease); err != nil && ctx.Err() == nil {
				s.log.Debug("extra lease renewal", "err", err)
			}
			cancel()
		case <-ctx.Done():
			s.handOver(el)
			return
		case <-lapsed:
			lapsed = nil
			if ctx.Err() != nil {
				continue // shutting down: ctx.Done hands over
			}
			s.orphan.Store(true)
			s.log.Warn("etcd session lapsed: granting from memory until etcd answers", "election_key", el.Key())
			probeTicker.Reset(orphanProbeInterval)
			probe = probeTicker.C
			resume()
		case <-probe:
			resume()
		case <-persist.C:
			if s.orphan.Load() || s.etcdDown() {
				continue // etcd cannot commit: the dirty list waits
			}
			// Bounded, and failing at once without an etcd leader, so that
			// the loop notices a lapsed session in time.
			pctx, cancel := context.WithTimeout(ctx, min(s.cfg.PersistInterval, persistRoundMax))
			err := s.Persist(clientv3.WithRequireLeader(pctx))
			cancel()
			if err != nil {
				if errors.Is(err, ErrNotLeader) {
					s.stepDown()
					s.log.Warn("lost leadership: fenced write refused", "election_key", el.Key(),
						"lease", fmt.Sprintf("%x", lease), "lease_state", s.leaseState(lease))
					return
				}
				s.log.Warn("persist bucket states", "err", err)
			}
			pctx, cancel = context.WithTimeout(ctx, min(s.cfg.PersistInterval, persistRoundMax))
			err = s.persistRunaways(clientv3.WithRequireLeader(pctx))
			cancel()
			if err != nil {
				if errors.Is(err, ErrNotLeader) {
					s.stepDown()
					s.log.Warn("lost leadership: fenced write refused", "election_key", el.Key())
					return
				}
				s.log.Warn("persist runaway history", "err", err)
			}
			pctx, cancel = context.WithTimeout(ctx, min(s.cfg.PersistInterval, persistRoundMax))
			err = s.persistUsage(clientv3.WithRequireLeader(pctx), false)
			cancel()
			if err != nil {
				if errors.Is(err, ErrNotLeader) {
					s.stepDown()
					s.log.Warn("lost leadership: fenced write refused", "election_key", el.Key())
					return
				}
				s.usage.persistErrors.Inc()
				s.log.Warn("persist usage history", "err", err)
			}
		case <-budgetTicker.C:
			s.budgetChores(s.now())
		case <-serviceTicker.C:
			s.mu.Lock()
			ran := s.alloc.RebalanceIfDue(s.now())
			wake := ran && s.alloc.Reasks()
			s.mu.Unlock()
			if wake {
				s.pushHub.wake() // proxies to ask again at their new rates
			}
		case <-expire.C:
			now := s.now()
			expiry := s.cfg.Alloc.withDefaults().ClientExpiry
			n := 0
			s.walkGroups(func(b *Bucket) { n += b.expire(now, expiry) })
			if n > 0 {
				s.log.Debug("expired proxy slots", "n", n)
			}
			if n := s.runaways.expire(now); n > 0 {
				s.log.Debug("expired runaway history rows", "n", n)
			}
			if s.orphan.Load() || s.etcdDown() {
				// No persistence rounds: the usage history's memory
				// follows its retention and bound here.
				s.usage.tidy(now, false)
				s.evictUsage()
			}
		}
		if !s.leader.Load() {
			return // resumeOrLose stepped down
		}
	}
}

// orphanProbeInterval is how often an orphaned leader asks etcd whether
// it still leads.
const orphanProbeInterval = 500 * time.Millisecond

// resumeOrLose probes etcd for an orphaned leader: while etcd does not
// answer it keeps leading (nil); when it answers and the election key is
// still the first (the leader's), it renews the lease and returns a new
// session over it; otherwise it steps down (nil).
func (s *Server) resumeOrLose(ctx context.Context, el *concurrency.Election, lease clientv3.LeaseID) *concurrency.Session {
	pctx, cancel := context.WithTimeout(ctx, etcdProbeTimeout)
	defer cancel()
	resp, err := s.cli.Get(clientv3.WithRequireLeader(pctx), keyElection+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return nil // still unreachable: keep granting from memory
	}
	first := ""
	if len(resp.Kvs) > 0 {
		first = string(resp.Kvs[0].Key)
	}
	lost := func(why string) *concurrency.Session {
		s.orphan.Store(false)
		s.stepDown()
		s.log.Warn("lost leadership after etcd came back", "why", why, "election_key", el.Key())
		return nil
	}
	if first != el.Key() {
		return lost("the election key is gone or no longer first")
	}
	if _, err := s.cli.KeepAliveOnce(pctx, lease); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return lost("the lease expired")
		}
		return nil
	}
	ttl := int((s.cfg.ElectionTTL + time.Second - 1) / time.Second)
	ns, err := concurrency.NewSession(s.cli, concurrency.WithLease(lease), concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
	if err != nil {
		return nil
	}
	s.orphan.Store(false)
	s.log.Info("etcd answers again: still the leader", "election_key", el.Key())
	return ns
}

// handOver saves the buckets and lets another replica lead.
func (s *Server) handOver(el *concurrency.Election) {
	wctx, cancel := context.WithTimeout(context.Background(), handOverTimeout)
	defer cancel()
	if err := s.persist(wctx, true); err != nil {
		s.log.Warn("persist on shutdown", "err", err)
	}
	if err := s.persistRunaways(wctx); err != nil {
		s.log.Warn("persist runaway history on shutdown", "err", err)
	}
	if err := s.persistUsage(wctx, true); err != nil {
		s.log.Warn("persist usage history on shutdown", "err", err)
	}
	s.stepDown()
	s.orphan.Store(false)
	resign := el.Resign
	failpoint.Inject("resignError", func() {
		resign = func(context.Context) error { return errFailpoint }
	})
	if err := resign(wctx); err != nil {
		// The session's lease is revoked on close anyway, so
		// another replica still takes over.
		s.log.Warn("resign", "err", err)
	}
}

// leaseState describes the session's lease, for the log of a lost leadership.
func (s *Server) leaseState(lease clientv3.LeaseID) string {
	ctx, cancel := context.WithTimeout(context.Background(), etcdProbeTimeout)
	defer cancel()
	r, err := s.cli.TimeToLive(ctx, lease)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("ttl %ds of %ds", r.TTL, r.GrantedTTL)
}

// maxTxnOps stays under etcd's default limit of 128 operations per txn.
const maxTxnOps = 100

// Persist saves under /rg/states/ the bucket states that changed
// meaningfully since they were last saved (Bucket.ToSave), fenced on this
// leader's election key: it fails with ErrNotLeader if another replica has
// taken over. Only the groups granted to (or altered) since the last
// Persist are looked at, a few at a time under the grant lock, so an idle
// system writes nothing and a busy one writes in proportion to the groups
// in use. States that could not be written are tried again next time.
func (s *Server) Persist(ctx context.Context) error { return s.persist(ctx, false) }

// stateWrite is one bucket state to write.
type stateWrite struct {
	b  *Bucket
	st BucketState
}

func (s *Server) persist(ctx context.Context, handover bool) error {
	now := s.now()
	s.mu.Lock()
	key, rev := s.leaderKey, s.leaderRev
	a := s.alloc
	if key == "" {
		s.mu.Unlock()
		return ErrNotLeader
	}
	dirty := a.TakeDirty()
	s.mu.Unlock()
	var todo []stateWrite
	for i := 0; i < len(dirty); i += walkChunk {
		s.mu.Lock()
		for _, b := range dirty[i:min(i+walkChunk, len(dirty))] {
			if !a.Held(b) {
				continue // dropped since
			}
			if st, ok := b.ToSave(now, handover); ok {
				todo = append(todo, stateWrite{b, st})
			}
		}
		s.mu.Unlock()
		runtime.Gosched() // let waiting grants in
	}
	for len(todo) > 0 {
		n := min(len(todo), maxTxnOps)
		written, err := s.writeStates(ctx, key, rev, todo[:n])
		if err != nil {
			s.m.persistErrors.Inc()
			s.noteEtcdError(err)
			s.mu.Lock()
			for _, w := range todo {
				a.Redirty(w.b)
			}
			s.mu.Unlock()
			return err
		}
		s.m.statesWritten.Add(float64(len(written)))
		s.mu.Lock()
		for _, w := range written {
			w.b.Saved(w.st)
		}
		s.mu.Unlock()
		todo = todo[n:]
	}
	return nil
}

// writeStates writes one batch in one transaction, fenced on the election
// key and on each group's definition still existing, so that a state is
// never written for a group dropped meanwhile (its state key went with
// it). A batch with dropped groups is written again without them. It
// returns what was written.
func (s *Server) writeStates(ctx context.Context, key string, rev int64, batch []stateWrite) ([]stateWrite, error) {
	for len(batch) > 0 {
		failpoint.Inject("persistError", func() {
			failpoint.Return(nil, fmt.Errorf("%w: persist bucket states: %w", ErrEtcd, errFailpoint))
		})
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", rev)}
		puts := make([]clientv3.Op, 0, len(batch))
		reads := []clientv3.Op{clientv3.OpGet(key, clientv3.WithCountOnly())}
		for _, w := range batch {
			val, err := json.Marshal(w.st)
			if err != nil {
				return nil, fmt.Errorf("tokenserver: encode state of %q: %w", w.b.Name(), err)
			}
			sk := settingsKey(w.b.Name())
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(sk), ">", 0))
			puts = append(puts, clientv3.OpPut(stateKey(w.b.Name()), string(val)))
			reads = append(reads, clientv3.OpGet(sk, clientv3.WithCountOnly()))
		}
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(puts...).Else(reads...).Commit()
		if err != nil {
			return nil, fmt.Errorf("%w: persist bucket states: %w", ErrEtcd, err)
		}
		if resp.Succeeded {
			return batch, nil
		}
		if resp.Responses[0].GetResponseRange().GetCount() == 0 {
			return nil, ErrNotLeader
		}
		kept := batch[:0:0]
		for i, w := range batch {
			if resp.Responses[i+1].GetResponseRange().GetCount() > 0 {
				kept = append(kept, w)
			}
		}
		if len(kept) == len(batch) {
			return nil, fmt.Errorf("%w: persist bucket states: transaction refused for no reason found", ErrEtcd)
		}
		batch = kept
	}
	return nil, nil
}

// syncSettings mirrors /rg/settings/ into the allocator until ctx ends.
func (s *Server) syncSettings(ctx context.Context) {
	for ctx.Err() == nil {
		err := s.loadAndFollowSettings(ctx)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("following the settings in etcd: starting over", "err", err)
		select {
		case <-time.After(settingsRetryWait):
		case <-ctx.Done():
		}
	}
}

// loadAndFollowSettings lists the groups, then applies the changes etcd
// reports after them.
func (s *Server) loadAndFollowSettings(ctx context.Context) error {
	groups, rev, err := s.store.listGroups(ctx, 0)
	if err != nil {
		return err
	}
	now := s.now()
	seen := make(map[string]bool, len(groups))
	for i, g := range groups {
		if i%walkChunk == 0 {
			if i > 0 {
				s.mu.Unlock()
			}
			s.mu.Lock()
		}
		seen[g.Name] = true
		s.setGroupLocked(g, now)
	}
	if len(groups) > 0 {
		s.mu.Unlock()
	}
	var gone []string
	s.walkGroups(func(b *Bucket) {
		if !seen[b.Name()] {
			gone = append(gone, b.Name())
		}
	})
	s.mu.Lock()
	for _, name := range gone {
		s.removeGroupLocked(name)
	}
	s.mu.Unlock()
	groups, seen = nil, nil // the watch below runs for long: do not hold on to them
	if err := s.loadServiceLimit(ctx, rev); err != nil {
		return err
	}
	s.syncOnce.Do(func() { close(s.synced) })

	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	settings := s.cli.Watch(wctx, keySettings, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	limits := s.cli.Watch(wctx, keyServiceLimit, clientv3.WithRev(rev+1))
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case wr, ok = <-settings:
		case lr, lok := <-limits:
			if !lok {
				return fmt.Errorf("%w: service limit watch closed", ErrEtcd)
			}
			if err := lr.Err(); err != nil {
				return fmt.Errorf("%w: watch the service limit: %w", ErrEtcd, err)
			}
			for _, ev := range lr.Events {
				s.serviceLimitEvent(ev)
			}
			continue
		}
		if !ok {
			break
		}
		if err := wr.Err(); err != nil {
			return fmt.Errorf("%w: watch settings: %w", ErrEtcd, err)
		}
		failpoint.Inject("settingsWatchLag", func(v failpoint.Value) {
			// The leader's view of the settings lags behind etcd.
			if ms, ok := v.(int); ok {
				time.Sleep(time.Duration(ms) * time.Millisecond)
			}
		})
		now := s.now()
		for _, ev := range wr.Events {
			name := strings.TrimPrefix(string(ev.Kv.Key), keySettings)
			if ev.Type == clientv3.EventTypeDelete {
				s.mu.Lock()
				s.removeGroupLocked(name) // its series go with it
				s.mu.Unlock()
				continue
			}
			g, err := decodeGroup(name, ev.Kv.Value, ev.Kv.ModRevision)
			if err != nil {
				s.log.Warn("bad group in etcd", "group", name, "err", err)
				continue
			}
			s.mu.Lock()
			s.setGroupLocked(g, now)
			s.mu.Unlock()
			s.misses.forget(name)
		}
	}
	return fmt.Errorf("%w: settings watch closed", ErrEtcd)
}
