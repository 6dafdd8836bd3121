package rgpolicy

import (
	"context"
	"slices"
	"strings"
	"time"
)

// statements_summary_history, after TiDB's: the shapes' figures per time
// window. statements_summary counts since this proxy first saw a shape;
// the history cuts the same counts into windows of SummaryWindow (30 min
// by default), aligned to multiples of it since the Unix epoch, and keeps
// the last SummaryWindows (24) closed ones besides the current one, so
// that "what ran between 14:00 and 14:30" has an answer.
//
// A statement costs nothing more than four max() in observe: a shape
// keeps its cumulative figures as they stood when the window began, and a
// window's row is the difference. At each window's end Policy.Run's roll
// goroutine walks the shards once, keeps a row for every shape that ran
// in the window and starts the next. A shape evicted during a window
// loses its part of that window, as it loses its statements_summary row.

const (
	// defaultSummaryWindow and defaultSummaryWindows are TiDB's defaults
	// (tidb_stmt_summary_refresh_interval, tidb_stmt_summary_history_size):
	// twelve hours in half hours.
	defaultSummaryWindow  = 30 * time.Minute
	defaultSummaryWindows = 24
	// maxSummaryHistoryRows bounds the closed windows' rows together:
	// each window holds at most the table's shapes (Config.Shapes, 10,000
	// by default), so 24 busy windows could hold 240,000 rows, about 50 MB;
	// past this bound the oldest windows go first.
	maxSummaryHistoryRows = 100_000
)

// vtSummaryHistory is the windows' virtual table.
const vtSummaryHistory = "statements_summary_history"

// summaryWindow is one closed window's rows.
type summaryWindow struct {
	begin, end time.Time
	rows       []ShapeSummary
}

// summaryWindows is the history's state, guarded by shapes.winMu.
type summaryWindows struct {
	length time.Duration // 0: no history kept
	keep   int
	begin  time.Time // the current window's start
	closed []summaryWindow
	rows   int // rows in closed
}

// startWindows starts the history at now with windows of length, keeping
// keep closed ones; length <= 0 keeps none.
func (t *shapes) startWindows(now time.Time, length time.Duration, keep int) {
	t.winMu.Lock()
	defer t.winMu.Unlock()
	t.windows = summaryWindows{length: length, keep: keep}
	if length > 0 {
		t.windows.begin = now.Truncate(length)
	}
}

// windowEnd is when the current window ends; zero when no history is
// kept.
func (t *shapes) windowEnd() time.Time {
	t.winMu.Lock()
	defer t.winMu.Unlock()
	if t.windows.length <= 0 {
		return time.Time{}
	}
	return t.windows.begin.Add(t.windows.length)
}

// roll closes the current window when now has reached its end: the
// shapes that ran in it leave their rows there and start the next one.
// A roll late by whole windows closes one window, holding what ran since
// its start, and starts the window now falls in.
func (t *shapes) roll(now time.Time) {
	t.winMu.Lock()
	defer t.winMu.Unlock()
	w := &t.windows
	if w.length <= 0 || now.Before(w.begin.Add(w.length)) {
		return
	}
	closed := summaryWindow{begin: w.begin, end: w.begin.Add(w.length)}
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for s := sh.head.next; s != &sh.head; s = s.next {
			if s.execCount > s.win.execCount {
				closed.rows = append(closed.rows, s.windowSummary())
			}
			s.win = shapeWindow{execCount: s.execCount, sumLatency: s.sumLatency, sumQueued: s.sumQueued,
				sumRRU: s.sumRRU, sumWRU: s.sumWRU, sumErrors: s.sumErrors}
		}
		sh.mu.Unlock()
	}
	sortSummary(closed.rows)
	w.closed = append(w.closed, closed)
	w.rows += len(closed.rows)
	for len(w.closed) > 0 && (len(w.closed) > w.keep || w.rows > maxSummaryHistoryRows) {
		w.rows -= len(w.closed[0].rows)
		w.closed[0] = summaryWindow{}
		w.closed = w.closed[1:]
	}
	w.begin = now.Truncate(w.length)
}

// windowSummary is the shape's row for the current window; its shard's
// lock is held.
func (s *shape) windowSummary() ShapeSummary {
	w := &s.win
	n := s.execCount - w.execCount
	d := float64(max(n, 1))
	return ShapeSummary{
		Group:      s.key.group,
		Digest:     digestHex(s.key.hash),
		DigestText: s.digest,
		ExecCount:  n,
		SumLatency: s.sumLatency - w.sumLatency, MaxLatency: w.maxLat,
		AvgRRU: (s.sumRRU - w.sumRRU) / d, MaxRRU: w.maxRRU,
		AvgWRU: (s.sumWRU - w.sumWRU) / d, MaxWRU: w.maxWRU,
		AvgQueued: (s.sumQueued - w.sumQueued) / time.Duration(max(n, 1)), MaxQueued: w.maxQueued,
		SumErrors: s.sumErrors - w.sumErrors,
		FirstSeen: w.first, LastSeen: s.lastSeen,
		EstimateRU: s.estRRU + s.estWRU,
	}
}

// windowRows returns the history's rows of the groups keep accepts (every
// group when keep is nil) at now: the current window's, then the closed
// ones', newest first, each window's by group and digest. A window that
// has ended is closed first, should the roll goroutine be late.
func (t *shapes) windowRows(keep func(string) bool, now time.Time) []windowRow {
	t.roll(now)
	t.winMu.Lock()
	defer t.winMu.Unlock()
	w := &t.windows
	if w.length <= 0 {
		return nil
	}
	var cur []ShapeSummary
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for s := sh.head.next; s != &sh.head; s = s.next {
			if s.execCount > s.win.execCount && (keep == nil || keep(s.key.group)) {
				cur = append(cur, s.windowSummary())
			}
		}
		sh.mu.Unlock()
	}
	sortSummary(cur)
	out := make([]windowRow, 0, len(cur))
	for _, r := range cur {
		out = append(out, windowRow{begin: w.begin, end: w.begin.Add(w.length), ShapeSummary: r})
	}
	for i := len(w.closed) - 1; i >= 0; i-- {
		c := &w.closed[i]
		for _, r := range c.rows {
			if keep == nil || keep(r.Group) {
				out = append(out, windowRow{begin: c.begin, end: c.end, ShapeSummary: r})
			}
		}
	}
	return out
}

// windowRow is one row of statements_summary_history.
type windowRow struct {
	begin, end time.Time
	ShapeSummary
}

// sortSummary orders rows by group and digest, as statements_summary.
func sortSummary(rows []ShapeSummary) {
	slices.SortFunc(rows, func(a, b ShapeSummary) int {
		if c := strings.Compare(a.Group, b.Group); c != 0 {
			return c
		}
		return strings.Compare(a.Digest, b.Digest)
	})
}

// summaryHistoryColumns: the window's bounds (TiDB's names), then
// statements_summary's columns.
var summaryHistoryColumns = append([]vcol{{name: "SUMMARY_BEGIN_TIME"}, {name: "SUMMARY_END_TIME"}}, summaryColumns...)

// summaryHistoryTable is statements_summary_history as the session may
// see it: the windows' rows of the groups keep accepts (nil: every group).
func (s *session) summaryHistoryTable(keep func(string) bool) *vtable {
	t := &vtable{cols: summaryHistoryColumns}
	for _, r := range s.p.shapes.windowRows(keep, s.p.clk.Now()) {
		row := append([]string{summaryTime(r.begin), summaryTime(r.end)}, summaryRow(r.ShapeSummary)...)
		t.rows = append(t.rows, cellsOf(row))
	}
	return t
}

// rollSummaries closes each summary window at its end, until ctx ends.
func (p *Policy) rollSummaries(ctx context.Context) {
	for {
		end := p.shapes.windowEnd()
		if end.IsZero() {
			return
		}
		t := p.clk.NewTimer(max(end.Sub(p.clk.Now()), 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		p.shapes.roll(p.clk.Now())
	}
}
