package tokenclient

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// seconds builds n one-second intervals from t0, each asking for ru RU in
// stmts statements.
func seconds(t0 time.Time, n int, ru float64, stmts uint64) []DemandInterval {
	out := make([]DemandInterval, n)
	for i := range out {
		out[i] = DemandInterval{Start: t0.Add(time.Duration(i) * time.Second), Length: time.Second, RU: ru, Statements: stmts}
	}
	return out
}

func TestReplayDemandStories(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	wait := 10 * time.Second
	cases := []struct {
		name   string
		demand []DemandInterval
		p      WhatIfProposal
		want   string
	}{
		{
			name:   "demand under the rate: nothing waits",
			demand: seconds(t0, 60, 50, 50),
			p:      WhatIfProposal{RUPerSec: 100, Burst: resourcegroup.BurstOff, MaxWait: wait},
			want:   "intervals=60 demand=3000.0RU over=0s waited=0.0RU(0) refused=0.0RU(0) worst=0s peak=50.0RU/s",
		},
		{
			// 200 RU/s into 100 RU/s: 100 RU in the full bucket and 6,000
			// of fill run, less the 1,000 still owed at the end (ten
			// seconds of waits, --max-wait); the rest, 4,900, is refused.
			name:   "twice the rate for a minute, burst off",
			demand: seconds(t0, 60, 200, 100),
			p:      WhatIfProposal{RUPerSec: 100, Burst: resourcegroup.BurstOff, MaxWait: wait},
			want:   "intervals=60 demand=12000.0RU over=60s waited=6900.0RU(3450) refused=4903.1RU(2452) worst=10s peak=200.0RU/s",
		},
		{
			// An 8-second burst of 2x fits in a MODERATED bucket's ten
			// seconds of capacity (1,000 RU) with its fill.
			name:   "a short burst into a moderated bucket",
			demand: append(seconds(t0, 8, 200, 100), seconds(t0.Add(8*time.Second), 52, 1400.0/52, 10)...),
			p:      WhatIfProposal{RUPerSec: 100, Burst: resourcegroup.BurstModerated, MaxWait: wait},
			want:   "intervals=60 demand=3000.0RU over=0s waited=0.0RU(0) refused=0.0RU(0) worst=0s peak=200.0RU/s",
		},
		{
			name:   "burstable unlimited never waits",
			demand: seconds(t0, 5, 1e6, 10),
			p:      WhatIfProposal{RUPerSec: 1, Burst: resourcegroup.BurstUnlimited, MaxWait: wait},
			want:   "intervals=5 demand=5000000.0RU over=0s waited=0.0RU(0) refused=0.0RU(0) worst=0s peak=1000000.0RU/s",
		},
		{
			// 5 statements of 50 RU, 200 ms apart, into a full 100 RU
			// bucket filling 20 RU between them: the third waits 100 ms, the
			// fourth 400 ms, the fifth 700 ms; an hour
			// later the bucket is full again and the same happens.
			name:   "idle intervals cost nothing and a gap refills the bucket",
			demand: append(seconds(t0, 1, 250, 5), seconds(t0.Add(time.Hour), 1, 250, 5)...),
			p:      WhatIfProposal{RUPerSec: 100, Burst: resourcegroup.BurstOff, MaxWait: wait},
			want:   "intervals=2 demand=500.0RU over=2s waited=300.0RU(6) refused=0.0RU(0) worst=700ms peak=250.0RU/s",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, err := ReplayDemand(tc.demand, tc.p)
			if err != nil {
				t.Fatal(err)
			}
			if got := w.String(); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestReplayDemandRejectsBadIntervals(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	p := WhatIfProposal{RUPerSec: 100, MaxWait: time.Second}
	bad := [][]DemandInterval{
		{{Start: t0, Length: 0, RU: 1}},
		{{Start: t0, Length: time.Second, RU: math.NaN()}},
		{{Start: t0, Length: time.Second, RU: math.Inf(1)}},
		{{Start: t0, Length: time.Second, RU: -1}},
		{{Start: t0, Length: time.Minute, RU: 1}, {Start: t0.Add(time.Second), Length: time.Second, RU: 1}},
	}
	for i, d := range bad {
		if _, err := ReplayDemand(d, p); err == nil {
			t.Errorf("case %d: no error", i)
		}
	}
	if _, err := ReplayDemand(make([]DemandInterval, whatIfMaxIntervals+1), p); !errors.Is(err, ErrWhatIfTooLong) {
		t.Errorf("too long: %v", err)
	}
}

// A daily budget replayed: 100 RU/s of demand for two hours into a group
// of 1,000 RU/s with BUDGET = (RU = 360000 PER DAY, ON 50 PERCENT NOTIFY,
// ON 100 PERCENT THROTTLE (RU_PER_SEC = 20)). The first hour spends
// 360,000 RU: NOTIFY at half an hour, THROTTLE at the hour, after which
// 20 RU/s run and the rest waits and is refused.
func TestReplayDemandBudget(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	p := WhatIfProposal{RUPerSec: 1000, Burst: resourcegroup.BurstOff, MaxWait: 10 * time.Second,
		Budgets: []resourcegroup.Budget{{Period: resourcegroup.PeriodDay, RU: 360000, Triggers: []resourcegroup.BudgetTrigger{
			{Percent: 50, Action: resourcegroup.BudgetNotify},
			{Percent: 100, Action: resourcegroup.BudgetThrottle, ThrottleRUPerSec: 20},
		}}}}
	w, err := ReplayDemand(seconds(t0, 7200, 100, 10), p)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"DAY 50% NOTIFY at 2026-11-28T10:30:00Z", "DAY 100% THROTTLE(20) at 2026-11-28T11:00:00Z"}
	if fmt.Sprint(w.BudgetEvents) != fmt.Sprint(want) {
		t.Errorf("events %q, want %q", w.BudgetEvents, want)
	}
	// The second hour asks 360,000 RU: at 20 RU/s 72,000 run, with the
	// 1,000 the bucket held when the throttle came (and up to 10 s of
	// --max-wait owed at the end); the rest, about 287,000, is refused.
	if w.RefusedRU < 286500 || w.RefusedRU > 288000 || w.BudgetRefusedRU != 0 || w.OverSeconds < 3580 {
		t.Errorf("throttled hour: %s", w)
	}
	// A REFUSE at 100% instead: the second hour is refused whole, by the budget.
	p.Budgets[0].Triggers[1] = resourcegroup.BudgetTrigger{Percent: 100, Action: resourcegroup.BudgetRefuse}
	w, _ = ReplayDemand(seconds(t0, 7200, 100, 10), p)
	if w.BudgetRefusedRU != 360000 || w.RefusedRU != w.BudgetRefusedRU || w.Refused != 36000 {
		t.Errorf("refusing hour: %s, by the budget %.1f", w, w.BudgetRefusedRU)
	}
}

// TestReplayDemandFollowsTheCalendar: a replayed DAY budget's window ends
// where rgserver's calendar ends it: at midnight in its time zone (Tokyo's
// midnight is 15:00 UTC), or after a compressed day.
func TestReplayDemandFollowsTheCalendar(t *testing.T) {
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 28, 14, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		cal       resourcegroup.BudgetCalendar
		refusedRU float64
		events    string
	}{
		{"UTC", resourcegroup.BudgetCalendar{}, 540000,
			"[DAY 100% REFUSE at 2026-11-28T14:30:00Z]"},
		{"Asia/Tokyo", resourcegroup.BudgetCalendar{Loc: tokyo}, 360000,
			"[DAY 100% REFUSE at 2026-11-28T14:30:00Z DAY window over: lifted at 2026-11-28T15:00:00Z DAY 100% REFUSE at 2026-11-28T15:30:00Z]"},
		{"a compressed day of 1 h", resourcegroup.BudgetCalendar{Loc: time.UTC, DayLength: time.Hour}, 360000,
			"[DAY 100% REFUSE at 2026-11-28T14:30:00Z DAY window over: lifted at 2026-11-28T15:00:00Z DAY 100% REFUSE at 2026-11-28T15:30:00Z]"},
	} {
		p := WhatIfProposal{RUPerSec: 1000, Burst: resourcegroup.BurstOff, MaxWait: 10 * time.Second, Calendar: tc.cal,
			Budgets: []resourcegroup.Budget{{Period: resourcegroup.PeriodDay, RU: 180000,
				Triggers: []resourcegroup.BudgetTrigger{{Percent: 100, Action: resourcegroup.BudgetRefuse}}}}}
		w, err := ReplayDemand(seconds(t0, 7200, 100, 10), p)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(w.BudgetEvents); got != tc.events || math.Abs(w.BudgetRefusedRU-tc.refusedRU) > 100 {
			t.Errorf("%s: events %s, %.0f RU refused by the budget; want %s, %.0f", tc.name, got, w.BudgetRefusedRU, tc.events, tc.refusedRU)
		}
	}
}
