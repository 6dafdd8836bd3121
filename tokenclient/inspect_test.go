package tokenclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// fakeInspector answers with fixed rows, filtered by keep.
type fakeInspector struct {
	statements []StatementSummary
	usage      []UsageRow
}

func (f *fakeInspector) InspectStatements(keep func(string) bool) []StatementSummary {
	var out []StatementSummary
	for _, s := range f.statements {
		if keep == nil || keep(s.Group) {
			out = append(out, s)
		}
	}
	return out
}

func (f *fakeInspector) InspectUsage(keep func(string) bool) []UsageRow {
	var out []UsageRow
	for _, u := range f.usage {
		if keep == nil || keep(u.Group) {
			out = append(out, u)
		}
	}
	return out
}

// TestInspectReply: a reply holds the rows of the groups asked for, in
// the inspector's order, within the bytes the request allows (and
// inspectReplyMax), a digest text cut to 4096 bytes of valid UTF-8.
func TestInspectReply(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	in := &fakeInspector{}
	for i := range 50 {
		in.statements = append(in.statements, StatementSummary{Group: fmt.Sprintf("g%d", i%2), Digest: fmt.Sprintf("%016x", i),
			DigestText: "SELECT ?", ExecCount: uint64(i), SumLatency: time.Duration(50-i) * time.Millisecond, FirstSeen: at, LastSeen: at})
		in.usage = append(in.usage, UsageRow{GroupUsage: GroupUsage{Group: fmt.Sprintf("g%d", i), RUPerSec: 1, Tokens: -2, Throttled: 3}, CPUSource: "proc"})
	}
	in.statements[0].DigestText = "SELECT '\xff" + strings.Repeat("é", inspectDigestTextMax) // not UTF-8, too long

	r := inspectReply(&tokenpb.InspectRequest{RequestId: 9, Kind: tokenpb.InspectKind_INSPECT_KIND_STATEMENTS_SUMMARY, AllGroups: true, MaxBytes: 1 << 30}, in)
	if r.GetRequestId() != 9 || len(r.GetStatements()) != 50 || r.GetTruncated() || len(r.GetUsage()) != 0 {
		t.Fatalf("all rows: id %d, %d statements (truncated %v), %d usage", r.GetRequestId(), len(r.GetStatements()), r.GetTruncated(), len(r.GetUsage()))
	}
	if d := r.Statements[0].GetDigestText(); len(d) > inspectDigestTextMax || !utf8.ValidString(d) || !strings.HasPrefix(d, "SELECT '\uFFFD") {
		t.Fatalf("digest text of %d bytes, valid %v: %.20q", len(d), utf8.ValidString(d), d)
	}
	if s := r.Statements[1]; s.GetDigest() != "0000000000000001" || s.GetSumLatencyNs() != int64(49*time.Millisecond) ||
		s.GetFirstSeenUnixMs() != at.UnixMilli() || s.GetExecCount() != 1 {
		t.Fatalf("row 1: %v", s)
	}

	r = inspectReply(&tokenpb.InspectRequest{Kind: tokenpb.InspectKind_INSPECT_KIND_STATEMENTS_SUMMARY, Groups: []string{"g1"}, MaxBytes: 1 << 30}, in)
	for _, s := range r.GetStatements() {
		if s.GetResourceGroup() != "g1" {
			t.Fatalf("a row of %s", s.GetResourceGroup())
		}
	}
	if len(r.GetStatements()) != 25 {
		t.Fatalf("g1: %d rows", len(r.GetStatements()))
	}

	r = inspectReply(&tokenpb.InspectRequest{Kind: tokenpb.InspectKind_INSPECT_KIND_USAGE, AllGroups: true, MaxBytes: 300}, in)
	if !r.GetTruncated() || len(r.GetUsage()) == 0 || len(r.GetUsage()) >= 50 || r.Usage[0].GetResourceGroup() != "g0" ||
		r.Usage[0].GetTokensLeft() != -2 || r.Usage[0].GetCpuSource() != "proc" {
		t.Fatalf("300 bytes: %d usage rows, truncated %v: %v", len(r.GetUsage()), r.GetTruncated(), r.GetUsage())
	}
	// rgserver may not ask for more than inspectReplyMax.
	big := &fakeInspector{}
	for i := range 40000 {
		big.usage = append(big.usage, UsageRow{GroupUsage: GroupUsage{Group: fmt.Sprintf("group-%d", i)}, CPUSource: "wall"})
	}
	r = inspectReply(&tokenpb.InspectRequest{Kind: tokenpb.InspectKind_INSPECT_KIND_USAGE, AllGroups: true, MaxBytes: 1 << 31}, big)
	if n := proto.Size(r); !r.GetTruncated() || n > inspectReplyMax || n < inspectReplyMax*9/10 {
		t.Fatalf("40,000 rows asked with 2 GiB: truncated %v, %d bytes, want at most (and close to) %d", r.GetTruncated(), n, inspectReplyMax)
	}
	if r := inspectReply(&tokenpb.InspectRequest{Kind: 7, AllGroups: true, MaxBytes: 1 << 20}, in); len(r.GetStatements())+len(r.GetUsage()) != 0 {
		t.Fatal("an unknown kind gets rows")
	}
}

// inspectDouble is rgserver's InspectService for the client's tests.
type inspectDouble struct {
	tokenpb.UnimplementedInspectServiceServer
	notLeader string // non-empty: a follower naming this leader
	busy      bool
	hellos    chan *tokenpb.InspectHello
	asks      chan *tokenpb.InspectRequest
	replies   chan *tokenpb.InspectReply

	mu    sync.Mutex
	views []*tokenpb.ClusterInspectRequest
}

func newInspectDouble() *inspectDouble {
	return &inspectDouble{hellos: make(chan *tokenpb.InspectHello, 10), asks: make(chan *tokenpb.InspectRequest, 10),
		replies: make(chan *tokenpb.InspectReply, 10)}
}

func (d *inspectDouble) Inspect(st grpc.BidiStreamingServer[tokenpb.InspectReply, tokenpb.InspectRequest]) error {
	if d.notLeader != "" {
		return st.Send(&tokenpb.InspectRequest{NotLeader: &tokenpb.NotLeader{LeaderAddr: d.notLeader}})
	}
	h, err := st.Recv()
	if err != nil {
		return nil
	}
	d.hellos <- h.GetHello()
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			d.replies <- r
		}
	}()
	for {
		select {
		case req := <-d.asks:
			if err := st.Send(req); err != nil {
				return nil
			}
		case <-st.Context().Done():
			return nil
		}
	}
}

func (d *inspectDouble) ClusterInspect(_ context.Context, req *tokenpb.ClusterInspectRequest) (*tokenpb.ClusterInspectResponse, error) {
	if d.notLeader != "" {
		return &tokenpb.ClusterInspectResponse{NotLeader: &tokenpb.NotLeader{LeaderAddr: d.notLeader}}, nil
	}
	if d.busy {
		return nil, status.Error(codes.ResourceExhausted, "rgserver is answering 4 cluster-wide views already; try again")
	}
	d.mu.Lock()
	d.views = append(d.views, req)
	d.mu.Unlock()
	return &tokenpb.ClusterInspectResponse{
		Instances: []*tokenpb.InstanceRows{{Instance: "a:4000", Truncated: true,
			Statements: []*tokenpb.StatementSummaryRow{{ResourceGroup: "g1", Digest: "00ff", ExecCount: 4, SumLatencyNs: 5, LastSeenUnixMs: 1_700_000_000_000}},
			Usage:      []*tokenpb.GroupUsageRow{{ResourceGroup: "g1", RuPerSecLast_10S: 2.5, TokensLeft: -1, Throttled: 3, Degraded: true, CpuSource: "wall"}}}},
		Unanswered: []string{"b:4000"},
	}, nil
}

// startInspectServer serves the token, group and inspect doubles.
func startInspectServer(t *testing.T, d *inspectDouble) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	tokenpb.RegisterTokenServiceServer(g, newTokenServer())
	tokenpb.RegisterResourceGroupServiceServer(g, newRGServer())
	tokenpb.RegisterInspectServiceServer(g, d)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// TestInspectStream: the stream follows NOT_LEADER to the leader, says
// who the proxy is, and answers each request; ClusterInspect goes to the
// rgserver the stream is open to (or follows NOT_LEADER from Servers),
// and its errors map to ErrInspectBusy and ErrUnavailable.
func TestInspectStream(t *testing.T) {
	leader := newInspectDouble()
	leaderAddr := startInspectServer(t, leader)
	follower := newInspectDouble()
	follower.notLeader = leaderAddr
	followerAddr := startInspectServer(t, follower)

	c, _ := newTestClient(t, func(cfg *Config) { cfg.Servers = []string{followerAddr} })
	defer c.Close()
	if err := c.StartInspect("a:4000", &fakeInspector{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("StartInspect before Start: %v", err)
	}
	c, _ = newTestClient(t, func(cfg *Config) { cfg.Servers = []string{followerAddr} })
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.StartInspect("", &fakeInspector{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("an empty instance: %v", err)
	}
	in := &fakeInspector{statements: []StatementSummary{{Group: "g1", Digest: "00000000000000aa"}, {Group: "g2", Digest: "00000000000000bb"}}}
	if err := c.StartInspect("a:4000", in); err != nil {
		t.Fatal(err)
	}
	if err := c.StartInspect("a:4000", in); err == nil {
		t.Fatal("StartInspect twice")
	}
	var hello *tokenpb.InspectHello
	select {
	case hello = <-leader.hellos:
	case <-ctx.Done():
		t.Fatal("no hello reached the leader")
	}
	if hello.GetProxyId() != "p1" || hello.GetInstance() != "a:4000" {
		t.Fatalf("hello %v", hello)
	}
	leader.asks <- &tokenpb.InspectRequest{RequestId: 7, Kind: tokenpb.InspectKind_INSPECT_KIND_STATEMENTS_SUMMARY, Groups: []string{"g2"}, MaxBytes: 1 << 20}
	select {
	case r := <-leader.replies:
		if r.GetRequestId() != 7 || len(r.GetStatements()) != 1 || r.Statements[0].GetDigest() != "00000000000000bb" {
			t.Fatalf("reply %v", r)
		}
	case <-ctx.Done():
		t.Fatal("no reply")
	}
	waitFor(t, "the leader's address", func() bool { return c.insp.leader() == leaderAddr }, nil)

	v, err := c.ClusterInspect(ctx, InspectUsage, []string{"g1"})
	if err != nil {
		t.Fatal(err)
	}
	leader.mu.Lock()
	asked := leader.views[0]
	leader.mu.Unlock()
	if asked.GetKind() != tokenpb.InspectKind_INSPECT_KIND_USAGE || asked.GetAllGroups() || fmt.Sprint(asked.GetGroups()) != "[g1]" {
		t.Fatalf("asked %v", asked)
	}
	if len(v.Instances) != 1 || fmt.Sprint(v.Unanswered) != "[b:4000]" {
		t.Fatalf("view %+v", v)
	}
	iv := v.Instances[0]
	if iv.Instance != "a:4000" || !iv.Truncated || len(iv.Usage) != 1 || len(iv.Statements) != 1 ||
		iv.Usage[0] != (UsageRow{GroupUsage: GroupUsage{Group: "g1", RUPerSec: 2.5, Tokens: -1, Throttled: 3, Degraded: true}, CPUSource: "wall"}) ||
		iv.Statements[0].ExecCount != 4 || iv.Statements[0].SumLatency != 5 || iv.Statements[0].LastSeen.UnixMilli() != 1_700_000_000_000 {
		t.Fatalf("instance %+v", iv)
	}

	// A client without a stream asks Servers and follows NOT_LEADER.
	c2, _ := newTestClient(t, func(cfg *Config) { cfg.Servers = []string{deadAddr(t), followerAddr} })
	defer c2.Close()
	if v, err := c2.ClusterInspect(ctx, InspectStatements, nil); err != nil || len(v.Instances) != 1 {
		t.Fatalf("through a dead server and a follower: %v, %v", v, err)
	}
	leader.mu.Lock()
	asked = leader.views[1]
	leader.mu.Unlock()
	if !asked.GetAllGroups() || asked.GetKind() != tokenpb.InspectKind_INSPECT_KIND_STATEMENTS_SUMMARY {
		t.Fatalf("asked %v", asked)
	}
	leader.busy = true
	if _, err := c2.ClusterInspect(ctx, InspectUsage, nil); !errors.Is(err, ErrInspectBusy) {
		t.Fatalf("busy: %v", err)
	}
	c3, _ := newTestClient(t, func(cfg *Config) { cfg.Servers = []string{deadAddr(t)} })
	defer c3.Close()
	if _, err := c3.ClusterInspect(ctx, InspectUsage, nil); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no rgserver: %v", err)
	}
}

// endedStream is an Inspect stream the server already ended: every Send
// fails with io.EOF, as gRPC reports a stream ended by its server, and Recv
// gives what the server sent first (then io.EOF).
type endedStream struct {
	grpc.ClientStream
	sent []*tokenpb.InspectReply
	recv []*tokenpb.InspectRequest
}

func (s *endedStream) Send(r *tokenpb.InspectReply) error {
	s.sent = append(s.sent, r)
	return io.EOF
}

func (s *endedStream) Recv() (*tokenpb.InspectRequest, error) {
	if len(s.recv) == 0 {
		return nil, io.EOF
	}
	r := s.recv[0]
	s.recv = s.recv[1:]
	return r, nil
}

// A follower answers an Inspect stream with NOT_LEADER and ends it at
// once: the proxy's hello may then fail with io.EOF, and the proxy must
// still read the redirect (it backed off instead, and with one server
// configured met the follower again and again).
func TestInspectHelloAfterNotLeader(t *testing.T) {
	c, _ := newTestClient(t, nil)
	st := &endedStream{recv: []*tokenpb.InspectRequest{{NotLeader: &tokenpb.NotLeader{LeaderAddr: "leader:1"}}}}
	err := c.serveInspect(st, "follower:1", "a:4000", &fakeInspector{})
	nl, ok := errors.AsType[*notLeaderError](err)
	if !ok || nl.leader != "leader:1" {
		t.Fatalf("got %v, want NOT_LEADER naming leader:1", err)
	}
	if len(st.sent) != 1 || st.sent[0].GetHello().GetInstance() != "a:4000" {
		t.Fatalf("sent %v, want the hello", st.sent)
	}
	if a := c.insp.leader(); a != "" {
		t.Fatalf("inspect address %q after a stream that never opened", a)
	}
	// A stream ended with nothing to say ends with its own error.
	if err := c.serveInspect(&endedStream{}, "follower:1", "a:4000", &fakeInspector{}); !errors.Is(err, io.EOF) {
		t.Fatalf("got %v, want io.EOF", err)
	}
}
