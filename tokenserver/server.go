// Package tokenserver is rgserver's core: one global token bucket per
// resource group shared by every proxy (Allocator), group settings and user
// bindings in etcd (EtcdStore), leader election among replicas, and the gRPC
// services of tokenpb (ResourceGroupService, TokenService).
package tokenserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
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
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Logger receives the server's logs; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the server's metrics; nil = none.
	Registerer prometheus.Registerer
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
	// synced is closed once the settings have been loaded.
	synced   chan struct{}
	syncOnce sync.Once
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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{
		cli:    cli,
		store:  &EtcdStore{cli: cli, now: cfg.Now},
		cfg:    cfg,
		log:    cfg.Logger,
		m:      newMetrics(),
		alloc:  NewAllocator(cfg.Alloc),
		synced: make(chan struct{}),
	}
	if cfg.Registerer != nil {
		if err := s.m.register(cfg.Registerer, s); err != nil {
			return nil, fmt.Errorf("tokenserver: register metrics: %w", err)
		}
	}
	return s, nil
}

// Store returns the server's etcd-backed resourcegroup.Store.
func (s *Server) Store() *EtcdStore { return s.store }

// Register adds both services to a gRPC server.
func (s *Server) Register(g *grpc.Server) {
	pb.RegisterResourceGroupServiceServer(g, s)
	pb.RegisterTokenServiceServer(g, s)
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
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.syncSettings(ctx)
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
			case <-time.After(time.Second):
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

	octx, ocancel := context.WithCancel(ctx)
	defer ocancel()
	observed := make(chan leaderSeen, 1)
	go func() {
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
	}()
	go s.watchLeaderLiveness(octx, observed)

	// A campaign outlives neither ctx nor the session: if the lease is lost
	// while waiting, start over with a new session.
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	go func() {
		select {
		case <-sess.Done():
			ccancel()
		case <-cctx.Done():
		}
	}()
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
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
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

// watchLeaderLiveness revokes the lease of a leader whose process is gone,
// so that a replica takes over at once instead of when the lease expires
// (up to the election TTL, plus etcd's extension when etcd's own leader
// died with it). Only a refused connection counts: a timeout may be a slow
// or partitioned leader, which the lease handles. A revoked leader that is
// somehow alive loses its session and steps down, and its writes are
// fenced on the election key's revision.
func (s *Server) watchLeaderLiveness(ctx context.Context, observed <-chan leaderSeen) {
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
		rctx, cancel := context.WithTimeout(ctx, time.Second)
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
	now := s.now()
	s.mu.Lock()
	// A new term starts with no slots: proxies reconnect and say who they are.
	s.alloc = s.freshAllocator(now)
	for _, kv := range resp.Kvs {
		var st BucketState
		if err := json.Unmarshal(kv.Value, &st); err != nil {
			s.log.Warn("bad bucket state; starting full", "key", string(kv.Key), "err", err)
			continue
		}
		s.alloc.Restore(strings.TrimPrefix(string(kv.Key), keyStates), st, now)
	}
	s.leaderKey, s.leaderRev = key, rev
	s.mu.Unlock()
	addr := s.cfg.AdvertiseAddr
	s.leaderAddr.Store(&addr)
	s.leader.Store(true)
	s.log.Info("became leader", "addr", addr, "election_rev", rev, "states", len(resp.Kvs))
	return nil
}

// freshAllocator copies the current settings into an allocator with full
// buckets and no slots. Called with mu held.
func (s *Server) freshAllocator(now time.Time) *Allocator {
	a := NewAllocator(s.cfg.Alloc)
	for _, name := range s.alloc.Groups() {
		a.SetGroup(name, s.alloc.Group(name).settings, now)
	}
	return a
}

// stepDown stops serving tokens; the leader's address is unknown until the
// next election observer reports it.
func (s *Server) stepDown() {
	s.leader.Store(false)
	none := ""
	s.leaderAddr.Store(&none)
	s.mu.Lock()
	s.leaderKey, s.leaderRev = "", 0
	s.mu.Unlock()
}

// lead runs the leader's chores until leadership or ctx ends.
func (s *Server) lead(ctx context.Context, sess *concurrency.Session, el *concurrency.Election) {
	persist := time.NewTicker(s.cfg.PersistInterval)
	defer persist.Stop()
	// Expiry walks every slot of every group under the lock: do it a few
	// times per expiry period, not every second.
	expire := time.NewTicker(max(s.cfg.Alloc.withDefaults().ClientExpiry/4, time.Second))
	defer expire.Stop()
	// The session renews its lease every TTL/3; under heavy load one late
	// renewal can cost the leadership, so the leader also renews on its own,
	// more often. Cheap: one small RPC per tick.
	renew := time.NewTicker(max(s.cfg.ElectionTTL/6, 100*time.Millisecond))
	defer renew.Stop()
	for {
		select {
		case <-renew.C:
			rctx, cancel := context.WithTimeout(ctx, s.cfg.ElectionTTL/2)
			if _, err := s.cli.KeepAliveOnce(rctx, sess.Lease()); err != nil && ctx.Err() == nil {
				s.log.Debug("extra lease renewal", "err", err)
			}
			cancel()
		case <-ctx.Done():
			// Hand-over: save the buckets, then let another replica lead.
			wctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			if err := s.Persist(wctx); err != nil {
				s.log.Warn("persist on shutdown", "err", err)
			}
			s.stepDown()
			resign := el.Resign
			failpoint.Inject("resignError", func() {
				resign = func(context.Context) error { return errFailpoint }
			})
			if err := resign(wctx); err != nil {
				// The session's lease is revoked on close anyway, so
				// another replica still takes over.
				s.log.Warn("resign", "err", err)
			}
			cancel()
			return
		case <-sess.Done():
			s.stepDown()
			s.log.Warn("lost leadership: election session ended")
			return
		case <-persist.C:
			if err := s.Persist(ctx); err != nil {
				if errors.Is(err, ErrNotLeader) {
					s.stepDown()
					s.log.Warn("lost leadership: fenced write refused", "election_key", el.Key(),
						"lease", fmt.Sprintf("%x", sess.Lease()), "lease_state", s.leaseState(sess))
					return
				}
				s.log.Warn("persist bucket states", "err", err)
			}
		case <-expire.C:
			s.mu.Lock()
			n := s.alloc.Expire(s.now())
			s.mu.Unlock()
			if n > 0 {
				s.log.Debug("expired proxy slots", "n", n)
			}
		}
	}
}

// leaseState describes the session's lease, for the log of a lost leadership.
func (s *Server) leaseState(sess *concurrency.Session) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := s.cli.TimeToLive(ctx, sess.Lease())
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("ttl %ds of %ds", r.TTL, r.GrantedTTL)
}

// maxTxnOps stays under etcd's default limit of 128 operations per txn.
const maxTxnOps = 100

// Persist saves every bucket's level under /rg/states/, fenced on this
// leader's election key: it fails with ErrNotLeader if another replica has
// taken over.
func (s *Server) Persist(ctx context.Context) error {
	now := s.now()
	s.mu.Lock()
	key, rev := s.leaderKey, s.leaderRev
	if key == "" {
		s.mu.Unlock()
		return ErrNotLeader
	}
	var ops []clientv3.Op
	for _, name := range s.alloc.Groups() {
		st, ok := s.alloc.State(name, now)
		if !ok {
			continue
		}
		val, err := json.Marshal(st)
		if err != nil {
			s.mu.Unlock()
			return fmt.Errorf("tokenserver: encode state of %q: %w", name, err)
		}
		ops = append(ops, clientv3.OpPut(stateKey(name), string(val)))
	}
	s.mu.Unlock()
	fence := clientv3.Compare(clientv3.CreateRevision(key), "=", rev)
	for len(ops) > 0 {
		n := min(len(ops), maxTxnOps)
		failpoint.Inject("persistError", func() {
			failpoint.Return(fmt.Errorf("%w: persist bucket states: %w", ErrEtcd, errFailpoint))
		})
		resp, err := s.cli.Txn(ctx).If(fence).Then(ops[:n]...).Commit()
		if err != nil {
			return fmt.Errorf("%w: persist bucket states: %w", ErrEtcd, err)
		}
		if !resp.Succeeded {
			return ErrNotLeader
		}
		ops = ops[n:]
	}
	return nil
}

// syncSettings mirrors /rg/settings/ into the allocator until ctx ends.
func (s *Server) syncSettings(ctx context.Context) {
	for ctx.Err() == nil {
		err := s.loadAndWatchSettings(ctx)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("settings watch restarting", "err", err)
		select {
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// loadAndWatchSettings lists the groups, then applies changes from the watch.
func (s *Server) loadAndWatchSettings(ctx context.Context) error {
	groups, rev, err := s.store.listGroups(ctx, 0)
	if err != nil {
		return err
	}
	now := s.now()
	s.mu.Lock()
	seen := make(map[string]bool, len(groups))
	for _, g := range groups {
		seen[g.Name] = true
		s.alloc.SetGroup(g.Name, SettingsOf(g), now)
	}
	for _, name := range s.alloc.Groups() {
		if !seen[name] {
			s.alloc.RemoveGroup(name)
		}
	}
	s.mu.Unlock()
	s.syncOnce.Do(func() { close(s.synced) })

	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range s.cli.Watch(wctx, keySettings, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("%w: watch settings: %w", ErrEtcd, err)
		}
		now := s.now()
		for _, ev := range wr.Events {
			name := strings.TrimPrefix(string(ev.Kv.Key), keySettings)
			if ev.Type == clientv3.EventTypeDelete {
				s.mu.Lock()
				s.alloc.RemoveGroup(name)
				s.mu.Unlock()
				s.m.forget(name)
				continue
			}
			g, err := decodeGroup(name, ev.Kv.Value, ev.Kv.ModRevision)
			if err != nil {
				s.log.Warn("bad group in etcd", "group", name, "err", err)
				continue
			}
			s.mu.Lock()
			s.alloc.SetGroup(name, SettingsOf(g), now)
			s.mu.Unlock()
		}
	}
	return fmt.Errorf("%w: settings watch closed", ErrEtcd)
}
