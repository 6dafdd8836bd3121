package tokenserver

import (
	"errors"
	"math"
	"testing"
	"time"
)

// TestUsageChart: a group's last hour in minutes and last day in
// 5-minute buckets, from the seconds and the minutes it recorded; every
// bucket present; the leader only, after its load.
func TestUsageChart(t *testing.T) {
	now := t0.Add(3 * time.Hour)
	s, err := New(nil, Config{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.UsageChart("g", time.Hour, 60); !errors.Is(err, ErrNotLeader) {
		t.Errorf("a follower's chart: %v, want ErrNotLeader", err)
	}
	s.leader.Store(true)
	s.usage.newTerm(t0)
	if _, err := s.UsageChart("g", time.Hour, 60); !errors.Is(err, ErrUsageLoading) {
		t.Errorf("a chart while loading: %v, want ErrUsageLoading", err)
	}
	s.usage.loaded = true
	// 10 minutes at 3 RU/s (2 read, 1 write) and 1 statement a second,
	// ending a minute ago; then a spike of 30 RU in one second, with a
	// refusal and a throttled statement.
	end := now.Add(-time.Minute).Truncate(time.Minute)
	for at := end.Add(-10 * time.Minute); at.Before(end); at = at.Add(time.Second) {
		s.usage.add("g", usageFigs(2, 1, 1), time.Second, at.Add(time.Second))
	}
	spike := usageFigs(30, 0, 1)
	spike[figThrottled], spike[figRefused], spike[figWaited] = 1, 1, 7
	s.usage.add("g", spike, time.Second, now.Add(-20*time.Second))
	s.usage.add("other", usageFigs(100, 0, 1), time.Second, now.Add(-30*time.Second))
	s.usage.freeze(now)

	hour, err := s.UsageChart("g", time.Hour, 60)
	if err != nil {
		t.Fatal(err)
	}
	if hour.Granularity != time.Second || hour.Bucket != time.Minute || len(hour.Points) != 60 ||
		!hour.To.Equal(now.Truncate(time.Minute).Add(time.Minute)) || hour.To.Sub(hour.From) != time.Hour {
		t.Fatalf("hour chart: granularity %v bucket %v, %d points, [%v, %v)", hour.Granularity, hour.Bucket, len(hour.Points), hour.From, hour.To)
	}
	var ru, stmts float64
	busy := 0
	for _, p := range hour.Points {
		ru += p.RUPerSec * 60
		stmts += p.Statements
		if math.Abs(p.RUPerSec-3) < 1e-9 && p.PeakRUPerSec == 3 {
			busy++
		}
	}
	last := hour.Points[len(hour.Points)-2] // the newest bucket (now, on a minute) is still empty
	if busy != 10 || math.Abs(ru-(1800+30)) > 1e-6 || stmts != 601 {
		t.Errorf("hour chart: %d busy minutes at 3 RU/s, %g RU, %g statements; want 10, 1830, 601", busy, ru, stmts)
	}
	if last.PeakRUPerSec != 30 || last.Throttled != 1 || last.Refused != 1 || last.WaitedRU != 7 || math.Abs(last.RUPerSec-0.5) > 1e-9 {
		t.Errorf("the spike's bucket: %+v", last)
	}

	day, err := s.UsageChart("g", 24*time.Hour, 288)
	if err != nil {
		t.Fatal(err)
	}
	ru = 0
	for _, p := range day.Points {
		ru += p.RUPerSec * day.Bucket.Seconds()
	}
	if day.Granularity != time.Minute || day.Bucket != 5*time.Minute || len(day.Points) != 288 || math.Abs(ru-1830) > 1e-6 {
		t.Errorf("day chart: granularity %v bucket %v, %d points, %g RU; want 1m, 5m, 288, 1830", day.Granularity, day.Bucket, len(day.Points), ru)
	}

	for _, tc := range []struct {
		group   string
		span    time.Duration
		buckets int
	}{
		{"", time.Hour, 60},
		{"g", 0, 60},
		{"g", 401 * 24 * time.Hour, 60},
		{"g", time.Hour, 0},
		{"g", time.Hour, maxChartBuckets + 1},
	} {
		if _, err := s.UsageChart(tc.group, tc.span, tc.buckets); err == nil {
			t.Errorf("UsageChart(%q, %v, %d): no error", tc.group, tc.span, tc.buckets)
		}
	}
	if c, err := s.UsageChart("never_used", time.Hour, 6); err != nil || len(c.Points) != 6 || c.Points[5].RUPerSec != 0 {
		t.Errorf("a group without history: %+v, %v", c, err)
	}
}
