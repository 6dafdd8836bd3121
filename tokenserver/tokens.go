package tokenserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// maxGroupsPerRequest bounds one message, so a bad client cannot make the
// leader hold its lock for long.
const maxGroupsPerRequest = 10000

// maxProxyIDLen bounds proxy_id, in bytes: it keys a slot in every group
// the proxy uses.
const maxProxyIDLen = 256

// Unknown group names: a name etcd said does not exist is remembered for
// missTTL (at most missCacheMax names), and one stream may have at most
// unknownLookupBurst names read from etcd at once, unknownLookupRate per
// second after that. Either way the answer is GRANT_ERROR_UNAVAILABLE,
// never NOT_FOUND: a proxy drops a NOT_FOUND group (its sessions fall back
// to default, unlimited), so only an etcd read made for this request may
// say NOT_FOUND; a group created a moment ago is then never refused
// because of a cache, only asked about again a second later.
const (
	missTTL            = 2 * time.Second
	missCacheMax       = 4096
	unknownLookupBurst = 64
	unknownLookupRate  = 32
)

// Messages of the grants answered without reading etcd.
const (
	errCachedMiss   = "unavailable: the resource group did not exist a moment ago; ask again later"
	errLookupsLimit = "unavailable: too many unknown resource groups asked about on this stream; ask again later"
)

// missCache remembers, for missTTL, group names etcd said do not exist.
type missCache struct {
	mu      sync.Mutex
	expires map[string]time.Time
}

func newMissCache() *missCache { return &missCache{expires: map[string]time.Time{}} }

// has reports whether name was found missing less than missTTL before now.
func (c *missCache) has(name string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	exp, ok := c.expires[name]
	if ok && !now.Before(exp) {
		delete(c.expires, name)
		return false
	}
	return ok
}

// add remembers name as missing at now; when the cache is full of live
// entries the name is not remembered (the per-stream limit still holds).
func (c *missCache) add(name string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.expires) >= missCacheMax {
		for n, exp := range c.expires {
			if !now.Before(exp) {
				delete(c.expires, n)
			}
		}
		if len(c.expires) >= missCacheMax {
			return
		}
	}
	c.expires[name] = now.Add(missTTL)
}

// forget drops name (the settings watch saw it created).
func (c *missCache) forget(name string) {
	c.mu.Lock()
	delete(c.expires, name)
	c.mu.Unlock()
}

// lookupBudget is one stream's token bucket of etcd reads for unknown
// group names.
type lookupBudget struct {
	tokens float64
	last   time.Time
}

func newLookupBudget() *lookupBudget { return &lookupBudget{tokens: unknownLookupBurst} }

// take spends one read at now, false when none is left.
func (b *lookupBudget) take(now time.Time) bool {
	if !b.last.IsZero() {
		if el := now.Sub(b.last).Seconds(); el > 0 {
			b.tokens = min(b.tokens+el*unknownLookupRate, unknownLookupBurst)
		}
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// validateTokenRequest checks one stream message. proxyID is the id the
// stream started with ("" before the first message).
func validateTokenRequest(req *pb.TokenRequest, proxyID string) error {
	if req.GetProxyId() == "" {
		return errors.New("proxy_id is empty")
	}
	if n := len(req.GetProxyId()); n > maxProxyIDLen {
		return fmt.Errorf("proxy_id is %d bytes, at most %d", n, maxProxyIDLen)
	}
	if proxyID != "" && req.GetProxyId() != proxyID {
		return fmt.Errorf("proxy_id changed within the stream from %q to %q", proxyID, req.GetProxyId())
	}
	if n := len(req.GetGroups()); n > maxGroupsPerRequest {
		return fmt.Errorf("%d groups in one message, at most %d", n, maxGroupsPerRequest)
	}
	seen := make(map[string]bool, len(req.GetGroups()))
	for i, g := range req.GetGroups() {
		name := resourcegroup.NormalizeName(g.GetGroup())
		if err := resourcegroup.ValidateName(name); err != nil {
			return fmt.Errorf("groups[%d]: %w", i, err)
		}
		if seen[name] {
			return fmt.Errorf("groups[%d]: group %q listed twice", i, name)
		}
		seen[name] = true
		if err := checkNumbers(g); err != nil {
			return fmt.Errorf("groups[%d] (%s): %w", i, name, err)
		}
	}
	return nil
}

func checkNumbers(g *pb.GroupTokenRequest) error {
	nums := []struct {
		name string
		v    float64
	}{
		{"tokens_wanted", g.GetTokensWanted()},
		{"demand_ru_per_sec", g.GetDemandRuPerSec()},
		{"waiting_tokens", g.GetWaitingTokens()},
		{"held_tokens", g.GetHeldTokens()},
		{"consumption.rru", g.GetConsumption().GetRru()},
		{"consumption.wru", g.GetConsumption().GetWru()},
		{"consumption.backend_seconds", g.GetConsumption().GetBackendSeconds()},
		{"consumption.waited_ru", g.GetConsumption().GetWaitedRu()},
		{"consumption.denied_ru", g.GetConsumption().GetDeniedRu()},
	}
	for _, n := range nums {
		if math.IsNaN(n.v) || math.IsInf(n.v, 0) || n.v < 0 {
			return fmt.Errorf("%s = %v: must be a finite number ≥ 0", n.name, n.v)
		}
	}
	if g.GetReportOnly() && g.GetTokensWanted() > 0 {
		return errors.New("report_only with tokens_wanted > 0")
	}
	return nil
}

// AcquireTokens implements tokenpb.TokenServiceServer. The proxy id of
// the first message binds the stream to the caller's credential
// (proxies.go); every later message must carry the same id.
func (s *Server) AcquireTokens(stream grpc.BidiStreamingServer[pb.TokenRequest, pb.TokenResponse]) error {
	p := principalFrom(stream.Context())
	closeStream, err := s.proxies.open(p, kindTokens)
	if err != nil {
		return s.auth.refuse(refusedStreamLimit, codes.ResourceExhausted, err.Error())
	}
	defer closeStream()
	s.openStreams[kindTokens].Add(1)
	defer s.openStreams[kindTokens].Add(-1)
	s.creds.streamOpened(p, s.now())
	defer func() { s.creds.streamClosed(p, s.now()) }()
	var proxyID, slot string
	var ticket *streamTicket
	var updateCaps func(proxyCaps)
	budget := newLookupBudget()
	// What the stream told its proxy of its groups' budget verdicts; a
	// changed verdict wakes the stream (budget_service.go).
	verdicts := newBudgetSent()
	pushWake, unsubscribe := s.pushHub.subscribe()
	defer unsubscribe()
	// The stream's messages come through a goroutine, so that the stream
	// ends when its context does (a reload revoked its credential) even
	// while the proxy sends nothing.
	ctx := stream.Context()
	recv, recvErr := recvPump(ctx, stream.Recv)
	for {
		var req *pb.TokenRequest
		select {
		case req = <-recv:
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-pushWake:
			if ticket == nil || !s.IsLeader() {
				continue
			}
			s.mu.Lock()
			ups := s.budgetUpdatesLocked(verdicts, nil, s.now())
			again := s.alloc.TakeReasks(slot)
			s.mu.Unlock()
			if len(ups) == 0 && len(again) == 0 {
				continue
			}
			if err := stream.Send(&pb.TokenResponse{Budgets: ups, AskAgain: again}); err != nil {
				return err
			}
			continue
		}
		start := time.Now()
		if err := validateTokenRequest(req, proxyID); err != nil {
			return status.Errorf(codes.InvalidArgument, "malformed token request: %v", err)
		}
		if ticket == nil {
			t, evict, release, err := s.proxies.bind(p, req.GetProxyId(), s.now())
			if err != nil {
				return s.auth.refuse(refusedStreamLimit, codes.ResourceExhausted, err.Error()+
					": another proxy must stop first, or give the credential more streams (--proxy-token-file: <name> <token> <max-streams>)")
			}
			defer func() { release(s.now()) }()
			ticket, proxyID, slot = t, req.GetProxyId(), slotID(p, req.GetProxyId())
			defer func() {
				s.mu.Lock()
				s.alloc.TakeReasks(slot) // nobody left to tell
				s.mu.Unlock()
			}()
			if len(evict) > 0 {
				s.removeSlots(evict)
			}
			var removeCaps func()
			updateCaps, removeCaps = s.caps.add(capsFromPB(p, proxyID, req.GetCapabilities()))
			defer removeCaps()
		} else if req.GetCapabilities() != nil {
			updateCaps(capsFromPB(p, proxyID, req.GetCapabilities()))
		}
		if ticket.superseded.Load() {
			return status.Errorf(codes.Aborted, "proxy id %q is used by a newer stream of the same credential", proxyID)
		}
		var resp *pb.TokenResponse
		if s.IsLeader() {
			resp = s.serveTokens(stream.Context(), p, slot, req, budget)
			s.attachBudgets(resp, verdicts)
		} else {
			resp = &pb.TokenResponse{RequestId: req.GetRequestId(), NotLeader: &pb.NotLeader{LeaderAddr: s.LeaderAddr()}}
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		s.m.acquireSeconds.Observe(time.Since(start).Seconds())
	}
}

// askedElsewhere returns the groups of again that req did not ask tokens
// for: its grants already replace those trickles.
func askedElsewhere(again []string, req *pb.TokenRequest) []string {
	if len(again) == 0 {
		return nil
	}
	asked := map[string]bool{}
	for _, gr := range req.GetGroups() {
		if !gr.GetReportOnly() {
			asked[resourcegroup.NormalizeName(gr.GetGroup())] = true
		}
	}
	return slices.DeleteFunc(again, func(g string) bool { return asked[g] })
}

// removeSlots drops the slots of the given slot ids from every group.
func (s *Server) removeSlots(ids []string) {
	now := s.now()
	n := 0
	s.walkGroups(func(b *Bucket) {
		for _, id := range ids {
			if b.removeSlot(id, now) {
				n++
			}
		}
	})
	s.log.Debug("dropped the slots of proxy ids replaced under their credential", "ids", ids, "slots", n)
}

// countClamped adds a grant's clamped fields to the metric.
func (s *Server) countClamped(c Clamped, consumption bool) {
	if c&ClampedDemand != 0 {
		s.m.clamped.WithLabelValues(fieldDemand).Inc()
	}
	if c&ClampedWanted != 0 {
		s.m.clamped.WithLabelValues(fieldWanted).Inc()
	}
	if c&ClampedHeld != 0 {
		s.m.clamped.WithLabelValues(fieldHeld).Inc()
	}
	if consumption {
		s.m.clamped.WithLabelValues(fieldConsumption).Inc()
	}
}

// serveTokens answers one validated request as the leader; slot keys the
// proxy's slots (p.Name names its credential, whose slots share one
// weight), budget bounds the stream's etcd reads for unknown groups.
// Consumption is counted only for groups that exist.
func (s *Server) serveTokens(ctx context.Context, p Principal, slot string, req *pb.TokenRequest, budget *lookupBudget) *pb.TokenResponse {
	now := s.now()
	resp := &pb.TokenResponse{RequestId: req.GetRequestId(), Grants: make([]*pb.GroupGrant, len(req.GetGroups()))}
	var missing []int
	s.mu.Lock()
	for i, gr := range req.GetGroups() {
		name := resourcegroup.NormalizeName(gr.GetGroup())
		g, err := s.alloc.Acquire(name, allocRequest(p.Name, slot, gr), now)
		if err != nil {
			missing = append(missing, i)
			continue
		}
		s.report(p, name, slot, g, gr.GetConsumption(), now)
		resp.Grants[i] = grantToPB(name, g)
		if s.log.Enabled(ctx, slog.LevelDebug) && !gr.GetReportOnly() {
			s.log.Debug("grant", "resource_group", name, "proxy", slot,
				"demand", gr.GetDemandRuPerSec(), "wanted", gr.GetTokensWanted(),
				"tokens", g.Tokens, "immediate", g.Immediate, "trickle", g.Trickle, "share", g.FillRate)
		}
	}
	resp.ServiceLimited = s.alloc.ServiceLimited()
	resp.AskAgain = askedElsewhere(s.alloc.TakeReasks(slot), req)
	wake := s.alloc.Reasks() // other proxies are to ask again
	s.mu.Unlock()
	if wake {
		s.pushHub.wake()
	}
	for _, i := range missing {
		gr := req.GetGroups()[i]
		name := resourcegroup.NormalizeName(gr.GetGroup())
		switch {
		case s.misses.has(name, now):
			s.m.unknownRefused.WithLabelValues(unknownCached).Inc()
			resp.Grants[i] = &pb.GroupGrant{Group: name, Error: errCachedMiss, ErrorCode: pb.GrantError_GRANT_ERROR_UNAVAILABLE}
		case !budget.take(now):
			s.m.unknownRefused.WithLabelValues(unknownRateLimited).Inc()
			resp.Grants[i] = &pb.GroupGrant{Group: name, Error: errLookupsLimit, ErrorCode: pb.GrantError_GRANT_ERROR_UNAVAILABLE}
		default:
			resp.Grants[i] = s.serveMissing(ctx, p, slot, gr, now)
		}
	}
	return resp
}

// serveMissing handles a group the allocator does not know yet: it may have
// been created a moment ago, before the settings watch caught up. When etcd
// cannot say, the error is GRANT_ERROR_UNAVAILABLE, which a proxy must not
// take for a dropped group (that would lift its limit). A group etcd does
// not hold is remembered for missTTL.
func (s *Server) serveMissing(ctx context.Context, p Principal, slot string, gr *pb.GroupTokenRequest, now time.Time) *pb.GroupGrant {
	name := resourcegroup.NormalizeName(gr.GetGroup())
	// Bounded: while etcd is away this read must not hold up the proxy's
	// whole stream (its other groups' grants wait behind it).
	rctx, cancel := etcdCall(ctx)
	g, err := s.store.GetGroup(rctx, name)
	cancel()
	if err != nil {
		if errors.Is(err, resourcegroup.ErrNotFound) {
			s.misses.add(name, now)
			return &pb.GroupGrant{Group: name, Error: err.Error(), ErrorCode: pb.GrantError_GRANT_ERROR_NOT_FOUND}
		}
		return &pb.GroupGrant{Group: name, Error: "unavailable: " + err.Error(), ErrorCode: pb.GrantError_GRANT_ERROR_UNAVAILABLE}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.alloc.Group(name) == nil {
		s.setGroupLocked(g, now)
	}
	grant, err := s.alloc.Acquire(name, allocRequest(p.Name, slot, gr), now)
	if err != nil {
		// Dropped between the read and now.
		return &pb.GroupGrant{Group: name, Error: err.Error(), ErrorCode: pb.GrantError_GRANT_ERROR_NOT_FOUND}
	}
	s.report(p, name, slot, grant, gr.GetConsumption(), now)
	return grantToPB(name, grant)
}

// report records what p's proxy (slot) was granted in group name and
// the consumption it reported, bounded per message (usageOf) and by what
// the credential was granted (credBook.report). Called with s.mu held.
func (s *Server) report(p Principal, name, slot string, g Grant, c *pb.Consumption, now time.Time) {
	u, thr, uc := usageOf(c)
	var gb bound
	if b := s.alloc.Group(name); b != nil {
		gb = boundOf(b.settings)
	}
	u, thr = s.creds.settle(p, name, g.Tokens+g.Immediate, gb, u, thr, now)
	prev := s.alloc.lastReport(name, slot)
	refused := s.creds.refusedCount(p, min(float64(c.GetRefused()), maxReportRU), now)
	s.alloc.Report(name, slot, u, thr, refused, min(c.GetWaitedRu(), maxReportRU), now)
	s.reportUsage(name, u, thr, refused, c, prev, now)
	s.spendBudgetLocked(name, u.RRU+u.WRU, now)
	s.countClamped(g.Clamped, uc)
}

// Bounds of one reported consumption (one group, one message): far
// beyond what a proxy meters between two reports, and finite however many
// reports are summed.
const (
	maxReportRU      = 1e12 // RRU, WRU, statements, throttled
	maxReportBytes   = 1e15
	maxReportSeconds = 1e9
)

// usageOf converts a reported consumption and its refusals (throttled),
// clamped to the bounds above; clamped says whether any field was.
func usageOf(c *pb.Consumption) (u ru.Consumption, throttled float64, clamped bool) {
	u = ru.Consumption{RRU: c.GetRru(), WRU: c.GetWru(), ReadBytes: float64(c.GetReadBytes()), WriteBytes: float64(c.GetWriteBytes()),
		BackendSeconds: c.GetBackendSeconds(), Statements: float64(c.GetStatements()), CPUSeconds: c.GetBackendCpuSeconds()}
	bound := func(v *float64, hi float64) {
		switch {
		case !(*v >= 0):
			*v = 0
		case *v > hi:
			*v, clamped = hi, true
		}
	}
	bound(&u.RRU, maxReportRU)
	bound(&u.WRU, maxReportRU)
	bound(&u.Statements, maxReportRU)
	bound(&u.ReadBytes, maxReportBytes)
	bound(&u.WriteBytes, maxReportBytes)
	bound(&u.BackendSeconds, maxReportSeconds)
	bound(&u.CPUSeconds, maxReportSeconds)
	throttled = float64(c.GetThrottled())
	bound(&throttled, maxReportRU)
	return u, throttled, clamped
}

func allocRequest(cred, slot string, gr *pb.GroupTokenRequest) Request {
	return Request{
		ProxyID:    slot,
		Credential: cred,
		Wanted:     gr.GetTokensWanted(),
		Demand:     gr.GetDemandRuPerSec(),
		ReportOnly: gr.GetReportOnly(),
		Held:       gr.GetHeldTokens(),
	}
}

func grantToPB(name string, g Grant) *pb.GroupGrant {
	return &pb.GroupGrant{
		Group:           name,
		Tokens:          g.Tokens,
		ImmediateTokens: g.Immediate,
		TrickleMs:       g.Trickle.Milliseconds(),
		FillRate:        g.FillRate,
		SettingsVersion: g.Version,
		Proxies:         uint32(g.Proxies),
		Unlimited:       g.Unlimited,
		RuPerSec:        g.RUPerSec,
	}
}

// attachBudgets adds to resp the budget verdicts of its groups that the
// stream has not sent yet.
func (s *Server) attachBudgets(resp *pb.TokenResponse, sent *budgetSent) {
	names := make([]string, 0, len(resp.GetGrants()))
	for _, g := range resp.GetGrants() {
		if g.GetError() == "" {
			names = append(names, g.GetGroup())
		}
	}
	if len(names) == 0 {
		return
	}
	s.mu.Lock()
	resp.Budgets = s.budgetUpdatesLocked(sent, names, s.now())
	s.mu.Unlock()
}
