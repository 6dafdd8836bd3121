package rgpolicy

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/ru"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestShapesEstimate(t *testing.T) {
	now := time.Unix(1000, 0)
	k := shapeKey{group: "rg", hash: 42}
	tab := newShapes(100)
	if _, ok := tab.estimate(k, nil); ok {
		t.Fatal("a shape never seen has an estimate")
	}
	// Cold start: the first execution is the estimate.
	tab.observe(k, nil, digestText{b: []byte("SELECT ?")}, ru.Consumption{RRU: 50, BackendSeconds: 0.15}, 150*time.Millisecond, 0, false, now)
	if got := tab.String(k); got != "rru=50.000 wru=0.000 backend=0.1500s" {
		t.Fatalf("after one: %s", got)
	}
	// Then a decaying average: each execution moves it 30% of the way.
	tab.observe(k, nil, digestText{}, ru.Consumption{RRU: 100, WRU: 10}, time.Millisecond, 0, false, now)
	est, _ := tab.estimate(k, nil)
	if !near(est.RRU, 65) || !near(est.WRU, 3) {
		t.Fatalf("after two: %+v, want rru 65 wru 3", est)
	}
	for range 30 {
		tab.observe(k, nil, digestText{}, ru.Consumption{RRU: 10}, time.Millisecond, 0, false, now)
	}
	est, _ = tab.estimate(k, nil)
	if est.RRU > 10.01 || est.WRU > 0.01 {
		t.Fatalf("the estimate does not follow a shape that became cheap: %+v", est)
	}
	// Groups do not share estimates.
	if _, ok := tab.estimate(shapeKey{group: "other", hash: 42}, nil); ok {
		t.Fatal("another group's shape was estimated")
	}
}

// A shape is short — charged wall time up to cpuMinEstimate, its CPU
// unread — once nearly all its recent executions answered within
// cpuMinEstimate, and it stays short through a spike or two: a busy VM
// stalls every session's point select now and then, and each such stall
// must not cost the shape a run of CPU readings. Three slow executions in
// a row mean it turned slow: it is read again. A shape that waits is
// never short, however little CPU it was charged.
func TestShapesShortForgetsASpike(t *testing.T) {
	now := time.Unix(1000, 0)
	tab := newShapes(100)
	point := shapeKey{group: "rg", hash: 1}
	short := func(k shapeKey) bool { est, _ := tab.estimate(k, nil); return est.Short }
	const fast, slow = 100 * time.Microsecond, 45 * time.Millisecond
	steps := []struct {
		latency time.Duration
		want    bool
	}{
		{fast, true},
		{fast, true},
		{slow, true}, // the VM stalled this one
		{fast, true},
		{slow, true}, // and this one
		{fast, true},
		{fast, true},
		{slow, true}, // it turns slow for good:
		{slow, false},
		{slow, false},
		{fast, false}, // and fast again: read until 4 in 5 were fast
		{fast, false},
		{fast, false},
		{fast, true},
	}
	for i, st := range steps {
		tab.observe(point, nil, digestText{b: []byte("SELECT c FROM t WHERE id = ?")}, ru.Consumption{RRU: 0.6, BackendSeconds: st.latency.Seconds()}, st.latency, 0, false, now)
		if got := short(point); got != st.want {
			t.Fatalf("after execution %d (%v): short %v, want %v", i+1, st.latency, got, st.want)
		}
	}
	// SELECT SLEEP(1): 1 s of wall time, little CPU. It is read every time.
	sleep := shapeKey{group: "rg", hash: 2}
	for i := range 5 {
		tab.observe(sleep, nil, digestText{b: []byte("SELECT SLEEP(?)")}, ru.Consumption{RRU: 0.7, BackendSeconds: 1}, time.Second, 0, false, now)
		if short(sleep) {
			t.Fatalf("SLEEP(1) counted short after %d executions", i+1)
		}
	}
}

func TestShapesEvictLeastRecentlyUsed(t *testing.T) {
	now := time.Unix(1000, 0)
	tab := newShapes(shapeShards) // one per shard
	// Two keys in one shard: the second evicts the first.
	a := shapeKey{group: "g", hash: 1}
	b := shapeKey{group: "g", hash: 1 + shapeShards}
	if tab.shard(a) != tab.shard(b) {
		t.Fatal("test keys must share a shard")
	}
	tab.observe(a, nil, digestText{b: []byte("A")}, ru.Consumption{RRU: 1}, 0, 0, false, now)
	tab.observe(b, nil, digestText{b: []byte("B")}, ru.Consumption{RRU: 2}, 0, 0, false, now)
	if _, ok := tab.estimate(a, nil); ok {
		t.Fatal("the least recently used shape was kept past the bound")
	}
	if est, ok := tab.estimate(b, nil); !ok || est.RRU != 2 {
		t.Fatalf("the new shape: %+v %v", est, ok)
	}
	if n := tab.len(); n != 1 {
		t.Fatalf("%d shapes, want 1", n)
	}
	// With room for two, using a shape keeps it: the other one goes.
	tab = newShapes(2 * shapeShards)
	c := shapeKey{group: "g", hash: 1 + 2*shapeShards}
	tab.observe(a, nil, digestText{b: []byte("A")}, ru.Consumption{RRU: 1}, 0, 0, false, now)
	tab.observe(b, nil, digestText{b: []byte("B")}, ru.Consumption{RRU: 2}, 0, 0, false, now)
	tab.estimate(a, nil) // a is now the most recent
	tab.observe(c, nil, digestText{b: []byte("C")}, ru.Consumption{RRU: 3}, 0, 0, false, now)
	if _, ok := tab.estimate(b, nil); ok {
		t.Fatal("b should have been evicted")
	}
	if _, ok := tab.estimate(a, nil); !ok {
		t.Fatal("a was used last and must stay")
	}
}

func TestShapesSummary(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tab := newShapes(100)
	k := shapeKey{group: "rg", hash: 0xabc}
	tab.observe(k, nil, digestText{b: []byte("SELECT * FROM t WHERE id = ?")}, ru.Consumption{RRU: 2, WRU: 0}, 10*time.Millisecond, 0, false, t0)
	tab.observe(k, nil, digestText{}, ru.Consumption{RRU: 4, WRU: 1}, 30*time.Millisecond, 20*time.Millisecond, true, t0.Add(time.Second))
	tab.observe(shapeKey{group: "other", hash: 1}, nil, digestText{b: []byte("SELECT ?")}, ru.Consumption{RRU: 1}, 0, 0, false, t0)
	rows := tab.summary(func(g string) bool { return g == "rg" })
	if len(rows) != 1 {
		t.Fatalf("rows %+v", rows)
	}
	r := rows[0]
	want := ShapeSummary{Group: "rg", Digest: "0000000000000abc", DigestText: "SELECT * FROM t WHERE id = ?",
		ExecCount: 2, SumLatency: 40 * time.Millisecond, MaxLatency: 30 * time.Millisecond,
		AvgRRU: 3, MaxRRU: 4, AvgWRU: 0.5, MaxWRU: 1, AvgQueued: 10 * time.Millisecond, MaxQueued: 20 * time.Millisecond,
		SumErrors: 1, FirstSeen: t0, LastSeen: t0.Add(time.Second), EstimateRU: 2 + 0.3*2 + 0.3}
	if fmt.Sprint(r) != fmt.Sprint(want) {
		t.Fatalf("summary\n got %+v\nwant %+v", r, want)
	}
	if r.TotalRU() != 7 {
		t.Fatalf("total RU %v", r.TotalRU())
	}
	if r.AvgLatency() != 20*time.Millisecond {
		t.Fatalf("avg latency %v", r.AvgLatency())
	}
	if all := tab.summary(nil); len(all) != 2 {
		t.Fatalf("all groups: %d rows", len(all))
	}
}

func TestShapesKnownShapeAllocatesNothing(t *testing.T) {
	now := time.Unix(1000, 0)
	tab := newShapes(100)
	k := shapeKey{group: "rg", hash: 7}
	d := digestText{b: []byte("SELECT ?")}
	tab.observe(k, nil, d, ru.Consumption{RRU: 1}, 0, 0, false, now)
	if n := testing.AllocsPerRun(1000, func() {
		tab.estimate(k, nil)
		tab.observe(k, nil, d, ru.Consumption{RRU: 1}, time.Millisecond, 0, false, now)
	}); n != 0 {
		t.Fatalf("%v allocations per statement of a known shape", n)
	}
}

// A session's memo finds its shape without the map, and is not fooled
// when the table evicted the shape and reused its memory for another.
func TestShapeMemoSurvivesEviction(t *testing.T) {
	tab := newShapes(shapeShards) // one shape per shard
	now := time.Unix(0, 0)
	a := shapeKey{group: "g", hash: 1}
	b := shapeKey{group: "g", hash: 1 + shapeShards} // a's shard
	var memo shapeMemo
	tab.observe(a, &memo, digestText{b: []byte("SELECT ?")}, ru.Consumption{RRU: 5}, time.Second, 0, false, now)
	if est, ok := tab.estimate(a, &memo); !ok || est.RRU != 5 {
		t.Fatalf("a through the memo: %+v %v", est, ok)
	}
	evicted := memo.refs[0].s
	tab.observe(b, nil, digestText{b: []byte("SELECT ?, ?")}, ru.Consumption{RRU: 7}, time.Second, 0, false, now)
	if memo.refs[0].s != evicted || evicted.key != b {
		t.Fatal("b did not reuse a's memory: the test proves nothing")
	}
	if est, ok := tab.estimate(a, &memo); ok {
		t.Fatalf("a after its eviction: %+v through a stale memo", est)
	}
	if est, ok := tab.estimate(b, &memo); !ok || est.RRU != 7 {
		t.Fatalf("b: %+v %v", est, ok)
	}
}

// A short shape is estimated from the session's memo: another session's
// execution shows in it after this session's next one. Any other shape is
// read from the table every time. The memo holds the last shapeMemoSize
// shapes the session used.
func TestShapeMemoEstimatesShortShapes(t *testing.T) {
	tab := newShapes(100)
	now := time.Unix(0, 0)
	point, scan := shapeKey{group: "g", hash: 1}, shapeKey{group: "g", hash: 2}
	var mine, other shapeMemo
	for range 10 {
		tab.observe(point, &mine, digestText{b: []byte("SELECT c FROM t WHERE id = ?")}, ru.Consumption{RRU: 1}, time.Microsecond, 0, false, now)
	}
	tab.observe(point, &other, digestText{}, ru.Consumption{RRU: 11}, time.Microsecond, 0, false, now)
	if est, _ := tab.estimate(point, &mine); est.RRU != 1 || !est.Short {
		t.Fatalf("short shape through the memo: %+v, want this session's last 1 RU", est)
	}
	if est, _ := tab.estimate(point, nil); est.RRU != 4 {
		t.Fatalf("short shape from the table: %+v, want 4 RU", est)
	}
	tab.observe(scan, &other, digestText{b: []byte("SELECT COUNT(*) FROM t")}, ru.Consumption{RRU: 40}, 200*time.Millisecond, 0, false, now)
	tab.observe(scan, &mine, digestText{}, ru.Consumption{RRU: 40}, 200*time.Millisecond, 0, false, now)
	tab.observe(scan, &other, digestText{}, ru.Consumption{RRU: 50}, 200*time.Millisecond, 0, false, now)
	if est, _ := tab.estimate(scan, &mine); est.RRU != 43 || est.Short {
		t.Fatalf("a slow shape: %+v, want the table's 43 RU", est)
	}
	if est, _ := tab.estimate(point, &mine); est.RRU != 1 {
		t.Fatalf("point after scan: %+v, want the memo's 1 RU", est)
	}
	// Eight other shapes later, point is read from the table again.
	for i := range shapeMemoSize {
		tab.observe(shapeKey{group: "g", hash: uint64(100 + i)}, &mine, digestText{b: []byte("SELECT ?")}, ru.Consumption{RRU: 1}, time.Microsecond, 0, false, now)
	}
	if est, _ := tab.estimate(point, &mine); est.RRU != 4 {
		t.Fatalf("point after %d other shapes: %+v, want the table's 4 RU", shapeMemoSize, est)
	}
}

// One group's flood of new shapes evicts its own, never another group's
// last shapeGroupFloor shapes.
func TestShapesFloorPerGroup(t *testing.T) {
	tab := newShapes(10000)
	now := time.Unix(1_700_000_000, 0)
	cost := ru.Consumption{RRU: 7}
	victims := 50
	for i := range victims {
		tab.observe(shapeKey{group: "victim", hash: uint64(i) * 0x9e3779b97f4a7c15}, nil, digestText{b: []byte("SELECT ?")}, cost, time.Millisecond, 0, false, now)
	}
	for i := range 10050 {
		tab.observe(shapeKey{group: "flood", hash: uint64(i+1000) * 0xff51afd7ed558ccd}, nil, digestText{b: []byte("SELECT ?")}, ru.Consumption{RRU: 1}, time.Millisecond, 0, false, now)
	}
	for i := range victims {
		k := shapeKey{group: "victim", hash: uint64(i) * 0x9e3779b97f4a7c15}
		if est, ok := tab.estimate(k, nil); !ok || !near(est.RRU, 7) {
			t.Fatalf("victim shape %d evicted by another group's flood (%v, %v)", i, est, ok)
		}
	}
	if n := tab.len(); n > 10000+shapeShards {
		t.Fatalf("the table holds %d shapes, more than its capacity", n)
	}
	tab.countMu.Lock()
	flood, victim := tab.perGroup["flood"], tab.perGroup["victim"]
	tab.countMu.Unlock()
	if victim != victims || flood+victim != tab.len() {
		t.Fatalf("counts: flood %d victim %d, table %d", flood, victim, tab.len())
	}
	// A group over its floor loses its own least recently used shapes.
	for i := range 100 {
		tab.observe(shapeKey{group: "victim", hash: uint64(i+1_000_000) * 0x9e3779b97f4a7c15}, nil, digestText{b: []byte("SELECT ?")}, cost, time.Millisecond, 0, false, now)
	}
	if n := tab.len(); n > 10000+shapeShards {
		t.Fatalf("the table holds %d shapes", n)
	}
}

// heaviest agrees with sorting every shape's row by total RU.
func TestShapesHeaviest(t *testing.T) {
	tab := newShapes(1000)
	now := time.Unix(1000, 0)
	for i := range 500 {
		k := shapeKey{group: fmt.Sprintf("g%d", i%7), hash: uint64(i) * 0x9e3779b97f4a7c15}
		for j := range 1 + i%5 {
			tab.observe(k, nil, digestText{b: []byte(fmt.Sprintf("SELECT %d", i))}, ru.Consumption{RRU: float64((i * 37) % 101), WRU: float64(j)}, 0, 0, false, now)
		}
	}
	all := tab.summary(nil)
	slices.SortFunc(all, func(a, b ShapeSummary) int {
		if c := cmp.Compare(b.TotalRU(), a.TotalRU()); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Group, b.Group); c != 0 {
			return c
		}
		return cmp.Compare(a.Digest, b.Digest)
	})
	for _, n := range []int{0, 1, 10, 499, 500, 600} {
		got, held := tab.heaviest(n)
		want := all[:min(n, len(all))]
		if held != 500 || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("heaviest(%d): %d held\n got %v\nwant %v", n, held, got, want)
		}
	}
}
