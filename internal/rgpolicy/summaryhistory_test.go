package rgpolicy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/ru"
)

// windowsString shows the history's rows, one per line: window start,
// group, executions, RRU average and maximum, first execution in the
// window.
func windowsString(rows []windowRow) string {
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "%s-%s %s n=%d avg=%.1f max=%.1f first=%s\n", r.begin.UTC().Format("15:04"), r.end.UTC().Format("15:04"),
			r.Group, r.ExecCount, r.AvgRRU, r.MaxRRU, r.FirstSeen.UTC().Format("15:04:05"))
	}
	return b.String()
}

// A story of three windows: a shape runs in the first and third, another
// only in the second; each window shows only what ran in it, with its own
// maxima, newest first, and statements_summary still counts everything.
func TestSummaryHistoryWindows(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 14, 10, 0, 0, time.UTC)
	tab := newShapes(100)
	tab.startWindows(t0, 30*time.Minute, 2)
	a, b := shapeKey{group: "app", hash: 1}, shapeKey{group: "rep", hash: 2}
	run := func(k shapeKey, rru float64, at time.Time) {
		tab.observe(k, nil, digestText{b: []byte("SELECT ?")}, ru.Consumption{RRU: rru}, time.Millisecond, 0, false, at)
	}
	run(a, 10, t0)
	run(a, 30, t0.Add(time.Minute))
	if got, want := tab.windowEnd(), t0.Add(20*time.Minute); !got.Equal(want) {
		t.Fatalf("first window ends %s, want %s (aligned to the half hour)", got, want)
	}
	tab.roll(t0.Add(19 * time.Minute)) // early: nothing happens
	tab.roll(t0.Add(20 * time.Minute))
	run(b, 100, t0.Add(25*time.Minute))
	tab.roll(t0.Add(50 * time.Minute))
	run(a, 5, t0.Add(55*time.Minute))
	got := windowsString(tab.windowRows(nil, time.Time{}))
	want := "15:00-15:30 app n=1 avg=5.0 max=5.0 first=15:05:00\n" +
		"14:30-15:00 rep n=1 avg=100.0 max=100.0 first=14:35:00\n" +
		"14:00-14:30 app n=2 avg=20.0 max=30.0 first=14:10:00\n"
	if got != want {
		t.Fatalf("windows:\n%swant:\n%s", got, want)
	}
	if got := windowsString(tab.windowRows(func(g string) bool { return g == "rep" }, time.Time{})); got != "14:30-15:00 rep n=1 avg=100.0 max=100.0 first=14:35:00\n" {
		t.Fatalf("rep's rows alone:\n%s", got)
	}
	sum := tab.summary(nil)
	if len(sum) != 2 || sum[0].ExecCount != 3 || sum[0].MaxRRU != 30 {
		t.Fatalf("statements_summary counts since first seen: %+v", sum)
	}
	// Two closed windows are kept: the next roll drops 14:00's.
	tab.roll(t0.Add(80 * time.Minute))
	got = windowsString(tab.windowRows(nil, time.Time{}))
	want = "15:00-15:30 app n=1 avg=5.0 max=5.0 first=15:05:00\n" +
		"14:30-15:00 rep n=1 avg=100.0 max=100.0 first=14:35:00\n"
	if got != want {
		t.Fatalf("after a third roll:\n%swant:\n%s", got, want)
	}
	// A roll late by hours closes one window and starts the one now is in.
	run(b, 1, t0.Add(81*time.Minute))
	tab.roll(t0.Add(5 * time.Hour))
	if got, want := tab.windowEnd(), t0.Add(5*time.Hour+20*time.Minute); !got.Equal(want) {
		t.Fatalf("after a late roll the window ends %s, want %s", got, want)
	}
	if got := windowsString(tab.windowRows(nil, time.Time{})); !strings.HasPrefix(got, "15:30-16:00 rep n=1 avg=1.0") {
		t.Fatalf("late roll:\n%s", got)
	}
}

// The closed windows' rows are bounded together: the oldest windows go
// first once they hold more than maxSummaryHistoryRows.
func TestSummaryHistoryRowBound(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	tab := newShapes(maxSummaryHistoryRows)
	tab.startWindows(t0, time.Minute, 255)
	per := maxSummaryHistoryRows/3 + 1
	for w := range 4 {
		at := t0.Add(time.Duration(w) * time.Minute)
		for i := range per {
			tab.observe(shapeKey{group: "g", hash: uint64(i)}, nil, digestText{}, ru.Consumption{RRU: 1}, 0, 0, false, at)
		}
		tab.roll(at.Add(time.Minute))
	}
	tab.winMu.Lock()
	defer tab.winMu.Unlock()
	if n := len(tab.windows.closed); n != 2 || tab.windows.rows != 2*per {
		t.Fatalf("%d windows of %d rows kept, want 2 of %d", n, tab.windows.rows, 2*per)
	}
}
