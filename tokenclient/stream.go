package tokenclient

import (
	"context"
	"errors"
	"fmt"
	"github.com/pingcap/failpoint"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rgproxy/rgproxy/internal/netaddr"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// notLeaderError ends a stream whose server is not the leader.
type notLeaderError struct{ leader string }

func (e *notLeaderError) Error() string {
	return fmt.Sprintf("token server is not the leader (leader %q)", e.leader)
}

// errStuck ends a stream whose request went unanswered for DegradedAfter.
var errStuck = errors.New("token request unanswered")

// tokenStream is the token stream's own state: its table of requests
// awaiting their answer, whether it is connected, and Close's final
// report.
//
// Concurrency contract: mu guards the fields below it. It is taken by the
// stream's two goroutines only — the send loop (tokenLoop: runStream's
// loop, finalReport, streamEnded) registers requests and ends the stream,
// the receiving goroutine (applyResponse) takes a request out when its
// answer comes — and held by no other lock's holder nor while taking
// another: each method takes it alone, for a few map operations. Every
// change publishes status, the immutable streamStatus that anyone (the
// groups under their lock, Close, the console) reads without a lock.
type tokenStream struct {
	// published is what the others may read of the stream (status).
	published atomic.Pointer[streamStatus]
	// flush: Close asks the send loop for a final report.
	flush chan chan struct{}

	mu          sync.Mutex
	connected   bool      // a stream is open and has answered
	lostAt      time.Time // when the last answering stream ended (or New)
	outstanding map[uint64]*sentRequest
	nextReqID   uint64
	finalID     uint64        // the request id of Close's final report
	finalAck    chan struct{} // closed when that report is answered
	// droppedTokens counts granted tokens a dropGrant failpoint discarded.
	droppedTokens float64
}

// streamStatus is the token stream's state as the groups see it; never
// changed once published.
type streamStatus struct {
	// connected: a stream is open and has answered.
	connected bool
	// lostAt is when the last answering stream ended (or New).
	lostAt time.Time
	// silentSince is when rgserver was last heard from, as degraded mode
	// counts: lostAt while not connected, else the sending of the oldest
	// request not answered yet; zero when nothing waits for an answer.
	silentSince time.Time
}

func newTokenStream(now time.Time) *tokenStream {
	s := &tokenStream{flush: make(chan chan struct{}), lostAt: now, outstanding: map[uint64]*sentRequest{}}
	s.publishLocked()
	return s
}

// status returns the stream's state, without a lock.
func (s *tokenStream) status() *streamStatus { return s.published.Load() }

// publishLocked publishes the stream's state; mu is held (or s is new).
func (s *tokenStream) publishLocked() {
	st := &streamStatus{connected: s.connected, lostAt: s.lostAt}
	if !s.connected {
		st.silentSince = s.lostAt
	} else {
		for _, r := range s.outstanding {
			if st.silentSince.IsZero() || r.at.Before(st.silentSince) {
				st.silentSince = r.at
			}
		}
	}
	s.published.Store(st)
}

// register gives req its id and records it, with what it carried, as
// awaiting its answer. The send loop calls it before sending req.
func (s *tokenStream) register(req *tokenpb.TokenRequest, sent *sentRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextReqID++
	req.RequestId = s.nextReqID
	s.outstanding[req.RequestId] = sent
	s.publishLocked()
}

// registerFinal gives Close's final report req its id and returns the
// channel closed once it is answered.
func (s *tokenStream) registerFinal(req *tokenpb.TokenRequest) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextReqID++
	req.RequestId = s.nextReqID
	s.finalID, s.finalAck = req.RequestId, make(chan struct{})
	return s.finalAck
}

// answered takes request id out of the table and returns what it carried
// (nil: unknown, or the final report). ok: the answer is not NOT_LEADER,
// so the stream is connected; reconnected: it was not before. final, when
// not nil, is the final report's channel, for the caller to close once
// the answer is applied.
func (s *tokenStream) answered(id uint64, ok bool) (sent *sentRequest, reconnected bool, final chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sent = s.outstanding[id]
	delete(s.outstanding, id)
	if s.finalAck != nil && id == s.finalID {
		final, s.finalAck = s.finalAck, nil
	}
	if ok {
		reconnected = !s.connected
		s.connected = true
	}
	s.publishLocked()
	return sent, reconnected, final
}

// ended forgets the requests of a stream that ended at now.
func (s *tokenStream) ended(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.connected {
		s.connected = false
		s.lostAt = now
	}
	clear(s.outstanding)
	s.publishLocked()
}

// oldest is how long the oldest request awaiting its answer has waited
// at now (0: none).
func (s *tokenStream) oldest(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var d time.Duration
	for _, r := range s.outstanding {
		d = max(d, now.Sub(r.at))
	}
	return d
}

// conn returns the (lazily dialled) connection to addr.
func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	return c.conns.get(addr, c.dial)
}

// dial makes a connection to addr.
func (c *Client) dial(addr string) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if c.cfg.TLS != nil {
		creds = credentials.NewTLS(c.cfg.TLS)
	}
	// gRPC's own reconnect backoff grows to two minutes; after an outage
	// that would hold the proxy degraded long after rgserver is back.
	// Keep it short: a proxy must resync within seconds.
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: backoffMin, Multiplier: 1.6, Jitter: 0.2, MaxDelay: backoffMax},
			MinConnectTimeout: 2 * time.Second,
		})}
	if c.cfg.AdminToken != "" || c.cfg.ProxyToken != "" {
		bc := bearerCreds{proxy: c.cfg.ProxyToken, admin: c.cfg.AdminToken,
			requireTLS: !c.cfg.InsecureTokens && !netaddr.IsLoopback(addr)}
		if bc.requireTLS && c.cfg.TLS == nil {
			// A NOT_LEADER redirect may name an address Config did not.
			return nil, fmt.Errorf("%w: rgserver %s is not a loopback address: its credentials would travel in clear; dial it with TLS, or allow it explicitly", ErrConfig, addr)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bc))
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("tokenclient: dial %s: %w", addr, err)
	}
	return cc, nil
}

// bearerCreds sends rgserver's bearer token on every call of a
// connection: the admin token on calls made by call (writes, marked by
// adminCall), the proxy token on the others; either one when only it is
// configured. With requireTLS, gRPC refuses to send it over a
// connection without transport security.
type bearerCreds struct {
	proxy, admin string
	requireTLS   bool
}

// adminCall marks the context of a ResourceGroupService write.
type adminCall struct{}

func (b bearerCreds) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	tok := b.proxy
	if (ctx.Value(adminCall{}) != nil && b.admin != "") || tok == "" {
		tok = b.admin
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

func (b bearerCreds) RequireTransportSecurity() bool { return b.requireTLS }

// backoff is the wait before reconnect attempt n (1-based): exponential
// from backoffMin to backoffMax, with jitter so proxies do not reconnect in
// step.
func backoff(n int) time.Duration {
	d := backoffMax
	if n < 16 {
		d = min(backoffMin<<max(n-1, 0), backoffMax)
	}
	return d/2 + rand.N(d/2+1)
}

// maxRedirects bounds the NOT_LEADER hops followed in a row before the
// next server of Servers is tried: replicas that disagree about the
// leader must not bounce a stream between them.
const maxRedirects = 3

// leaderStream is one stream a client keeps open to the leader: the
// token stream and the inspect stream.
type leaderStream struct {
	// name names the stream in the logs.
	name string
	// level logs the reconnects: Warn for the token stream, which the
	// proxy needs, Debug for the inspect stream, which it can do without.
	level slog.Level
	// run runs one stream to addr until it ends; steady says that it went
	// well long enough for the backoff to start over.
	run func(ctx context.Context, addr string) (steady bool, err error)
	// wait waits d before the next attempt; false once ctx has ended.
	wait func(ctx context.Context, d time.Duration) bool
}

// followLeader keeps ls open to the leader until ctx ends: it follows
// NOT_LEADER redirects (at most maxRedirects in a row), and after other
// ends rotates through Servers with backoff.
func (c *Client) followLeader(ctx context.Context, ls leaderStream) {
	idx, attempt, redirects := 0, 0, 0
	redirect := ""
	for {
		addr := c.cfg.Servers[idx]
		if redirect != "" {
			addr = redirect
		}
		steady, err := ls.run(ctx, addr)
		if ctx.Err() != nil {
			return
		}
		if steady {
			attempt = 0
		}
		if nl, ok := errors.AsType[*notLeaderError](err); ok && nl.leader != "" && nl.leader != addr && redirects < maxRedirects {
			c.log.Log(ctx, min(ls.level, slog.LevelInfo), "following the token server leader", "stream", ls.name, "from", addr, "to", nl.leader)
			redirect = nl.leader
			redirects++
			continue
		}
		redirect, redirects = "", 0
		idx = (idx + 1) % len(c.cfg.Servers)
		attempt++
		d := backoff(attempt)
		c.log.Log(ctx, ls.level, ls.name+" stream ended; reconnecting", "server", addr, "err", err, "backoff", d.String())
		if !ls.wait(ctx, d) {
			return
		}
	}
}

// tokenLoop keeps one AcquireTokens stream open to the leader until ctx
// ends (followLeader).
func (c *Client) tokenLoop(ctx context.Context) {
	c.followLeader(ctx, leaderStream{name: "token", level: slog.LevelWarn,
		run: func(ctx context.Context, addr string) (bool, error) {
			answered, err := c.runStream(ctx, addr)
			c.streamEnded()
			return answered, err
		},
		wait: c.pause,
	})
}

// pause waits d, keeping degraded mode up to date meanwhile; false when ctx
// ended.
func (c *Client) pause(ctx context.Context, d time.Duration) bool {
	end := c.clk.Now().Add(d)
	for {
		now := c.clk.Now()
		c.groups.mu.Lock()
		c.groups.tickLocked(now)
		c.groups.mu.Unlock()
		left := end.Sub(now)
		if left <= 0 {
			return true
		}
		if err := c.sleep(ctx, min(left, tick)); err != nil {
			return false
		}
	}
}

// streamEnded forgets the requests of a stream that ended: their groups
// may ask again on the next stream. The stream's receiving goroutine has
// returned: nothing answers meanwhile.
func (c *Client) streamEnded() {
	c.stream.ended(c.clk.Now())
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	for _, gs := range c.groups.byName {
		gs.inFlight = false
	}
}

// runStream runs one AcquireTokens stream to addr until it fails; answered
// tells whether the server answered at least once.
func (c *Client) runStream(ctx context.Context, addr string) (answered bool, err error) {
	cc, err := c.conn(addr)
	if err != nil {
		return false, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := tokenpb.NewTokenServiceClient(cc).AcquireTokens(sctx)
	if err != nil {
		return false, fmt.Errorf("open token stream to %s: %w", addr, err)
	}
	recvErr := make(chan error, 1)
	recvDone := make(chan struct{})
	var gotAnswer atomic.Bool
	go func() {
		defer close(recvDone)
		for {
			resp, err := stream.Recv()
			failpoint.Inject("tokenStreamRecvError", func() {
				err = errFailpoint
			})
			if err != nil {
				recvErr <- fmt.Errorf("token stream from %s: %w", addr, err)
				return
			}
			failpoint.Inject("delayGrant", func(val failpoint.Value) {
				// A grant that arrives late: the rgserver or network stalls.
				if ms, ok := val.(int); ok {
					time.Sleep(time.Duration(ms) * time.Millisecond)
				}
			})
			if carriesTokens(resp) {
				failpoint.Inject("dropGrant", func() {
					// The stream breaks with a grant in flight: rgserver
					// counted it, this proxy never applies it.
					c.lostGrant(resp)
					recvErr <- fmt.Errorf("token stream from %s: %w", addr, errFailpoint)
					failpoint.Return()
				})
			}
			if err := c.applyResponse(resp); err != nil {
				recvErr <- err
				return
			}
			gotAnswer.Store(true)
		}
	}()
	defer func() { // answered is decided here, whatever the return says
		cancel()
		<-recvDone
		answered = gotAnswer.Load()
	}()

	force := true // the first request carries every group: a resync
	for {
		now := c.clk.Now()
		stuck := c.stream.oldest(now) >= c.cfg.DegradedAfter
		c.groups.mu.Lock()
		c.groups.tickLocked(now)
		var req *tokenpb.TokenRequest
		var sent *sentRequest
		if !stuck {
			req, sent = c.groups.buildRequestLocked(now, force, false)
		}
		c.groups.mu.Unlock()
		if stuck {
			return false, fmt.Errorf("%s: %w", addr, errStuck)
		}
		if req != nil {
			c.stream.register(req, sent)
		}
		if req != nil && force {
			// The first message says what this proxy can enforce.
			req.Capabilities = &tokenpb.ProxyCapabilities{CanKill: c.cfg.Capabilities.CanKill,
				Instance: c.cfg.Capabilities.Instance, Version: c.cfg.Capabilities.Version}
		}
		if req != nil {
			force = false
			failpoint.Inject("tokenStreamSendError", func() {
				failpoint.Return(false, fmt.Errorf("send token request to %s: %w", addr, errFailpoint))
			})
			if err := stream.Send(req); err != nil {
				return false, fmt.Errorf("send token request to %s: %w", addr, err)
			}
		}
		t := c.clk.NewTimer(tick)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		case err := <-recvErr:
			t.Stop()
			return false, err
		case <-c.groups.kick:
		case <-t.C():
		case done := <-c.stream.flush:
			c.finalReport(ctx, stream, recvErr)
			close(done)
		}
		t.Stop()
	}
}

// finalReport sends every group's unreported consumption and waits (at
// most a second) for the answer, so that it is recorded before the stream
// is torn down. Best effort: the client is closing.
func (c *Client) finalReport(ctx context.Context, stream tokenpb.TokenService_AcquireTokensClient, recvErr <-chan error) {
	c.groups.mu.Lock()
	req, _ := c.groups.buildRequestLocked(c.clk.Now(), false, true)
	c.groups.mu.Unlock()
	if req == nil {
		return
	}
	ack := c.stream.registerFinal(req)
	if err := stream.Send(req); err != nil {
		return
	}
	t := c.clk.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-ack:
	case <-recvErr:
	case <-t.C():
	case <-ctx.Done():
	}
}

// buildRequestLocked builds the next TokenRequest at now, or nil when no
// group needs to send anything. A group is in it when it needs tokens (its
// bucket ran low, or statements wait) and may ask (no request in flight,
// minAskInterval passed, no trickle with more than trickleLead left), or
// when its consumption is due (ReportPeriod passed), or when it is idle
// and what its bucket holds moved since its last message (an idle group
// past releaseAfter gives its tokens back here first); once a message goes
// out, every group with unreported consumption rides along. force puts
// every idle group in (as report-only when it needs nothing); final sends
// every group's consumption report-only. The request has no id yet: the
// token stream gives it one when it registers it with sent, what the
// request carried (tokenStream.register; nil when final).
func (t *groupTable) buildRequestLocked(now time.Time, force, final bool) (*tokenpb.TokenRequest, *sentRequest) {
	if force {
		t.stateLocked(resourcegroup.DefaultGroup, now) // something to ask even when idle
	}
	var asks, reports []*groupState
	for _, gs := range t.byName {
		if (gs.inFlight && !final) || gs.dead {
			continue
		}
		gs.updateEWMA(now)
		trickleLeft, _ := gs.trickleLeft(now)
		if !final && !gs.bucket.Unlimited() && !now.Before(gs.nextAsk) && (trickleLeft <= trickleLead || gs.askNow) {
			if gs.want || gs.unavailable || len(gs.queue) > 0 || gs.bucket.LowTokens(now) {
				asks = append(asks, gs)
				continue
			}
			gs.askNow = false // nothing to ask for: its next ask gets the new rate
		}
		due := gs.hasReport() && now.Sub(gs.lastReport) >= t.reportPeriodLocked(gs)
		// A group that went quiet says at once that it wants nothing
		// more: rgserver shares its part of a parent's rate or of the
		// service limit among the groups still running.
		due = due || (!final && gs.demandSent > 0 && !gs.bucket.Unlimited() && gs.quiet(now) && t.sharesLocked(gs))
		if !final && trickleLeft == 0 && !gs.bucket.Unlimited() && !t.degraded && len(gs.queue) == 0 && !gs.hasReport() {
			// Idle, its trickle over: what the bucket holds no longer
			// changes. After releaseAfter it is given back; either way
			// rgserver hears once what this proxy holds, so its own bucket
			// saves only the rest of the group's capacity.
			if now.Sub(gs.lastUsed) >= releaseAfter {
				gs.bucket.Release(now)
			}
			due = due || math.Abs(gs.held(now)-gs.heldSent) > heldSlack
		}
		if force || due || (final && gs.hasReport()) {
			reports = append(reports, gs)
		}
	}
	if len(asks) == 0 && len(reports) == 0 {
		return nil, nil
	}
	if !final {
		// Piggyback every pending report on a message that goes anyway.
		for _, gs := range t.byName {
			if !gs.inFlight && !gs.dead && gs.hasReport() && !contains(asks, gs) && !contains(reports, gs) {
				reports = append(reports, gs)
			}
		}
	}
	req := &tokenpb.TokenRequest{ProxyId: t.cfg.ProxyID}
	sent := &sentRequest{at: now, reports: map[string]ru.Consumption{}, extras: map[string]sentExtras{}, asked: map[string]bool{}}
	add := func(gs *groupState, ask bool) {
		cons := gs.takeReport()
		gr := &tokenpb.GroupTokenRequest{
			Group:          gs.name,
			DemandRuPerSec: t.reportedDemandLocked(gs, now, ask),
			WaitingTokens:  max(gs.waiting, 0),
			Consumption:    consumptionToPB(cons),
			ReportOnly:     !ask,
			HeldTokens:     gs.held(now),
		}
		gs.counts.fill(gr.Consumption)
		gr.Consumption.Chargeback = gs.charge.take()
		gr.Consumption.IntervalMs = intervalMs(now.Sub(gs.reportFrom))
		if !gs.lastFigure.Before(gs.reportFrom) {
			gr.Consumption.IdleMs = min(uint32(max(now.Sub(gs.lastFigure).Milliseconds(), 0)), gr.Consumption.IntervalMs)
		}
		sent.extras[gs.name] = sentExtras{counts: gs.counts, from: gs.reportFrom, charge: gr.Consumption.Chargeback}
		gs.counts = reportCounts{}
		gs.reportFrom = now
		gs.heldSent, gs.demandSent = gr.HeldTokens, gr.DemandRuPerSec
		if ask {
			gr.TokensWanted = gs.wanted(now, t.cfg.TargetPeriod)
			gs.want, gs.askNow = false, false
		}
		gs.resetWaiting(now)
		gs.lastReport = now
		gs.inFlight = !final
		sent.reports[gs.name] = cons
		sent.asked[gs.name] = ask
		req.Groups = append(req.Groups, gr)
		t.met.requests.WithLabelValues(gs.name).Inc()
	}
	for _, gs := range asks {
		add(gs, true)
	}
	for _, gs := range reports {
		add(gs, false)
	}
	if final {
		return req, nil
	}
	return req, sent
}

func contains(list []*groupState, gs *groupState) bool {
	for _, x := range list {
		if x == gs {
			return true
		}
	}
	return false
}

// wanted is the request size: demand × period × 1.1 − tokens left (not
// counting a running trickle's remainder, which the grant replaces), at
// least what waiting statements are short of, and at least minRequest.
func (gs *groupState) wanted(now time.Time, period time.Duration) float64 {
	left := gs.bucket.Tokens(now)
	w := gs.demand(now)*period.Seconds()*requestHeadroom - left
	w = max(w, gs.waiting-left, minRequest)
	if math.IsInf(w, 0) || math.IsNaN(w) {
		return minRequest
	}
	return w
}

// heldSlack: an idle group reports what it holds when that moved by more
// than this (RU) since its last message.
const heldSlack = 0.5

// held is what gs's bucket holds at now for held_tokens: its tokens, 0
// in debt or when the group is never throttled.
func (gs *groupState) held(now time.Time) float64 {
	if gs.bucket.Unlimited() {
		return 0
	}
	return max(gs.bucket.Tokens(now), 0)
}

// hasReport: some consumption (positive; see takeReport), refusals or
// demand that waited can be reported.
func (gs *groupState) hasReport() bool {
	p := gs.pending
	return p.RRU > 0 || p.WRU > 0 || p.ReadBytes >= 1 || p.WriteBytes >= 1 || p.BackendSeconds > 0 || p.CPUSeconds > 0 || p.Statements >= 1 ||
		gs.counts != (reportCounts{}) || !gs.charge.empty()
}

// takeReport returns the consumption to report and keeps what cannot be
// sent: rgserver takes no negative numbers, so a net refund waits to be
// netted against later consumption.
func (gs *groupState) takeReport() ru.Consumption {
	p := gs.pending
	sent := ru.Consumption{
		RRU:            max(p.RRU, 0),
		WRU:            max(p.WRU, 0),
		ReadBytes:      max(math.Floor(p.ReadBytes), 0),
		WriteBytes:     max(math.Floor(p.WriteBytes), 0),
		BackendSeconds: max(p.BackendSeconds, 0),
		Statements:     max(math.Floor(p.Statements), 0),
		CPUSeconds:     max(p.CPUSeconds, 0),
	}
	p.Sub(sent)
	gs.pending = p
	return sent
}

func consumptionToPB(c ru.Consumption) *tokenpb.Consumption {
	return &tokenpb.Consumption{
		Rru:               c.RRU,
		Wru:               c.WRU,
		ReadBytes:         uint64(c.ReadBytes),
		WriteBytes:        uint64(c.WriteBytes),
		BackendSeconds:    c.BackendSeconds,
		Statements:        uint64(c.Statements),
		BackendCpuSeconds: c.CPUSeconds,
	}
}

// applyResponse applies one TokenResponse: first to the stream's table
// of requests, then to the groups. A NOT_LEADER answer returns a
// *notLeaderError after putting its request's consumption back (the server
// did not record it).
func (c *Client) applyResponse(resp *tokenpb.TokenResponse) error {
	now := c.clk.Now()
	sent, reconnected, final := c.stream.answered(resp.GetRequestId(), resp.GetNotLeader() == nil)
	if resp.GetNotLeader() == nil {
		defer c.groups.budgetsChanged(now, c.budgets.apply(now, resp.GetBudgets(), c.log), &c.budgets)
	}
	err := c.groups.apply(now, resp, sent, reconnected)
	if final != nil {
		close(final) // Close's final report is in
	}
	c.groups.notifyForgotten()
	return err
}

// apply brings the groups up to date with a response whose request was
// sent (nil: unknown, or Close's final report); reconnected: it is the
// first answer of the stream.
func (t *groupTable) apply(now time.Time, resp *tokenpb.TokenResponse, sent *sentRequest, reconnected bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if nl := resp.GetNotLeader(); nl != nil {
		if sent != nil {
			for name, cons := range sent.reports {
				if gs, ok := t.byName[name]; ok {
					gs.pending.Add(cons)
					gs.restoreExtras(sent.extras[name])
					gs.inFlight = false
				}
			}
		}
		return &notLeaderError{leader: nl.GetLeaderAddr()}
	}
	if sent != nil {
		t.met.duration.Observe(now.Sub(sent.at).Seconds())
	}
	if resp.GetRequestId() != 0 {
		// An answer (not a budget's push) says whether a service limit
		// is in force.
		t.serviceLimitedLocked(now, resp.GetServiceLimited())
	}
	if reconnected {
		t.endBridgeLocked(now)
	}
	if t.degraded {
		t.degraded = false
		t.log.Info("token grants resumed: leaving degraded mode")
		for _, gs := range t.byName {
			// Stop the local refill; the groups ask again at once.
			gs.bucket.Reconfigure(now, 0, 0, 0, gs.threshold(now))
			gs.trickleUntil = time.Time{}
			gs.want = true
		}
		t.kickLocked()
	}
	for _, g := range resp.GetGrants() {
		gs, ok := t.byName[g.GetGroup()]
		if !ok {
			continue
		}
		gs.inFlight = false
		gs.nextAsk = now.Add(minAskInterval)
		if g.GetError() != "" && grantUnavailable(g) {
			// A passing etcd error must not lift the group's limit: keep
			// its settings and bucket, refill locally, ask again later.
			if !gs.unavailable {
				t.log.Warn("rgserver cannot serve a group for now: refilling it locally", "resource_group", gs.name, "err", g.GetError())
				gs.unavailable = true
				t.localRefillLocked(now, gs)
			}
			gs.nextAsk = now.Add(unavailableRetry)
			continue
		}
		if g.GetError() != "" {
			t.log.Warn("rgserver refused a group", "resource_group", gs.name, "err", g.GetError())
			if gs.name == resourcegroup.DefaultGroup {
				// default cannot be dropped: its state starts again at
				// its next use, its series stay.
				gs.dead = true
				gs.wake()
				delete(t.byName, gs.name)
				continue
			}
			t.dropLocked(gs)
			continue
		}
		if gs.unavailable && !t.degraded {
			// Served again: stop the local refill; the grant below, or the
			// group's next ask, feeds the bucket.
			gs.unavailable = false
			gs.bucket.Reconfigure(now, 0, 0, 0, gs.threshold(now))
			gs.trickleUntil = time.Time{}
			gs.want = true
			t.kickLocked()
		}
		gs.unavailable = false
		gs.granted = true
		if t.staleModeLocked(gs, g) {
			// Made under the settings before the cache's: the cache's
			// mode stands, and the group asks again under the new ones.
			t.refreshGroupLocked(now, gs)
			if !gs.bucket.Unlimited() {
				gs.want = true
				t.kickLocked()
			}
			continue
		}
		gs.proxies = g.GetProxies()
		gs.ruPerSec = g.GetRuPerSec()
		gs.shareRate = g.GetFillRate()
		gs.holdCap = t.holdCapLocked(gs)
		if g.GetUnlimited() {
			gs.bucket.SetUnlimited(true)
			gs.wake()
			continue
		}
		if gs.bucket.Unlimited() {
			gs.bucket.SetUnlimited(false)
		}
		if sent != nil && !sent.asked[gs.name] && g.GetTokens() == 0 {
			continue // a report's answer: keep the bucket (and any trickle) as it is
		}
		// A grant replaces what is left of the running trickle: rgserver
		// released that part of its reservation when it granted, so
		// carrying it over would spend it twice. Nor does it count what the
		// old trickle delivered here while the request was on its way (a
		// slow round trip would otherwise add up, renewal after renewal):
		// take that back.
		if sent != nil && !gs.trickleUntil.IsZero() {
			end := gs.trickleUntil
			if now.Before(end) {
				end = now
			}
			if d := end.Sub(sent.at); d > 0 {
				gs.bucket.Take(now, gs.trickleRate*d.Seconds())
			}
		}
		// A first grant's share of the global bucket comes at once, besides
		// the trickle (a negative or NaN one counts as none).
		imm := g.GetImmediateTokens()
		if !(imm > 0) {
			imm = 0
		}
		gs.received += g.GetTokens() + imm
		t.met.granted.WithLabelValues(gs.name).Add(g.GetTokens() + imm)
		if ms := g.GetTrickleMs(); ms > 0 {
			d := time.Duration(ms) * time.Millisecond
			gs.bucket.Grant(now, imm, g.GetTokens(), d, gs.holdCap, gs.threshold(now))
			gs.trickleUntil = now.Add(d)
			gs.trickleRate = g.GetTokens() / d.Seconds()
		} else {
			gs.bucket.Reconfigure(now, g.GetTokens()+imm, 0, 0, gs.threshold(now))
			gs.trickleUntil = time.Time{}
			gs.trickleRate = 0
		}
		gs.wake()
	}
	t.askAgainLocked(resp.GetAskAgain())
	return nil
}

// staleModeLocked reports whether grant g, for gs, was made under settings
// older than the cache's (the group was altered while the request was on
// its way) and says otherwise than the cache whether the group is
// unlimited. Applied, it would undo the cache: an ALTER … MODE = ENFORCE
// answered by a grant made in MODE WARN left the bucket unlimited, and
// an unlimited bucket never asks, so the group ran unthrottled until its
// next report's answer. A grant without a version (an older rgserver) is
// never stale. t.mu is held.
func (t *groupTable) staleModeLocked(gs *groupState, g *tokenpb.GroupGrant) bool {
	v := g.GetSettingsVersion()
	def, ok := t.cache.group(gs.name)
	return v > 0 && ok && v < def.Version && g.GetUnlimited() != t.unlimitedLocked(def)
}

// maxAskAgain bounds the names of an ask_again list that are read.
const maxAskAgain = 256

// askAgainLocked marks the groups rgserver named in ask_again (their rate
// moved at a rebalance) to ask again at the next send, without waiting
// for the running trickle to near its end. Names this proxy does not run
// are ignored. Called with t.mu held.
func (t *groupTable) askAgainLocked(names []string) {
	kick := false
	for _, name := range names[:min(len(names), maxAskAgain)] {
		if gs, ok := t.byName[name]; ok && !gs.dead {
			gs.askNow, kick = true, true
		}
	}
	if kick {
		t.kickLocked()
	}
}

// unavailableRetry spaces the asks of a group rgserver could not serve
// (each costs it an etcd read).
const unavailableRetry = time.Second

// grantUnavailable reports whether a failed grant is a passing failure
// (the group must keep its limit) rather than an unknown group. Older
// servers send no code, only the error text.
func grantUnavailable(g *tokenpb.GroupGrant) bool {
	switch g.GetErrorCode() {
	case tokenpb.GrantError_GRANT_ERROR_UNAVAILABLE:
		return true
	case tokenpb.GrantError_GRANT_ERROR_NOT_FOUND:
		return false
	}
	return strings.HasPrefix(g.GetError(), "unavailable:")
}

// sentRequest is a TokenRequest awaiting its answer.
type sentRequest struct {
	at      time.Time
	reports map[string]ru.Consumption // consumption sent per group
	extras  map[string]sentExtras     // counts and interval sent per group
	asked   map[string]bool           // group → tokens were asked (not report-only)
}

// reportCounts are what a group's report carries besides its consumption:
// the statements refused (throttled with 8252, or refused otherwise) and
// the RU (their estimates) of the statements that waited for tokens or
// never ran. Counted under the groups' lock with the consumption.
type reportCounts struct {
	throttled, refused uint64
	waitedRU, deniedRU float64
}

// fill sets c's fields of the report pb.
func (c reportCounts) fill(pb *tokenpb.Consumption) {
	pb.Throttled, pb.Refused, pb.WaitedRu, pb.DeniedRu = c.throttled, c.refused, c.waitedRU, c.deniedRU
}

// sentExtras is what a request carried of a group besides its
// consumption: its counts and the start of the interval it covered.
type sentExtras struct {
	counts reportCounts
	from   time.Time
	// charge is the report's chargeback.
	charge []*tokenpb.ChargebackEntry
}

// restoreExtras puts back what a request rgserver did not take carried:
// its counts, and the start of its interval, so that the next report
// covers the time since the last report rgserver took.
func (gs *groupState) restoreExtras(e sentExtras) {
	gs.counts.throttled += e.counts.throttled
	gs.counts.refused += e.counts.refused
	gs.counts.waitedRU += e.counts.waitedRU
	gs.counts.deniedRU += e.counts.deniedRU
	gs.charge.restore(e.charge)
	if !e.from.IsZero() && e.from.Before(gs.reportFrom) {
		gs.reportFrom = e.from
	}
}

// maxIntervalMs caps Consumption.interval_ms (rgserver takes at most a
// minute).
const maxIntervalMs = 60_000

// intervalMs is d as a report's interval_ms: at least 1 (0 would say the
// proxy does not tell), at most maxIntervalMs.
func intervalMs(d time.Duration) uint32 {
	return uint32(min(max(d.Milliseconds(), 1), maxIntervalMs))
}
