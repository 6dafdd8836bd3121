package tokenclient

import (
	"fmt"
	"math"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// What-if on recorded demand: a group's past demand, as the usage history
// kept it, replayed through the bucket a proposed RU_PER_SEC and BURSTABLE
// would give it — the same Bucket that enforces them — to tell what the
// proposal would have done to that load: how long it would have been over
// its limit, what would have waited and what would have been refused.
//
// The replay is open-loop, as MODE WARN's shadow bucket is: the demand
// arrives when it was recorded, whatever the proposal does to it. A group
// that was throttled when its demand was recorded shows the demand as its
// limit shaped it (what waited ran later), so the replay of a WARN or
// unlimited group is the faithful one; the answer says so.

const (
	// whatIfMaxArrivals bounds the arrivals one interval's demand is cut
	// into: an interval's statements arrive evenly spread, each with the
	// interval's average cost, and beyond this many they are taken in
	// equal chunks, so a replay costs O(intervals), not O(statements).
	whatIfMaxArrivals = 64
	// whatIfMaxIntervals bounds one replay (400 days of hours is 9,600;
	// an hour of seconds 3,600; two days of minutes 2,880).
	whatIfMaxIntervals = 100_000
)

// DemandInterval is one interval of a group's recorded demand: the RU
// its statements asked for (those that ran and those refused) and how
// many there were. Intervals without demand may be left out.
type DemandInterval struct {
	Start      time.Time
	Length     time.Duration
	RU         float64
	Statements uint64
}

// WhatIfProposal is the bucket to replay demand through.
type WhatIfProposal struct {
	// RUPerSec is the proposed fill rate; resourcegroup.Unlimited (or a
	// BURSTABLE UNLIMITED Burst) means nothing ever waits.
	RUPerSec uint64
	Burst    resourcegroup.BurstMode
	// MaxWait is rgproxy's --max-wait: a statement that would wait longer
	// is refused (8252).
	MaxWait time.Duration
	// Budgets are replayed too: their windows start with the replay (what
	// was spent before it is not known) and follow Calendar (rgserver's;
	// a nil Loc is UTC); a THROTTLE lowers the bucket's rate until its
	// window ends, a REFUSE refuses.
	Budgets  []resourcegroup.Budget
	Calendar resourcegroup.BudgetCalendar
}

// WhatIf is what a proposal would have done to the replayed demand.
type WhatIf struct {
	// Intervals is the number of intervals with demand replayed.
	Intervals int
	// DemandRU is the demand replayed, in RU.
	DemandRU float64
	// OverSeconds is the time, in seconds of intervals, during which some
	// statement would have waited or been refused.
	OverSeconds float64
	// WaitedRU is the RU of statements that would have waited before
	// running, Waited counts them; RefusedRU of those refused, Refused
	// counts them.
	WaitedRU, RefusedRU float64
	Waited, Refused     uint64
	// WorstDelay is the longest any statement would have waited.
	WorstDelay time.Duration
	// PeakRUPerSec is the highest demand rate of one interval.
	PeakRUPerSec float64
	// BudgetRefusedRU is the part of RefusedRU a budget's REFUSE refused;
	// BudgetEvents the budgets' actions as they would have changed ("DAY
	// 100% THROTTLE(50) at 2026-11-28T14:02:00Z"), the first
	// whatIfMaxEvents.
	BudgetRefusedRU float64
	BudgetEvents    []string
}

// whatIfMaxEvents bounds WhatIf.BudgetEvents.
const whatIfMaxEvents = 8

// String shows a what-if's answer on one line.
func (w WhatIf) String() string {
	return fmt.Sprintf("intervals=%d demand=%.1fRU over=%.0fs waited=%.1fRU(%d) refused=%.1fRU(%d) worst=%s peak=%.1fRU/s",
		w.Intervals, w.DemandRU, w.OverSeconds, w.WaitedRU, w.Waited, w.RefusedRU, w.Refused, w.WorstDelay, w.PeakRUPerSec)
}

// ErrWhatIfTooLong is returned for a replay of more than
// whatIfMaxIntervals intervals.
var ErrWhatIfTooLong = fmt.Errorf("tokenclient: a what-if replays at most %d intervals", whatIfMaxIntervals)

// ReplayDemand replays demand, in time order, through p's bucket. The
// bucket starts full, as a group's does when it is created. Intervals
// with a non-positive length, a negative or non-finite RU, or out of
// order are rejected rather than guessed at.
func ReplayDemand(demand []DemandInterval, p WhatIfProposal) (WhatIf, error) {
	var w WhatIf
	if len(demand) > whatIfMaxIntervals {
		return w, ErrWhatIfTooLong
	}
	unlimited := p.RUPerSec == resourcegroup.Unlimited || p.Burst == resourcegroup.BurstUnlimited
	rate := float64(p.RUPerSec)
	var b Bucket
	var budgets *resourcegroup.BudgetState
	var verdict resourcegroup.BudgetVerdict
	capacity := p.Burst.CapacitySeconds()
	var last time.Time
	// Statements, a chunk standing for its share of its interval's.
	waited, refused := 0.0, 0.0
	for i, d := range demand {
		if d.Length <= 0 || math.IsNaN(d.RU) || math.IsInf(d.RU, 0) || d.RU < 0 {
			return WhatIf{}, fmt.Errorf("tokenclient: what-if interval %d (%s): length %s, %v RU", i, d.Start.UTC().Format(time.RFC3339), d.Length, d.RU)
		}
		if i > 0 && d.Start.Before(last) {
			return WhatIf{}, fmt.Errorf("tokenclient: what-if interval %d starts at %s, before the end of the one before it", i, d.Start.UTC().Format(time.RFC3339))
		}
		if i == 0 {
			burst := rate * capacity
			b.Reconfigure(d.Start, burst, rate, burst, 0)
			b.SetUnlimited(unlimited)
			if len(p.Budgets) > 0 {
				budgets = resourcegroup.NewBudgetStateIn(p.Budgets, p.Calendar, d.Start, nil)
			}
		}
		last = d.Start.Add(d.Length)
		if d.RU == 0 {
			continue
		}
		w.Intervals++
		w.DemandRU += d.RU
		w.PeakRUPerSec = max(w.PeakRUPerSec, d.RU/d.Length.Seconds())
		n := int(min(max(d.Statements, 1), whatIfMaxArrivals))
		each := d.RU / float64(n)
		step := d.Length / time.Duration(n)
		per := float64(max(d.Statements, 1)) / float64(n)
		over := false
		for k := range n {
			at := d.Start.Add(time.Duration(k) * step)
			if budgets != nil {
				if v := budgets.Verdict(at); !sameAction(v, verdict) {
					w.budgetEvent(v, verdict, at)
					// THROTTLE holds the bucket at its rate; lifted, the
					// proposal's rate is back.
					r := rate
					if v.Action == resourcegroup.BudgetThrottle {
						r = min(rate, float64(v.ThrottleRUPerSec))
					}
					b.Reconfigure(at, 0, r, r*capacity, 0)
					b.SetUnlimited(unlimited && v.Action != resourcegroup.BudgetThrottle)
					verdict = v
				}
				if verdict.Action == resourcegroup.BudgetRefuse {
					over = true
					w.RefusedRU += each
					w.BudgetRefusedRU += each
					refused += per
					continue
				}
			}
			wait, ok := b.Reserve(at, each, p.MaxWait)
			if ok && budgets != nil {
				budgets.Spend(each, at)
			}
			switch {
			case !ok:
				over = true
				w.RefusedRU += each
				refused += per
			case wait > 0:
				over = true
				w.WaitedRU += each
				waited += per
				w.WorstDelay = max(w.WorstDelay, wait)
			}
		}
		if over {
			w.OverSeconds += d.Length.Seconds()
		}
	}
	w.Waited, w.Refused = uint64(math.Round(waited)), uint64(math.Round(refused))
	return w, nil
}

// budgetEvent notes the budgets' verdict changing from was to v at at.
func (w *WhatIf) budgetEvent(v, was resourcegroup.BudgetVerdict, at time.Time) {
	if len(w.BudgetEvents) >= whatIfMaxEvents {
		return
	}
	what := v.String()
	if v.Action == 0 {
		what = was.Period.String() + " window over: lifted"
	}
	w.BudgetEvents = append(w.BudgetEvents, what+" at "+at.UTC().Format(time.RFC3339))
}

// sameAction reports whether two verdicts do the same (what they spent
// aside).
func sameAction(a, b resourcegroup.BudgetVerdict) bool {
	return a.Action == b.Action && a.ThrottleRUPerSec == b.ThrottleRUPerSec && a.Period == b.Period &&
		a.Percent == b.Percent && a.End.Equal(b.End)
}
