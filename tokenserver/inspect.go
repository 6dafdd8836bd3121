package tokenserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// Cluster-wide views (InspectService, docs/design.md §7.7). Pull, not
// push: each proxy keeps one Inspect stream open to the leader and sends
// nothing on it after its hello until asked, so the views cost nothing
// while nobody looks. ClusterInspect sends one request down every
// stream the leader holds and answers with the replies that came within
// inspectWait. Everything is bounded: calls at once, requests queued per
// stream, the bytes of rows one proxy may add to an answer and those of
// the whole answer; a proxy that does not answer holds nothing once the
// call is over, and one whose stream ends is counted unanswered at once.

// Bounds of the cluster views.
const (
	// inspectWait is how long ClusterInspect waits for the proxies'
	// replies (less when the caller's deadline comes sooner): with the
	// caller's round trip and the backend's evaluation of the rows it fits in
	// a second even when a proxy does not answer.
	inspectWait = 500 * time.Millisecond
	// inspectMargin is what ClusterInspect leaves of its caller's
	// deadline for the answer's way back.
	inspectMargin = 50 * time.Millisecond
	// maxInspectCalls is how many ClusterInspect calls run at once; a
	// call that finds no place before its deadline is ResourceExhausted.
	maxInspectCalls = 4
	// inspectQueue is how many requests wait to be sent on one stream; a
	// proxy whose queue is full (it does not read) is not asked.
	inspectQueue = maxInspectCalls
	// inspectAnswerBytes bounds the rows of one answer (their encoded
	// size), well under gRPC's 4 MiB per message; each proxy gets an
	// equal part, at most inspectReplyBytes.
	inspectAnswerBytes = 2 << 20
	inspectReplyBytes  = 512 << 10
	// maxInspectGroups bounds the group names of one ClusterInspect.
	maxInspectGroups = 1000
	// maxInstanceLen bounds a hello's instance, in bytes.
	maxInstanceLen = 256
	// maxDigestTextLen bounds a statement row's digest text, in bytes.
	maxDigestTextLen = 4096
	// inspectHelloWait bounds the wait for a new stream's hello.
	inspectHelloWait = 10 * time.Second
	// inspectLeaderCheck is how often a stream checks that this replica
	// still leads; a stream of a replica that stepped down is told
	// NOT_LEADER and ends.
	inspectLeaderCheck = time.Second
)

// errInspectBusy: maxInspectCalls ClusterInspect calls held their places
// until the deadline.
var errInspectBusy = errors.New("tokenserver: too many cluster views at once")

// inspectHub is the leader's set of Inspect streams and the fan-out of
// ClusterInspect over them.
type inspectHub struct {
	clk   clock.Clock
	wait  time.Duration
	slots chan struct{}
	ids   atomic.Uint64

	mu      sync.Mutex
	streams map[string]*inspectConn

	duration   prometheus.Histogram
	unanswered prometheus.Counter
}

func newInspectHub(clk clock.Clock) *inspectHub {
	return &inspectHub{
		clk:     clk,
		wait:    inspectWait,
		slots:   make(chan struct{}, maxInspectCalls),
		streams: map[string]*inspectConn{},
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rgserver_cluster_inspect_duration_seconds",
			Help:    "Time to gather one cluster-wide view: until every proxy answered, or 500 ms.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 11),
		}),
		unanswered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rgserver_cluster_inspect_unanswered_total",
			Help: "Proxies that did not answer a cluster-wide view within its 500 ms (stopped, overloaded, not reading), one per view.",
		}),
	}
}

func (h *inspectHub) register(r prometheus.Registerer) error {
	streams := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rgserver_inspect_streams",
		Help: "Proxies with an Inspect stream open to this replica: on the leader, the instances a cluster-wide view asks.",
	}, func() float64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		return float64(len(h.streams))
	})
	for _, c := range []prometheus.Collector{h.duration, h.unanswered, streams} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// rowBound says whether a proxy's row of group may be shown (the group
// exists) and the most executions it may claim: what its credential
// reported (credBook.statementsOf).
type rowBound func(group string) (ok bool, maxExec float64)

// inspectConn is one proxy's Inspect stream.
type inspectConn struct {
	key      string // slotID: the credential and the proxy id
	instance string
	// bound checks each row's group and figures; dropped counts the rows
	// it refused against the credential. nil: every valid row is shown.
	bound   rowBound
	dropped func(n int)
	// queue holds the requests to send; the stream's handler sends them.
	queue chan *pb.InspectRequest
	// superseded is closed when a newer stream of the same key took over.
	superseded chan struct{}
	endOnce    sync.Once

	mu sync.Mutex
	// pending are the calls waiting for this proxy's reply, by request id.
	pending map[uint64]*inspectCall
	gone    bool
}

// inspectCall is one ClusterInspect's wait for replies.
type inspectCall struct {
	kind   pb.InspectKind
	budget int
	keep   map[string]bool // nil: every group
	// replies has room for one answer per proxy asked; a nil rows is a
	// proxy whose stream ended.
	replies chan inspectAnswer
}

type inspectAnswer struct {
	conn *inspectConn
	rows *pb.InstanceRows
}

// add registers a stream; a stream of the same key ends (superseded).
func (h *inspectHub) add(key, instance string) *inspectConn {
	c := &inspectConn{key: key, instance: instance, queue: make(chan *pb.InspectRequest, inspectQueue),
		superseded: make(chan struct{}), pending: map[uint64]*inspectCall{}}
	h.mu.Lock()
	old := h.streams[key]
	h.streams[key] = c
	h.mu.Unlock()
	if old != nil {
		old.endOnce.Do(func() { close(old.superseded) })
	}
	return c
}

// remove forgets a stream that ended: the calls waiting for it count it
// unanswered at once.
func (h *inspectHub) remove(c *inspectConn) {
	h.mu.Lock()
	if h.streams[c.key] == c {
		delete(h.streams, c.key)
	}
	h.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gone = true
	for id, call := range c.pending {
		call.replies <- inspectAnswer{conn: c}
		delete(c.pending, id)
	}
}

// deliver hands a reply to the call waiting for it; a reply nobody waits
// for (late, or never asked) is dropped.
func (c *inspectConn) deliver(r *pb.InspectReply) {
	c.mu.Lock()
	call := c.pending[r.GetRequestId()]
	delete(c.pending, r.GetRequestId())
	c.mu.Unlock()
	if call == nil {
		return
	}
	call.replies <- inspectAnswer{conn: c, rows: call.trim(c.instance, r, c.bound, c.dropped)}
}

// trim keeps of r the valid rows of the call's kind and groups that fit
// the call's budget, in the order the proxy sent them; bound (nil: none)
// refuses rows of groups that do not exist and statement rows claiming
// more executions than the credential reported; dropped counts those and
// the malformed rows.
func (call *inspectCall) trim(instance string, r *pb.InspectReply, bound rowBound, dropped func(int)) *pb.InstanceRows {
	out := &pb.InstanceRows{Instance: instance, Truncated: r.GetTruncated()}
	size := 0
	refused := 0
	seen := map[string]float64{} // group → maxExec, -1: refused
	allowed := func(g string, exec uint64) bool {
		if bound == nil {
			return true
		}
		m, ok := seen[g]
		if !ok {
			okg, max := bound(g)
			m = max
			if !okg {
				m = -1
			}
			seen[g] = m
		}
		if m < 0 || float64(exec) > m {
			refused++
			return false
		}
		return true
	}
	if dropped != nil {
		defer func() { dropped(refused) }()
	}
	fits := func(m proto.Message) bool {
		n := proto.Size(m) + 4 // the row's tag and length
		if size+n > call.budget {
			out.Truncated = true
			return false
		}
		size += n
		return true
	}
	kept := func(g string) bool { return call.keep == nil || call.keep[g] }
	switch call.kind {
	case pb.InspectKind_INSPECT_KIND_STATEMENTS_SUMMARY:
		for _, row := range r.GetStatements() {
			if !kept(row.GetResourceGroup()) {
				continue
			}
			if validSummaryRow(row) != nil {
				refused++
				continue
			}
			if !allowed(row.GetResourceGroup(), row.GetExecCount()) {
				continue
			}
			if !fits(row) {
				break
			}
			out.Statements = append(out.Statements, row)
		}
	case pb.InspectKind_INSPECT_KIND_USAGE:
		for _, row := range r.GetUsage() {
			if !kept(row.GetResourceGroup()) {
				continue
			}
			if validUsageRow(row) != nil {
				refused++
				continue
			}
			if !allowed(row.GetResourceGroup(), 0) {
				continue
			}
			if !fits(row) {
				break
			}
			out.Usage = append(out.Usage, row)
		}
	}
	return out
}

// validSummaryRow checks what a proxy sent before it reaches another
// proxy's SQL (which writes every string as a hex literal and every number
// only once it reads as one): a group name, a hex digest, bounded text,
// finite non-negative numbers.
func validSummaryRow(r *pb.StatementSummaryRow) error {
	if err := resourcegroup.ValidateName(r.GetResourceGroup()); err != nil {
		return err
	}
	if d := r.GetDigest(); len(d) > 16 || !isHex(d) {
		return fmt.Errorf("digest %q is not 16 hex digits", d)
	}
	if n := len(r.GetDigestText()); n > maxDigestTextLen || !utf8.ValidString(r.GetDigestText()) {
		return fmt.Errorf("digest text of %d bytes, at most %d of UTF-8", n, maxDigestTextLen)
	}
	for _, v := range []float64{r.GetAvgRru(), r.GetMaxRru(), r.GetAvgWru(), r.GetMaxWru(), r.GetEstimatedRu()} {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("RU %v is not a finite number ≥ 0", v)
		}
	}
	for _, v := range []int64{r.GetSumLatencyNs(), r.GetMaxLatencyNs(), r.GetAvgQueuedNs(), r.GetMaxQueuedNs(), r.GetFirstSeenUnixMs(), r.GetLastSeenUnixMs()} {
		if v < 0 {
			return fmt.Errorf("%d is negative", v)
		}
	}
	// Figures that cannot be one proxy's: an average above its maximum,
	// a statement's RU beyond one report's bound, a shape seen last
	// before it was first.
	switch {
	case above(r.GetAvgRru(), r.GetMaxRru()) || above(r.GetAvgWru(), r.GetMaxWru()) || r.GetAvgQueuedNs() > r.GetMaxQueuedNs():
		return errors.New("an average above its maximum")
	case r.GetMaxRru() > maxReportRU || r.GetMaxWru() > maxReportRU || r.GetEstimatedRu() > maxReportRU:
		return fmt.Errorf("RU beyond %g", float64(maxReportRU))
	case r.GetExecCount() > uint64(maxReportRU):
		return fmt.Errorf("exec count %d beyond %g", r.GetExecCount(), float64(maxReportRU))
	case r.GetExecCount() > 0 && r.GetMaxLatencyNs() > r.GetSumLatencyNs():
		return errors.New("max latency above the sum")
	case r.GetLastSeenUnixMs() < r.GetFirstSeenUnixMs():
		return errors.New("last seen before first seen")
	}
	return nil
}

// above: an average beyond its maximum by more than rounding.
func above(avg, max float64) bool { return avg > max*(1+1e-9)+1e-9 }

// validUsageRow is validSummaryRow for a usage row; tokens may be
// negative (debt).
func validUsageRow(r *pb.GroupUsageRow) error {
	if err := resourcegroup.ValidateName(r.GetResourceGroup()); err != nil {
		return err
	}
	if v := r.GetRuPerSecLast_10S(); !(v >= 0) || math.IsInf(v, 0) {
		return fmt.Errorf("RU/s %v is not a finite number ≥ 0", v)
	}
	if v := r.GetTokensLeft(); math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("tokens %v are not finite", v)
	}
	switch r.GetCpuSource() {
	case "", "proc", "wall":
	default:
		return fmt.Errorf("cpu source %q", r.GetCpuSource())
	}
	return nil
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// validateClusterInspect checks a ClusterInspect request and returns the
// groups it keeps (nil: every group).
func validateClusterInspect(req *pb.ClusterInspectRequest) (map[string]bool, error) {
	switch req.GetKind() {
	case pb.InspectKind_INSPECT_KIND_STATEMENTS_SUMMARY, pb.InspectKind_INSPECT_KIND_USAGE:
	default:
		return nil, fmt.Errorf("unknown kind %v", req.GetKind())
	}
	if req.GetAllGroups() {
		if len(req.GetGroups()) > 0 {
			return nil, errors.New("all_groups with groups")
		}
		return nil, nil
	}
	if n := len(req.GetGroups()); n > maxInspectGroups {
		return nil, fmt.Errorf("%d groups, at most %d (ask for all_groups)", n, maxInspectGroups)
	}
	keep := make(map[string]bool, len(req.GetGroups()))
	for i, g := range req.GetGroups() {
		if err := resourcegroup.ValidateName(g); err != nil {
			return nil, fmt.Errorf("groups[%d]: %w", i, err)
		}
		keep[g] = true
	}
	return keep, nil
}

// inspect asks every stream for req's rows and answers with the replies
// that came before the deadline: inspectWait from now, or the caller's
// deadline less inspectMargin if sooner.
func (h *inspectHub) inspect(ctx context.Context, req *pb.ClusterInspectRequest, keep map[string]bool) (*pb.ClusterInspectResponse, error) {
	start := h.clk.Now()
	wait := h.wait
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(d)-inspectMargin) // a deadline is wall time
	}
	if wait <= 0 {
		return nil, context.DeadlineExceeded
	}
	timer := h.clk.NewTimer(wait)
	defer timer.Stop()
	select {
	case h.slots <- struct{}{}:
	case <-timer.C():
		return nil, errInspectBusy
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-h.slots }()

	h.mu.Lock()
	conns := make([]*inspectConn, 0, len(h.streams))
	for _, c := range h.streams {
		conns = append(conns, c)
	}
	h.mu.Unlock()
	budget := inspectAnswerBytes / max(len(conns), 1)
	budget = min(budget, inspectReplyBytes)
	call := &inspectCall{kind: req.GetKind(), budget: budget, keep: keep, replies: make(chan inspectAnswer, len(conns))}
	id := h.ids.Add(1)
	ask := &pb.InspectRequest{RequestId: id, Kind: req.GetKind(), AllGroups: keep == nil, Groups: req.GetGroups(), MaxBytes: uint32(budget)}
	var asked []*inspectConn
	var unanswered []string
	for _, c := range conns {
		c.mu.Lock()
		if c.gone {
			c.mu.Unlock()
			unanswered = append(unanswered, c.instance)
			continue
		}
		c.pending[id] = call
		c.mu.Unlock()
		select {
		case c.queue <- ask:
			asked = append(asked, c)
		default: // the proxy does not read: do not wait for it
			c.mu.Lock()
			delete(c.pending, id)
			c.mu.Unlock()
			unanswered = append(unanswered, c.instance)
		}
	}
	defer func() {
		for _, c := range asked {
			c.mu.Lock()
			delete(c.pending, id)
			c.mu.Unlock()
		}
	}()
	answered := make(map[*inspectConn]*pb.InstanceRows, len(asked))
	waiting := make(map[*inspectConn]bool, len(asked))
	for _, c := range asked {
		waiting[c] = true
	}
collect:
	for len(waiting) > 0 {
		select {
		case a := <-call.replies:
			if !waiting[a.conn] {
				continue // a stream that ended before its request was queued
			}
			delete(waiting, a.conn)
			if a.rows != nil {
				answered[a.conn] = a.rows
			}
		case <-timer.C():
			break collect
		case <-ctx.Done():
			break collect
		}
	}
	resp := &pb.ClusterInspectResponse{}
	for _, c := range asked {
		if rows, ok := answered[c]; ok {
			resp.Instances = append(resp.Instances, rows)
		} else {
			unanswered = append(unanswered, c.instance)
		}
	}
	slices.SortFunc(resp.Instances, func(a, b *pb.InstanceRows) int { return cmp.Compare(a.GetInstance(), b.GetInstance()) })
	slices.Sort(unanswered)
	resp.Unanswered = unanswered
	h.unanswered.Add(float64(len(unanswered)))
	h.duration.Observe(h.clk.Now().Sub(start).Seconds())
	return resp, nil
}

// inspectService implements tokenpb.InspectServiceServer over a Server.
type inspectService struct {
	pb.UnimplementedInspectServiceServer
	s *Server
}

// ClusterInspect implements tokenpb.InspectServiceServer.
func (is inspectService) ClusterInspect(ctx context.Context, req *pb.ClusterInspectRequest) (*pb.ClusterInspectResponse, error) {
	s := is.s
	if !s.IsLeader() {
		return &pb.ClusterInspectResponse{NotLeader: &pb.NotLeader{LeaderAddr: s.LeaderAddr()}}, nil
	}
	keep, err := validateClusterInspect(req)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "malformed cluster inspect request: %v", err)
	}
	resp, err := s.inspect.inspect(ctx, req, keep)
	switch {
	case errors.Is(err, errInspectBusy):
		return nil, status.Errorf(codes.ResourceExhausted, "rgserver is answering %d cluster-wide views already; try again", maxInspectCalls)
	case err != nil:
		return nil, status.FromContextError(err).Err()
	}
	return resp, nil
}

// validateHello checks a stream's first message.
func validateHello(r *pb.InspectReply) error {
	h := r.GetHello()
	switch {
	case h == nil:
		return errors.New("the first message must be a hello")
	case h.GetProxyId() == "" || len(h.GetProxyId()) > maxProxyIDLen:
		return fmt.Errorf("proxy_id of %d bytes: want 1 to %d", len(h.GetProxyId()), maxProxyIDLen)
	case h.GetInstance() == "" || len(h.GetInstance()) > maxInstanceLen || !utf8.ValidString(h.GetInstance()):
		return fmt.Errorf("instance of %d bytes: want 1 to %d of UTF-8", len(h.GetInstance()), maxInstanceLen)
	}
	return nil
}

// Inspect implements tokenpb.InspectServiceServer: the proxy's hello
// names it (its proxy id must be one its credential streams tokens
// under), then the stream carries the leader's requests and the proxy's
// replies until either side ends it, a newer stream of the same proxy id
// takes over (Aborted), or this replica stops leading (NOT_LEADER).
func (is inspectService) Inspect(stream grpc.BidiStreamingServer[pb.InspectReply, pb.InspectRequest]) error {
	s := is.s
	ctx := stream.Context()
	p := principalFrom(ctx)
	closeStream, err := s.proxies.open(p, kindInspect)
	if err != nil {
		return s.auth.refuse(refusedStreamLimit, codes.ResourceExhausted, err.Error())
	}
	defer closeStream()
	if !s.IsLeader() {
		return stream.Send(&pb.InspectRequest{NotLeader: &pb.NotLeader{LeaderAddr: s.LeaderAddr()}})
	}
	recv, recvErr := recvPump(ctx, stream.Recv)
	var hello *pb.InspectReply
	helloTimer := time.NewTimer(inspectHelloWait)
	select {
	case hello = <-recv:
		helloTimer.Stop()
	case err := <-recvErr:
		helloTimer.Stop()
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	case <-helloTimer.C:
		return status.Errorf(codes.DeadlineExceeded, "no hello within %s", inspectHelloWait)
	}
	if err := validateHello(hello); err != nil {
		return status.Errorf(codes.InvalidArgument, "malformed inspect hello: %v", err)
	}
	proxyID := hello.GetHello().GetProxyId()
	if !s.proxies.streams(p, proxyID) {
		return status.Errorf(codes.FailedPrecondition, "proxy id %q has no token stream under credential %q yet: open AcquireTokens first", proxyID, p.Name)
	}
	releaseInstance, err := s.creds.holdInstance(p, hello.GetHello().GetInstance(), s.now(), true)
	if err != nil {
		s.creds.refuse(p, refusedInstance, 1)
		return status.Error(codes.PermissionDenied, err.Error())
	}
	defer func() { releaseInstance(s.now()) }()
	c := s.inspect.add(slotID(p, proxyID), hello.GetHello().GetInstance())
	if bounded(p) {
		c.bound = func(g string) (bool, float64) {
			s.mu.Lock()
			ok := s.holdsLocked(g)
			s.mu.Unlock()
			return ok, s.creds.statementsOf(p, g)
		}
		c.dropped = func(n int) { s.creds.drop(p, droppedRows, float64(n)) }
	}
	defer s.inspect.remove(c)
	leader := time.NewTicker(inspectLeaderCheck)
	defer leader.Stop()
	for {
		select {
		case req := <-c.queue:
			if err := stream.Send(req); err != nil {
				return err
			}
		case r := <-recv:
			if r.GetHello() != nil {
				return status.Error(codes.InvalidArgument, "malformed inspect reply: a second hello")
			}
			c.deliver(r)
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-c.superseded:
			return status.Errorf(codes.Aborted, "proxy id %q is used by a newer inspect stream of the same credential", proxyID)
		case <-leader.C:
			if !s.IsLeader() {
				return stream.Send(&pb.InspectRequest{NotLeader: &pb.NotLeader{LeaderAddr: s.LeaderAddr()}})
			}
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}
