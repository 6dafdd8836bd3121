package tokenclient

import (
	"errors"
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
