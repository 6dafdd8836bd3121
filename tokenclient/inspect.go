package tokenclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rgproxy/rgproxy/internal/textcut"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// Cluster-wide views (docs/design.md §7.7): the proxy keeps one Inspect
// stream open to rgserver's leader, says who it is (its proxy id and its
// INSTANCE, the MySQL address clients reach it at) and answers each
// request with its rows; ClusterInspect asks the leader for every live
// proxy's rows. Nothing flows while nobody looks.

// InspectKind names a view that ClusterInspect gathers.
type InspectKind uint8

const (
	// InspectStatements is information_schema.statements_summary.
	InspectStatements InspectKind = iota + 1
	// InspectUsage is SHOW RESOURCE GROUP USAGE.
	InspectUsage
)

// StatementSummary is one statement shape of a proxy's
// statements_summary: its figures since the proxy first saw it.
type StatementSummary struct {
	Group, Digest, DigestText string
	ExecCount                 uint64
	SumLatency, MaxLatency    time.Duration
	AvgRRU, MaxRRU            float64
	AvgWRU, MaxWRU            float64
	AvgQueued, MaxQueued      time.Duration
	SumErrors                 uint64
	FirstSeen, LastSeen       time.Time
	// EstimateRU is what the proxy charges before the next execution.
	EstimateRU float64
}

// TotalRU is every execution's RU (RRU + WRU) summed.
func (s StatementSummary) TotalRU() float64 { return (s.AvgRRU + s.AvgWRU) * float64(s.ExecCount) }

// AvgLatency is SumLatency / ExecCount.
func (s StatementSummary) AvgLatency() time.Duration {
	if s.ExecCount == 0 {
		return 0
	}
	return s.SumLatency / time.Duration(s.ExecCount)
}

// UsageRow is one row of a proxy's SHOW RESOURCE GROUP USAGE.
type UsageRow struct {
	GroupUsage
	// CPUSource is where the proxy's CPU time comes from: "proc" or "wall".
	CPUSource string
}

// Inspector gives this proxy's rows to the Inspect stream. Its methods
// are called from the stream's goroutine, one at a time.
type Inspector interface {
	// InspectStatements returns the statement shapes of the groups keep
	// accepts (nil: every group), heaviest (by SumLatency) first.
	InspectStatements(keep func(group string) bool) []StatementSummary
	// InspectUsage returns the usage of the groups keep accepts, the
	// busiest first.
	InspectUsage(keep func(group string) bool) []UsageRow
}

// InstanceView is one proxy's rows in a cluster view.
type InstanceView struct {
	// Instance is the proxy's MySQL address, as it named itself.
	Instance   string
	Statements []StatementSummary
	Usage      []UsageRow
	// Truncated: rows were left out to keep the answer within its bound.
	Truncated bool
}

// ClusterView is a cluster-wide view: the proxies that answered in time,
// sorted by instance, and the instances of those that did not.
type ClusterView struct {
	Instances  []InstanceView
	Unanswered []string
}

// Bounds of the Inspect stream, this side.
const (
	// inspectReplyMax caps a reply's rows (their encoded size) whatever
	// rgserver asks, well under gRPC's 4 MiB per message.
	inspectReplyMax = 512 << 10
	// inspectDigestTextMax caps a shape's digest text in a reply, in bytes.
	inspectDigestTextMax = 4096
	// clusterInspectTimeout bounds ClusterInspect: rgserver waits for the
	// proxies 500 ms at most.
	clusterInspectTimeout = time.Second
	// inspectSteady: a stream that lived this long was accepted, and the
	// next reconnect starts its backoff again.
	inspectSteady = 5 * time.Second
)

// ErrInspectBusy: rgserver is answering as many cluster views as it takes
// at once.
var ErrInspectBusy = errors.New("tokenclient: rgserver is busy with other cluster views")

// inspectState is the Inspect stream's state.
type inspectState struct {
	mu      sync.Mutex
	started bool
	// addr is the rgserver the stream is open to (the leader), "" = none.
	addr string
}

func (s *inspectState) setAddr(a string) {
	s.mu.Lock()
	s.addr = a
	s.mu.Unlock()
}

func (s *inspectState) leader() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// StartInspect opens the Inspect stream in the background, until Close:
// this proxy answers cluster views as instance (its MySQL address, at
// most 256 bytes) with in's rows. Call it once, after Start.
func (c *Client) StartInspect(instance string, in Inspector) error {
	if err := checkInstance("inspect", instance); err != nil {
		return err
	}
	c.insp.mu.Lock()
	started := c.insp.started
	c.insp.started = true
	c.insp.mu.Unlock()
	if started {
		return fmt.Errorf("tokenclient: StartInspect called twice")
	}
	return c.startLoop("inspect", func(ctx context.Context) { c.inspectLoop(ctx, instance, in) })
}

// checkInstance checks an instance name a background loop reports under
// (the proxy's MySQL address): 1 to 256 bytes, as rgserver takes them.
func checkInstance(what, instance string) error {
	if instance == "" || len(instance) > 256 {
		return fmt.Errorf("%w: %s instance %q: want 1 to 256 bytes", ErrConfig, what, instance)
	}
	return nil
}

// startLoop runs loop in the background with a context of its own (loops),
// until Close; what names it in the error of a closed (or not started)
// client.
func (c *Client) startLoop(what string, loop func(ctx context.Context)) error {
	if !c.loops.start(loop) {
		return fmt.Errorf("tokenclient: %s: %w", what, ErrClosed)
	}
	return nil
}

// inspectLoop keeps the Inspect stream open to the leader until ctx
// ends (followLeader); a stream that lasted inspectSteady starts the
// backoff over.
func (c *Client) inspectLoop(ctx context.Context, instance string, in Inspector) {
	c.followLeader(ctx, leaderStream{name: "inspect", level: slog.LevelDebug,
		run: func(ctx context.Context, addr string) (bool, error) {
			began := c.clk.Now()
			err := c.runInspect(ctx, addr, instance, in)
			c.insp.setAddr("")
			return c.clk.Now().Sub(began) >= inspectSteady, err
		},
		wait: func(ctx context.Context, d time.Duration) bool { return c.sleep(ctx, d) == nil },
	})
}

// runInspect runs one Inspect stream to addr until it ends.
func (c *Client) runInspect(ctx context.Context, addr, instance string, in Inspector) error {
	cc, err := c.conn(addr)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := tokenpb.NewInspectServiceClient(cc).Inspect(sctx)
	if err != nil {
		return fmt.Errorf("open inspect stream to %s: %w", addr, err)
	}
	return c.serveInspect(stream, addr, instance, in)
}

// serveInspect says hello on an open Inspect stream to addr and answers
// its requests until it ends. A Send that fails with io.EOF means the
// server ended the stream first; why (a follower's NOT_LEADER, sent as
// it ends the stream at once, or the stream's status) comes with Recv.
func (c *Client) serveInspect(stream tokenpb.InspectService_InspectClient, addr, instance string, in Inspector) error {
	hello := &tokenpb.InspectReply{Hello: &tokenpb.InspectHello{ProxyId: c.cfg.ProxyID, Instance: instance}}
	if err := stream.Send(hello); err == nil {
		c.insp.setAddr(addr)
	} else if !errors.Is(err, io.EOF) {
		return fmt.Errorf("inspect hello to %s: %w", addr, err)
	}
	for {
		req, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("inspect stream from %s: %w", addr, err)
		}
		if nl := req.GetNotLeader(); nl != nil {
			return &notLeaderError{leader: nl.GetLeaderAddr()}
		}
		if err := stream.Send(inspectReply(req, in)); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("inspect reply to %s: %w", addr, err)
		}
	}
}

// inspectReply answers one request with in's rows, as many as fit the
// bytes the request allows (at most inspectReplyMax), in the order in
// gives them; truncated says some were left out.
func inspectReply(req *tokenpb.InspectRequest, in Inspector) *tokenpb.InspectReply {
	out := &tokenpb.InspectReply{RequestId: req.GetRequestId()}
	var keep func(string) bool
	if !req.GetAllGroups() {
		set := make(map[string]bool, len(req.GetGroups()))
		for _, g := range req.GetGroups() {
			set[g] = true
		}
		keep = func(g string) bool { return set[g] }
	}
	budget := min(int(req.GetMaxBytes()), inspectReplyMax)
	size := 0
	fits := func(m proto.Message) bool {
		n := proto.Size(m) + 4 // the row's tag and length
		if size+n > budget {
			out.Truncated = true
			return false
		}
		size += n
		return true
	}
	switch req.GetKind() {
	case tokenpb.InspectKind_INSPECT_KIND_STATEMENTS_SUMMARY:
		for _, s := range in.InspectStatements(keep) {
			row := summaryToPB(s)
			if !fits(row) {
				break
			}
			out.Statements = append(out.Statements, row)
		}
	case tokenpb.InspectKind_INSPECT_KIND_USAGE:
		for _, u := range in.InspectUsage(keep) {
			row := usageToPB(u)
			if !fits(row) {
				break
			}
			out.Usage = append(out.Usage, row)
		}
	}
	return out
}

// ClusterInspect gathers a view from every proxy connected to rgserver's
// leader (this one included, through its own Inspect stream), within a
// second: groups limits the rows to those groups (nil: every group; at
// most 1,000 names). It asks the rgserver its Inspect stream is open to,
// else each of Servers in turn, following NOT_LEADER. An unreachable
// rgserver gives an error wrapping ErrUnavailable; one busy with other
// views ErrInspectBusy; any other error carries rgserver's message.
func (c *Client) ClusterInspect(ctx context.Context, kind InspectKind, groups []string) (*ClusterView, error) {
	req := &tokenpb.ClusterInspectRequest{AllGroups: groups == nil, Groups: groups}
	switch kind {
	case InspectStatements:
		req.Kind = tokenpb.InspectKind_INSPECT_KIND_STATEMENTS_SUMMARY
	case InspectUsage:
		req.Kind = tokenpb.InspectKind_INSPECT_KIND_USAGE
	default:
		return nil, fmt.Errorf("tokenclient: cluster inspect: unknown kind %d", kind)
	}
	ctx, cancel := context.WithTimeout(ctx, clusterInspectTimeout)
	defer cancel()
	addrs := c.cfg.Servers
	if l := c.insp.leader(); l != "" {
		addrs = append([]string{l}, addrs...)
	}
	var lastErr error
	for _, addr := range addrs {
		for hops := 0; ; hops++ {
			resp, err := c.clusterInspectAt(ctx, addr, req)
			if err != nil {
				lastErr = err
				break
			}
			if nl := resp.GetNotLeader(); nl != nil {
				lastErr = fmt.Errorf("%w: %s is not the leader", ErrUnavailable, addr)
				if nl.GetLeaderAddr() == "" || nl.GetLeaderAddr() == addr || hops >= 3 {
					break
				}
				addr = nl.GetLeaderAddr()
				continue
			}
			return viewFromPB(resp), nil
		}
		if !errors.Is(lastErr, ErrUnavailable) || ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

// clusterInspectAt asks one rgserver; its errors are mapped as
// ClusterInspect says.
func (c *Client) clusterInspectAt(ctx context.Context, addr string, req *tokenpb.ClusterInspectRequest) (*tokenpb.ClusterInspectResponse, error) {
	cc, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	resp, err := tokenpb.NewInspectServiceClient(cc).ClusterInspect(ctx, req)
	if err == nil {
		return resp, nil
	}
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return nil, fmt.Errorf("%w: rgserver %s: %s", ErrUnavailable, addr, st.Message())
	case codes.ResourceExhausted:
		return nil, fmt.Errorf("%w: %s", ErrInspectBusy, st.Message())
	}
	return nil, fmt.Errorf("tokenclient: rgserver %s: %s", addr, st.Message())
}

func summaryToPB(s StatementSummary) *tokenpb.StatementSummaryRow {
	text := textcut.Valid(s.DigestText, inspectDigestTextMax)
	return &tokenpb.StatementSummaryRow{
		ResourceGroup: s.Group, Digest: s.Digest, DigestText: text,
		ExecCount: s.ExecCount, SumLatencyNs: int64(s.SumLatency), MaxLatencyNs: int64(s.MaxLatency),
		AvgRru: s.AvgRRU, MaxRru: s.MaxRRU, AvgWru: s.AvgWRU, MaxWru: s.MaxWRU,
		AvgQueuedNs: int64(s.AvgQueued), MaxQueuedNs: int64(s.MaxQueued), SumErrors: s.SumErrors,
		FirstSeenUnixMs: s.FirstSeen.UnixMilli(), LastSeenUnixMs: s.LastSeen.UnixMilli(), EstimatedRu: s.EstimateRU,
	}
}

func usageToPB(u UsageRow) *tokenpb.GroupUsageRow {
	return &tokenpb.GroupUsageRow{ResourceGroup: u.Group, RuPerSecLast_10S: u.RUPerSec, TokensLeft: u.Tokens,
		Throttled: u.Throttled, Degraded: u.Degraded, CpuSource: u.CPUSource}
}

func viewFromPB(resp *tokenpb.ClusterInspectResponse) *ClusterView {
	v := &ClusterView{Unanswered: resp.GetUnanswered()}
	for _, in := range resp.GetInstances() {
		iv := InstanceView{Instance: in.GetInstance(), Truncated: in.GetTruncated()}
		for _, r := range in.GetStatements() {
			iv.Statements = append(iv.Statements, StatementSummary{
				Group: r.GetResourceGroup(), Digest: r.GetDigest(), DigestText: r.GetDigestText(),
				ExecCount: r.GetExecCount(), SumLatency: time.Duration(r.GetSumLatencyNs()), MaxLatency: time.Duration(r.GetMaxLatencyNs()),
				AvgRRU: r.GetAvgRru(), MaxRRU: r.GetMaxRru(), AvgWRU: r.GetAvgWru(), MaxWRU: r.GetMaxWru(),
				AvgQueued: time.Duration(r.GetAvgQueuedNs()), MaxQueued: time.Duration(r.GetMaxQueuedNs()), SumErrors: r.GetSumErrors(),
				FirstSeen: time.UnixMilli(r.GetFirstSeenUnixMs()), LastSeen: time.UnixMilli(r.GetLastSeenUnixMs()), EstimateRU: r.GetEstimatedRu(),
			})
		}
		for _, r := range in.GetUsage() {
			iv.Usage = append(iv.Usage, UsageRow{GroupUsage: GroupUsage{Group: r.GetResourceGroup(), RUPerSec: r.GetRuPerSecLast_10S(),
				Tokens: r.GetTokensLeft(), Throttled: r.GetThrottled(), Degraded: r.GetDegraded()}, CPUSource: r.GetCpuSource()})
		}
		v.Instances = append(v.Instances, iv)
	}
	return v
}
