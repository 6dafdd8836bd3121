package tokenserver

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// The console's charts (cmd/rgserver's /api/history): one group's usage
// history over the last hour or day, summed into a bounded number of
// buckets so that a page draws a few hundred points whatever the span.
// They read the same tiers information_schema.resource_group_usage_history
// does, through the same query.

// Sentinel errors of UsageChart.
var (
	// ErrUsageLoading: the leader is still reading earlier terms' history.
	ErrUsageLoading = errors.New("tokenserver: usage history loading")
)

// Bounds of a chart.
const (
	// maxChartBuckets is the most buckets a chart has.
	maxChartBuckets = 1000
)

// UsageChart is one group's recorded usage over [From, To) in buckets of
// Bucket, oldest first; every bucket is present (zero where nothing
// moved).
type UsageChart struct {
	// Group is the group's name, normalized.
	Group string
	// Granularity is the history tier the chart reads (1 s, 1 min, 1 h);
	// Bucket a multiple of it.
	Granularity, Bucket time.Duration
	// From and To bound the chart: To is the end of the newest bucket.
	From, To time.Time
	// Points are the buckets.
	Points []UsageChartPoint
}

// UsageChartPoint is one bucket of a chart.
type UsageChartPoint struct {
	// Start is when the bucket starts.
	Start time.Time
	// RUPerSec is the RU (read and write) consumed in the bucket divided
	// by its length; PeakRUPerSec the highest RU/s of one of its history
	// intervals.
	RUPerSec, PeakRUPerSec float64
	// Statements, Throttled (refused with 8252) and Refused (refused
	// otherwise) are counts in the bucket; WaitedRU the estimated RU of
	// the statements that waited for tokens.
	Statements, Throttled, Refused, WaitedRU float64
}

// UsageChart returns group's history over the span before now in at most
// buckets buckets (at least one interval of the tier each). The tier is the
// finest that keeps the whole span.
func (s *Server) UsageChart(group string, span time.Duration, buckets int) (UsageChart, error) {
	var c UsageChart
	if err := resourcegroup.ValidateName(group); err != nil {
		return c, err
	}
	// The longest span is the hours' retention.
	if most := time.Duration(usageTierSeconds(usageHour)*usageTierKeep(usageHour)) * time.Second; span <= 0 || span > most {
		return c, fmt.Errorf("span %v: want more than 0 and at most %v", span, most)
	}
	if buckets <= 0 || buckets > maxChartBuckets {
		return c, fmt.Errorf("%d buckets: want 1 to %d", buckets, maxChartBuckets)
	}
	if !s.IsLeader() {
		return c, ErrNotLeader
	}
	h := s.usage
	h.mu.Lock()
	loaded := h.loaded
	h.mu.Unlock()
	if !loaded {
		return c, ErrUsageLoading
	}
	now := s.now()
	k := usageHour
	for t := range usageHour {
		if span <= time.Duration(usageTierSeconds(t)*usageTierKeep(t))*time.Second {
			k = t
			break
		}
	}
	g := usageTierSeconds(k)
	per := max(int64(math.Ceil(span.Seconds()/float64(g)/float64(buckets))), 1) // intervals per bucket
	bucket := g * per
	// Buckets end at the interval being recorded now, so the newest one
	// fills while the page watches.
	end := (now.Unix()/bucket + 1) * bucket
	n := (int64(span.Seconds()) + bucket - 1) / bucket
	start := end - n*bucket
	c = UsageChart{Group: resourcegroup.NormalizeName(group), Granularity: time.Duration(g) * time.Second,
		Bucket: time.Duration(bucket) * time.Second, From: time.Unix(start, 0).UTC(), To: time.Unix(end, 0).UTC(),
		Points: make([]UsageChartPoint, n)}
	for i := range c.Points {
		c.Points[i].Start = time.Unix(start+int64(i)*bucket, 0).UTC()
	}
	rows, _ := h.query(map[string]bool{c.Group: true}, k, start/g, end/g, int(end/g-start/g))
	for _, r := range rows {
		i := (r.p.idx*g - start) / bucket
		if i < 0 || i >= n {
			continue
		}
		p, v := &c.Points[i], r.p.v
		ru := v[figRRU] + v[figWRU]
		p.RUPerSec += ru / float64(bucket)
		p.PeakRUPerSec = max(p.PeakRUPerSec, ru/float64(g))
		p.Statements += v[figStatements]
		p.Throttled += v[figThrottled]
		p.Refused += v[figRefused]
		p.WaitedRU += v[figWaited]
	}
	return c, nil
}
