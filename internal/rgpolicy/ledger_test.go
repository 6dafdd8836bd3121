package rgpolicy

import (
	"context"
	"io"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// bucketTokens is recordingTokens that keeps what each group's bucket was
// charged in all: acquired, charged, refunded.
type bucketTokens struct {
	*recordingTokens
	bucket map[string]float64
	purse  int // charges settled through the session's purse
}

func (b *bucketTokens) TakeShare(ctx context.Context, p *tokenclient.Purse, group string, c ru.Consumption, required float64, maxWait time.Duration) (tokenclient.Share, time.Duration, error) {
	sh, w, err := b.recordingTokens.TakeShare(ctx, p, group, c, required, maxWait)
	if err == nil {
		b.bucket[group] += c.RU()
	}
	return sh, w, err
}

func (b *bucketTokens) Settle(p *tokenclient.Purse, group string, tokens float64, rec ru.Consumption) {
	if p != nil {
		b.purse++
	}
	b.recordingTokens.Settle(p, group, tokens, rec)
	b.bucket[group] += tokens
}

// TestLedgerConserves drives one statement through the ledger's
// movements — take, refund, settle, late charges, debt — and checks that
// each group's bucket, its rgproxy_ru_consumed_total series and its
// statements_summary rows count the same RU, and what SHOW LAST STATEMENT
// RU records.
func TestLedgerConserves(t *testing.T) {
	w := func(n float64) ru.Consumption { return ru.Consumption{WRU: n, WriteBytes: n} }
	r := func(n float64) ru.Consumption { return ru.Consumption{RRU: n} }
	type lateCharge struct {
		extra   ru.Consumption
		session bool // the estimate, on the session's goroutine (else a binary-log claim)
	}
	cases := []struct {
		name     string
		before   ru.Consumption
		prepaid  ru.Consumption // what each leg takes: >= before
		tag      bool           // a second leg in group "other"
		onDebt   bool           // the legs ran on the session's debt
		switchTo string         // a SWITCH_GROUP target
		after    ru.Consumption
		refused  bool // refused after charge: refunded, never settled
		late     []lateCharge
		learn    bool
		// want: what each group paid in all, what the record shows.
		want     map[string]float64
		wantCost float64
	}{
		{name: "read", before: r(1), prepaid: r(1), after: r(2.5),
			want: map[string]float64{"bound": 3.5}, wantCost: 3.5},
		{name: "estimate above the cost is given back", before: r(1), prepaid: r(10), after: r(2),
			want: map[string]float64{"bound": 3}, wantCost: 3},
		{name: "failed write refunds its bytes", before: w(18), prepaid: w(18), after: w(-16),
			want: map[string]float64{"bound": 2}, wantCost: 2},
		{name: "refused after charge", before: r(1), prepaid: r(4), refused: true,
			want: map[string]float64{"bound": 0}},
		{name: "strict-mode tag charges two groups", before: r(1), prepaid: r(1.5), tag: true, after: r(2),
			want: map[string]float64{"bound": 3, "other": 3}, wantCost: 3},
		{name: "binary-log bytes after the statement", before: w(3), prepaid: w(3), after: w(0),
			late: []lateCharge{{extra: w(40)}}, learn: true,
			want: map[string]float64{"bound": 43}, wantCost: 3},
		{name: "estimated bytes, tagged", before: w(3), prepaid: w(5), tag: true, after: w(1),
			late: []lateCharge{{extra: w(10), session: true}}, learn: true,
			want: map[string]float64{"bound": 14, "other": 14}, wantCost: 14},
		{name: "a transaction's bytes at its end", before: r(1), prepaid: r(1), after: r(0.5),
			late: []lateCharge{{extra: w(100)}},
			want: map[string]float64{"bound": 101.5}, wantCost: 1.5},
		{name: "on debt, repaid", before: w(5), prepaid: w(8), onDebt: true, after: w(1),
			want: map[string]float64{"bound": 6}, wantCost: 6},
		// The estimate learnt outside transactions is far above what the
		// statement costs inside one (its bytes are charged at COMMIT):
		// the bucket gets 60 back, rgserver is told of 4, never of -60.
		{name: "on debt, an estimate far above the cost", before: w(2), prepaid: w(64), onDebt: true, after: w(2),
			want: map[string]float64{"bound": 4}, wantCost: 4},
		{name: "an estimate far above the cost", before: w(2), prepaid: w(64), after: w(2),
			want: map[string]float64{"bound": 4}, wantCost: 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tok := &bucketTokens{recordingTokens: testGroups(), bucket: map[string]float64{}}
			p, err := New(Config{Tokens: tok, Clock: clock.NewFake(), CPU: CPUWall,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			s := &session{p: p}
			s.led = stmtLedger{p: p, purse: &s.purse, last: &s.last}
			cur := &s.cur
			*cur = statement{group: "bound", before: tc.before, prepaid: tc.prepaid, start: p.clk.Now(),
				shape: shapeKey{group: "bound", hash: 42}, hasShape: true}
			cur.legs[0], cur.nlegs = leg{group: "bound"}, 1
			if tc.tag {
				cur.tagGroup = "other"
				cur.legs[1], cur.nlegs = leg{group: "other"}, 2
			}
			ctx := context.Background()
			for i := range cur.nlegs {
				l := &cur.legs[i]
				l.prepaid = tc.prepaid
				if tc.onDebt {
					l.onDebt = true
					continue
				}
				if _, _, err := s.led.take(ctx, l.group, i == 0, tc.prepaid, tc.before.RU(), time.Second); err != nil {
					t.Fatal(err)
				}
				l.charged = true
			}
			if tc.refused {
				s.led.refund(cur)
				s.led.recordRefused(cur, resourcegroup.CodeThrottled)
			} else {
				if tc.onDebt {
					s.runs()
				}
				s.see(cur.group, cur.start, 0)
				chargeTo := cur.group
				if tc.switchTo != "" {
					chargeTo = tc.switchTo
				}
				total := s.led.settle(cur, s.series, &s.shapes, settlement{after: tc.after, chargeTo: chargeTo,
					class: ru.ClassRead, ran: true, digest: digestText{b: []byte("select ?")}})
				to := s.led.lateTargets(cur, s.series, tc.learn)
				for _, lc := range tc.late {
					s.led.late(&to, lc.extra, srcBinlog, lc.session)
				}
				if tc.onDebt {
					if r := s.repay(ctx, "bound", time.Second); r != nil {
						t.Fatal(r.Err)
					}
				}
				if want := tc.before.RU() + tc.after.RU(); total.RU() != want {
					t.Errorf("settle returned %v RU, want %v", total.RU(), want)
				}
			}
			summary := map[string]float64{}
			for _, row := range p.shapes.summary(nil) {
				summary[row.Group] += row.TotalRU()
			}
			for g, want := range tc.want {
				counted := testutil.ToFloat64(p.metrics.ruConsumed.WithLabelValues(g, "rru")) +
					testutil.ToFloat64(p.metrics.ruConsumed.WithLabelValues(g, "wru"))
				rec := tok.recorded[g].RU()
				if math.Abs(tok.bucket[g]-want) > 1e-9 || math.Abs(counted-want) > 1e-9 || math.Abs(summary[g]-want) > 1e-9 ||
					math.Abs(rec-want) > 1e-9 {
					t.Errorf("%s: bucket %v, rgproxy_ru_consumed_total %v, statements_summary %v, recorded for rgserver %v; want %v each",
						g, tok.bucket[g], counted, summary[g], rec, want)
				}
			}
			if tok.negative != "" {
				t.Errorf("a settlement recorded a negative figure for rgserver: %s", tok.negative)
			}
			if !s.last.valid || math.Abs(s.last.cost.RU()-tc.wantCost) > 1e-9 {
				t.Errorf("the record: %+v, want a cost of %v RU", s.last, tc.wantCost)
			}
			if tc.refused && (s.last.errCode != resourcegroup.CodeThrottled || s.last.estimate != tc.prepaid) {
				t.Errorf("a refused statement's record: %+v", s.last)
			}
			if len(s.debts) != 0 {
				t.Errorf("debts left: %+v", s.debts)
			}
		})
	}
}

// A SWITCH_GROUP watch moves what came after to its target: the
// statement's group keeps the before-cost (and gets back the estimate it
// paid beyond it), the target pays the rest; the buckets and the series
// agree.
func TestLedgerSwitchGroup(t *testing.T) {
	tok := &bucketTokens{recordingTokens: testGroups(), bucket: map[string]float64{}}
	p := newTestPolicy(tok.recordingTokens)
	p.tokens = tok
	s := &session{p: p}
	s.led = stmtLedger{p: p, purse: &s.purse, last: &s.last}
	cur := &s.cur
	before := ru.Consumption{RRU: 1}
	*cur = statement{group: "bound", before: before, prepaid: ru.Consumption{RRU: 6}, start: p.clk.Now()}
	cur.legs[0], cur.nlegs = leg{group: "bound", prepaid: cur.prepaid}, 1
	if _, _, err := s.led.take(context.Background(), "bound", true, cur.prepaid, 1, time.Second); err != nil {
		t.Fatal(err)
	}
	cur.legs[0].charged = true
	s.see("bound", cur.start, 0)
	s.led.settle(cur, s.series, nil, settlement{after: ru.Consumption{RRU: 9}, chargeTo: "other", class: ru.ClassRead})
	for g, want := range map[string]float64{"bound": 1, "other": 9} {
		counted := testutil.ToFloat64(p.metrics.ruConsumed.WithLabelValues(g, "rru"))
		if tok.bucket[g] != want || counted != want {
			t.Errorf("%s: bucket %v, rgproxy_ru_consumed_total %v; want %v", g, tok.bucket[g], counted, want)
		}
	}
	if s.last.cost.RU() != 10 || s.last.group != "bound" {
		t.Errorf("the record: %+v", s.last)
	}
}

// A debt its session left that the user does not come back for within
// ledgerMemory is charged to its group, not lost: its statements were
// counted when they ran, so the group's bucket (and rgserver) must see it.
func TestLedgerExpiredDebtIsCharged(t *testing.T) {
	cases := []struct {
		name  string
		after time.Duration
		// collect: how the forgotten debt is found — the policy's sweep
		// (Run) or the user's next session.
		collect string
		want    float64 // what the group's bucket is charged
	}{
		{name: "within memory, repaid by the next session", after: ledgerMemory / 2, collect: "session", want: 7},
		{name: "within memory, the sweep keeps it", after: ledgerMemory / 2, collect: "sweep", want: 0},
		{name: "expired, found by the sweep", after: ledgerMemory + time.Second, collect: "sweep", want: 7},
		{name: "expired, found by the next session", after: ledgerMemory + time.Second, collect: "session", want: 7},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake()
			tok := &bucketTokens{recordingTokens: testGroups(), bucket: map[string]float64{}}
			p, err := New(Config{Tokens: tok, Clock: clk, CPU: CPUWall, Settings: Settings{MaxWait: time.Second},
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			s := p.Open(mysqlproto.SessionInfo{User: "app"}).(*session)
			s.debts = []debt{{group: "bound", cons: ru.Consumption{WRU: 7}, required: 1}}
			s.Event(mysqlproto.EventClose, mysqlproto.SessionInfo{User: "app"})
			if tok.bucket["bound"] != 0 {
				t.Fatalf("the debt was charged when its session ended: %v", tok.bucket)
			}
			clk.Advance(tc.after)
			switch tc.collect {
			case "sweep":
				p.chargeExpiredDebts()
			case "session":
				next := p.Open(mysqlproto.SessionInfo{User: "app"}).(*session)
				if r := next.repay(context.Background(), "bound", time.Second); r != nil {
					t.Fatal(r.Err)
				}
			}
			if got := tok.bucket["bound"]; got != tc.want {
				t.Errorf("the group's bucket was charged %v RU, want %v", got, tc.want)
			}
		})
	}
}
