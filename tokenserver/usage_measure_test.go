package tokenserver

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestUsageAddAllocatesNothing: a busy group's report allocates nothing.
func TestUsageAddAllocatesNothing(t *testing.T) {
	h := loadedHistory(t0)
	now := t0.Add(time.Minute)
	h.add("g", usageFigs(1, 1, 1), time.Second, now)
	if n := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		h.add("g", usageFigs(1.5, 0.25, 3), 3*time.Second, now)
	}); n != 0 {
		t.Errorf("%v allocations per report", n)
	}
}

// TestUsageMeasure measures the history of 100,000 groups of which 1,000
// are busy every second for an hour (an injected clock, the embedded
// etcd, a persist round every 5 s): the bytes in etcd, the history's
// memory, the heap. Long: run with
// RGPROXY_USAGE_MEASURE=1 go test -count=1 -run TestUsageMeasure -v ./tokenserver/
// (RGPROXY_USAGE_BUSY and RGPROXY_USAGE_SECONDS change the 1,000 busy
// groups and the 3,600 s).
func TestUsageMeasure(t *testing.T) {
	if os.Getenv("RGPROXY_USAGE_MEASURE") == "" {
		t.Skip("set RGPROXY_USAGE_MEASURE=1 to measure")
	}
	cli := startEtcd(t)
	ts := startServer(t, cli, "")
	waitFor(t, "leader", ts.srv.IsLeader)
	waitFor(t, "load", func() bool { ts.srv.usage.mu.Lock(); defer ts.srv.usage.mu.Unlock(); return ts.srv.usage.loaded })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	s := ts.srv
	now := ts.clock.Now()
	s.mu.Lock()
	for i := range 100_000 {
		s.alloc.SetGroup(fmt.Sprintf("g%06d", i), Settings{RUPerSec: 1000}, now)
	}
	s.mu.Unlock()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	heap0 := heap()
	rng := rand.New(rand.NewPCG(1, 2))
	seconds := 3600
	if v := os.Getenv("RGPROXY_USAGE_SECONDS"); v != "" {
		fmt.Sscan(v, &seconds)
	}
	busy := 1000
	if v := os.Getenv("RGPROXY_USAGE_BUSY"); v != "" {
		fmt.Sscan(v, &busy)
	}
	names := make([]string, busy)
	for g := range names {
		names[g] = fmt.Sprintf("g%06d", g*100_000/busy)
	}
	var addTime time.Duration
	for sec := range seconds {
		ts.clock.Advance(time.Second)
		now := ts.clock.Now()
		start := time.Now()
		s.mu.Lock()
		for _, name := range names {
			var f usageFigures
			f[figRRU] = 50 + rng.Float64()*100
			f[figWRU] = rng.Float64() * 20
			f[figStatements] = float64(20 + rng.IntN(80))
			if rng.IntN(10) == 0 {
				f[figThrottled] = float64(rng.IntN(5))
				f[figDenied] = rng.Float64() * 30
			}
			if rng.IntN(4) == 0 {
				f[figWaited] = rng.Float64() * 50
			}
			s.usage.add(name, f, time.Second, now)
		}
		s.mu.Unlock()
		addTime += time.Since(start)
		if sec%5 == 4 {
			if err := s.persistUsage(ctx, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	heap1 := heap()
	resp, err := cli.Get(ctx, keyUsage, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var live int
	perTier := map[string]int{}
	for _, kv := range resp.Kvs {
		live += len(kv.Value)
		k, _, _, _ := parseUsageKey(string(kv.Key))
		perTier[usageTierName(k)] += len(kv.Value)
	}
	_, db := etcdStatus(t, cli)
	s.usage.mu.Lock()
	hb, pts := s.usage.bytes, s.usage.points
	s.usage.mu.Unlock()
	t.Logf("%d s, %d busy of 100,000 groups: %d keys, %d bytes of values in etcd %v, etcd db %d bytes; history %d bytes (estimate), points %v; heap +%d bytes; %.0f ns per report",
		seconds, busy, len(resp.Kvs), live, perTier, db, hb, pts, int64(heap1)-int64(heap0), float64(addTime.Nanoseconds())/float64(seconds*busy))
	// A leader change: the next term loads it all back.
	b := startServer(t, cli, "")
	b.clock.Advance(ts.clock.Now().Sub(b.clock.Now()))
	ts.stop()
	start := time.Now()
	waitFor(t, "b leads", b.srv.IsLeader)
	waitFor(t, "b's load", func() bool { b.srv.usage.mu.Lock(); defer b.srv.usage.mu.Unlock(); return b.srv.usage.loaded })
	b.srv.usage.mu.Lock()
	t.Logf("the next leader loaded it in %v: history %d bytes (estimate), points %v", time.Since(start).Round(time.Millisecond), b.srv.usage.bytes, b.srv.usage.points)
	b.srv.usage.mu.Unlock()
}

// BenchmarkUsageAdd: one report of a busy group covering 1 s (of 1,000
// groups, frozen every 5 s as the persist tick does).
func BenchmarkUsageAdd(b *testing.B) {
	h := loadedHistory(t0)
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("g%06d", i)
	}
	now := t0
	f := usageFigs(123.4, 5.6, 42)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%1000 == 0 {
			now = now.Add(time.Second)
			if i%5000 == 0 {
				h.mu.Lock()
				h.freeze(now)
				h.mu.Unlock()
			}
		}
		h.add(names[i%1000], f, time.Second, now)
	}
}
