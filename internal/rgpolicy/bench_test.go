package rgpolicy

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// benchTokens is the cheapest Tokens there is: the benchmark measures the
// policy's own work per statement, not a token client's.
type benchTokens struct {
	recordingTokens
}

func (b *benchTokens) TakeShare(context.Context, *tokenclient.Purse, string, ru.Consumption, float64, time.Duration) (tokenclient.Share, time.Duration, error) {
	return tokenclient.Share{Rate: 1e5, BurstSeconds: 1, Proxies: 1}, 0, nil
}

func (b *benchTokens) Settle(*tokenclient.Purse, string, float64, ru.Consumption) {}

func (b *benchTokens) Attribute(*tokenclient.Purse, string, []tokenclient.BilledTag, string, ru.Consumption) {
}

// newPointSelect returns a bound user's session and a point select with
// its outcome, on benchTokens.
func newPointSelect(tb testing.TB) (mysqlproto.SessionPolicy, *mysqlproto.Statement, *mysqlproto.Outcome) {
	tok := &benchTokens{*testGroups()}
	tok.groups["bound"] = resourcegroup.Group{Name: "bound", RUPerSec: 100000}
	p, err := New(Config{Tokens: tok, Settings: Settings{MaxWait: time.Second}, CPU: CPUWall,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatal(err)
	}
	st := query("SELECT c FROM sbtest1 WHERE id = 4711")
	out := &mysqlproto.Outcome{RequestBytes: st.PayloadBytes, ResponseBytes: 180, BackendTime: 150 * time.Microsecond}
	return p.Open(mysqlproto.SessionInfo{User: "app"}), st, out
}

// A known shape's statement costs the policy no allocation, Before to
// FollowUp.
func TestPolicyPointSelectAllocatesNothing(t *testing.T) {
	s, st, out := newPointSelect(t)
	var be mysqlproto.Backend = plainGrants
	ctx := context.Background()
	run := func() {
		if v := s.Before(ctx, st, be); v.Reply != nil {
			t.Fatal(v.Reply.Err)
		}
		s.After(st, out)
		s.(mysqlproto.FollowUpper).FollowUp(ctx, st, out, be)
	}
	run() // the first: a new shape, the account's binding
	if n := testing.AllocsPerRun(1000, run); n != 0 {
		t.Fatalf("%v allocations per statement, want 0", n)
	}
}

// BenchmarkPolicyPointSelect runs Before and After of a bound user's point
// select, the statement every OLTP benchmark is made of: the policy's part
// of what metering costs a statement (warm caches; under sysbench on a
// busy 2-core VM the same path costs several times more), allocation-free.
func BenchmarkPolicyPointSelect(b *testing.B) {
	s, st, out := newPointSelect(b)
	ctx := context.Background()
	var be mysqlproto.Backend = plainGrants
	b.ReportAllocs()
	for b.Loop() {
		if v := s.Before(ctx, st, be); v.Reply != nil {
			b.Fatal(v.Reply.Err)
		}
		s.After(st, out)
		s.(mysqlproto.FollowUpper).FollowUp(ctx, st, out, be)
	}
}
