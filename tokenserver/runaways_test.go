package tokenserver

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

func runawayEvent(group, digest string, at time.Time) *pb.RunawayEvent {
	return &pb.RunawayEvent{ResourceGroup: group, SqlDigest: digest, TimeUnixMs: at.UnixMilli(),
		MatchType: "IDENTIFY", Action: "KILL", Rule: `EXEC_ELAPSED='1s'`, SampleSql: "SELECT 1", MaskedSql: "SELECT ?", Account: "u@%"}
}

// TestRunawayHistoryCollapse: events of one key within ten minutes of a
// row's start join it; later ones, other instances and other digests
// start rows of their own.
func TestRunawayHistoryCollapse(t *testing.T) {
	t0 := time.UnixMilli(1_800_000_000_000)
	for _, tc := range []struct {
		name   string
		events []struct {
			instance, digest string
			after            time.Duration
		}
		wantRows    int
		wantRepeats uint64 // of the newest row
	}{
		{"same key", []struct {
			instance, digest string
			after            time.Duration
		}{{"a", "01", 0}, {"a", "01", time.Minute}, {"a", "01", 9 * time.Minute}}, 1, 3},
		{"after the window", []struct {
			instance, digest string
			after            time.Duration
		}{{"a", "01", 0}, {"a", "01", 10 * time.Minute}}, 2, 1},
		{"two instances", []struct {
			instance, digest string
			after            time.Duration
		}{{"a", "01", 0}, {"b", "01", time.Second}}, 2, 1},
		{"two digests", []struct {
			instance, digest string
			after            time.Duration
		}{{"a", "01", 0}, {"a", "02", time.Second}, {"a", "02", 2 * time.Second}}, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newRunawayHistory(time.Hour)
			for _, e := range tc.events {
				at := t0.Add(e.after)
				if n, _ := h.record(e.instance, "", []*pb.RunawayEvent{runawayEvent("g", e.digest, at)}, anyGroup, at); n != 1 {
					t.Fatalf("record: kept %d", n)
				}
			}
			rows, _ := h.list(nil, runawayTotal)
			if len(rows) != tc.wantRows || rows[0].GetRepeats() != tc.wantRepeats {
				t.Fatalf("rows %v, want %d rows, the newest with %d repeats", rows, tc.wantRows, tc.wantRepeats)
			}
		})
	}
}

// TestRunawayHistoryBounds: per group, in all, and in time; malformed
// events are refused and strings cut.
func TestRunawayHistoryBounds(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	h := newRunawayHistory(time.Hour)
	h.perGroup, h.total = 3, 5
	for i := range 5 {
		h.record("a", "", []*pb.RunawayEvent{runawayEvent("g1", fmt.Sprintf("%x", i), now)}, anyGroup, now)
	}
	rows, _ := h.list(map[string]bool{"g1": true}, runawayTotal)
	if len(rows) != 3 || rows[2].GetSqlDigest() != "2" {
		t.Fatalf("g1 after 5 rows with 3 per group: %v", rows)
	}
	for i := range 3 {
		h.record("a", "", []*pb.RunawayEvent{runawayEvent("g2", fmt.Sprintf("%x", i), now)}, anyGroup, now)
	}
	if all, _ := h.list(nil, runawayTotal); len(all) != 5 {
		t.Fatalf("%d rows, want the total bound 5", len(all))
	}
	if got := testutil.ToFloat64(h.dropped.WithLabelValues("group_limit")); got != 2 {
		t.Errorf("group_limit drops = %v, want 2", got)
	}
	if got := testutil.ToFloat64(h.dropped.WithLabelValues("total_limit")); got != 1 {
		t.Errorf("total_limit drops = %v, want 1", got)
	}
	if n := h.expire(now.Add(2 * time.Hour)); n != 5 {
		t.Errorf("expired %d rows, want 5", n)
	}
	bad := []*pb.RunawayEvent{
		{ResourceGroup: "g", SqlDigest: "xyz", MatchType: "IDENTIFY", Action: "KILL"},
		{ResourceGroup: "", SqlDigest: "01", MatchType: "IDENTIFY", Action: "KILL"},
		{ResourceGroup: "g", SqlDigest: "01", MatchType: "ELSE", Action: "KILL"},
		{ResourceGroup: "g", SqlDigest: "01", MatchType: "WATCH"},
	}
	if n, _ := h.record("a", "", bad, anyGroup, now); n != 0 {
		t.Errorf("kept %d malformed events", n)
	}
	long := runawayEvent("g", "01", now)
	long.SampleSql = strings.Repeat("é", 1000)
	long.MaskedSql = strings.Repeat("\xff", 2000)    // not UTF-8
	long.TimeUnixMs = now.Add(time.Hour).UnixMilli() // skewed: taken as now
	h.record("a", "", []*pb.RunawayEvent{long}, anyGroup, now)
	rows, _ = h.list(nil, runawayTotal)
	if len(rows) != 1 || len(rows[0].GetSampleSql()) != 1024 || rows[0].GetStartUnixMs() != now.UnixMilli() {
		t.Errorf("a long, skewed event: %d bytes from %d", len(rows[0].GetSampleSql()), rows[0].GetStartUnixMs())
	}
	if m := rows[0].GetMaskedSql(); len(m) > 1024 || !utf8.ValidString(m) {
		t.Errorf("a long masked text of bytes: %d bytes, UTF-8 %v", len(m), utf8.ValidString(m))
	}
}

// TestRunawayHistoryOps: pending writes come out deletions first, at
// most n at a time, and a row dropped before it was written leaves
// nothing to delete.
func TestRunawayHistoryOps(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	h := newRunawayHistory(time.Hour)
	h.perGroup = 2
	h.record("a", "", []*pb.RunawayEvent{runawayEvent("g", "1", now), runawayEvent("g", "2", now)}, anyGroup, now)
	if ops := h.takeOps(10); len(ops) != 2 {
		t.Fatalf("ops %v, want 2 puts", ops)
	}
	h.record("a", "", []*pb.RunawayEvent{runawayEvent("g", "3", now), runawayEvent("g", "4", now), runawayEvent("g", "5", now)}, anyGroup, now)
	ops := h.takeOps(2)
	if len(ops) != 2 || ops[0].rec != nil || ops[1].rec != nil {
		t.Fatalf("ops %v, want the 2 deletions first", ops)
	}
	ops = h.takeOps(10)
	if len(ops) != 2 || ops[0].rec == nil {
		t.Fatalf("ops %v, want the 2 puts of the rows kept (row 3 was never written)", ops)
	}
	if r := ops[0].rec; r.Sample != "SELECT 1" || r.Masked != "SELECT ?" {
		t.Errorf("a row kept as sample %q, masked %q", r.Sample, r.Masked)
	}
	h.giveBack(ops)
	if again := h.takeOps(10); len(again) != 2 {
		t.Fatalf("after giveBack: %v", again)
	}
}

func anyGroup(string) bool { return true }

// TestRunawayHistoryShare: when a group's rows are full, the credential
// holding the most of them gives up its oldest, so that a flood of one
// credential never pushes out another's rows; events of groups that do
// not exist are not kept.
func TestRunawayHistoryShare(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	h := newRunawayHistory(time.Hour)
	h.perGroup, h.total = 100, 150
	for i := range 5 {
		h.record("real", "good", []*pb.RunawayEvent{runawayEvent("g", fmt.Sprintf("%x", i), now)}, anyGroup, now)
	}
	for i := range 10_000 {
		h.record("fake", "bad", []*pb.RunawayEvent{runawayEvent("g", fmt.Sprintf("%x", 0x1000+i), now)}, anyGroup, now)
	}
	// The history's bound: the flooder fills another group too.
	for i := range 10_000 {
		h.record("fake", "bad", []*pb.RunawayEvent{runawayEvent("h", fmt.Sprintf("%x", 0x100000+i), now)}, anyGroup, now)
	}
	rows, _ := h.list(map[string]bool{"g": true}, runawayTotal)
	real := 0
	for _, r := range rows {
		if r.GetInstance() == "real" {
			real++
		}
	}
	if real != 5 {
		t.Fatalf("%d of the 5 real rows kept among %d", real, len(rows))
	}
	if len(h.rows) > h.total {
		t.Fatalf("%d rows, bound %d", len(h.rows), h.total)
	}
	kept, unknown := h.record("fake", "bad", []*pb.RunawayEvent{runawayEvent("nosuch", "1", now)}, func(string) bool { return false }, now)
	if kept != 0 || unknown != 1 {
		t.Fatalf("an unknown group's event: kept %d, unknown %d", kept, unknown)
	}
}
