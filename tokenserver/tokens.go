package tokenserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
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

// validateTokenRequest checks one stream message. proxyID is the id the
// stream started with ("" before the first message).
func validateTokenRequest(req *pb.TokenRequest, proxyID string) error {
	if req.GetProxyId() == "" {
		return errors.New("proxy_id is empty")
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

// AcquireTokens implements tokenpb.TokenServiceServer.
func (s *Server) AcquireTokens(stream grpc.BidiStreamingServer[pb.TokenRequest, pb.TokenResponse]) error {
	var proxyID string
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		start := time.Now()
		if err := validateTokenRequest(req, proxyID); err != nil {
			return status.Errorf(codes.InvalidArgument, "malformed token request: %v", err)
		}
		proxyID = req.GetProxyId()
		var resp *pb.TokenResponse
		if s.IsLeader() {
			resp = s.serveTokens(stream.Context(), req)
		} else {
			resp = &pb.TokenResponse{RequestId: req.GetRequestId(), NotLeader: &pb.NotLeader{LeaderAddr: s.LeaderAddr()}}
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		s.m.acquireSeconds.Observe(time.Since(start).Seconds())
	}
}

// serveTokens answers one validated request as the leader. Consumption is
// counted only for groups that exist.
func (s *Server) serveTokens(ctx context.Context, req *pb.TokenRequest) *pb.TokenResponse {
	now := s.now()
	resp := &pb.TokenResponse{RequestId: req.GetRequestId(), Grants: make([]*pb.GroupGrant, len(req.GetGroups()))}
	var missing []int
	s.mu.Lock()
	for i, gr := range req.GetGroups() {
		name := resourcegroup.NormalizeName(gr.GetGroup())
		g, err := s.alloc.Acquire(name, allocRequest(req.GetProxyId(), gr), now)
		if err != nil {
			missing = append(missing, i)
			continue
		}
		s.alloc.Report(name, usageOf(gr.GetConsumption()))
		resp.Grants[i] = grantToPB(name, g)
		if s.log.Enabled(ctx, slog.LevelDebug) && !gr.GetReportOnly() {
			s.log.Debug("grant", "resource_group", name, "proxy", req.GetProxyId(),
				"demand", gr.GetDemandRuPerSec(), "wanted", gr.GetTokensWanted(),
				"tokens", g.Tokens, "trickle", g.Trickle, "share", g.FillRate)
		}
	}
	s.mu.Unlock()
	for _, i := range missing {
		resp.Grants[i] = s.serveMissing(ctx, req.GetProxyId(), req.GetGroups()[i], now)
	}
	return resp
}

// serveMissing handles a group the allocator does not know yet: it may have
// been created a moment ago, before the settings watch caught up. When etcd
// cannot say, the error is GRANT_ERROR_UNAVAILABLE, which a proxy must not
// take for a dropped group (that would lift its limit).
func (s *Server) serveMissing(ctx context.Context, proxyID string, gr *pb.GroupTokenRequest, now time.Time) *pb.GroupGrant {
	name := resourcegroup.NormalizeName(gr.GetGroup())
	// Bounded: while etcd is away this read must not hold up the proxy's
	// whole stream (its other groups' grants wait behind it).
	rctx, cancel := etcdCall(ctx)
	g, err := s.store.GetGroup(rctx, name)
	cancel()
	if err != nil {
		if errors.Is(err, resourcegroup.ErrNotFound) {
			return &pb.GroupGrant{Group: name, Error: err.Error(), ErrorCode: pb.GrantError_GRANT_ERROR_NOT_FOUND}
		}
		return &pb.GroupGrant{Group: name, Error: "unavailable: " + err.Error(), ErrorCode: pb.GrantError_GRANT_ERROR_UNAVAILABLE}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.alloc.Group(name) == nil {
		s.alloc.SetGroup(name, SettingsOf(g), now)
	}
	grant, err := s.alloc.Acquire(name, allocRequest(proxyID, gr), now)
	if err != nil {
		// Dropped between the read and now.
		return &pb.GroupGrant{Group: name, Error: err.Error(), ErrorCode: pb.GrantError_GRANT_ERROR_NOT_FOUND}
	}
	s.alloc.Report(name, usageOf(gr.GetConsumption()))
	return grantToPB(name, grant)
}

// usageOf converts a reported consumption.
func usageOf(c *pb.Consumption) ru.Consumption {
	return ru.Consumption{RRU: c.GetRru(), WRU: c.GetWru(), ReadBytes: float64(c.GetReadBytes()), WriteBytes: float64(c.GetWriteBytes()),
		BackendSeconds: c.GetBackendSeconds(), Statements: float64(c.GetStatements())}
}

func allocRequest(proxyID string, gr *pb.GroupTokenRequest) Request {
	return Request{
		ProxyID:    proxyID,
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
		TrickleMs:       g.Trickle.Milliseconds(),
		FillRate:        g.FillRate,
		SettingsVersion: g.Version,
		Proxies:         uint32(g.Proxies),
		Unlimited:       g.Unlimited,
		RuPerSec:        g.RUPerSec,
	}
}
