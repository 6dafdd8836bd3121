package tokenserver

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// Bounds of a UsageHistory request and answer.
const (
	// maxUsageGroups bounds the names of one request.
	maxUsageGroups = 1000
	// maxUsageRows is the most rows one answer has.
	maxUsageRows = 100_000
	// usageAnswerBytes bounds one answer (encoded rows).
	usageAnswerBytes = 3 << 20
	// usageFutureSlack is how far past the leader's now a range may end.
	usageFutureSlack = time.Minute
	// usageMaxRange bounds a request's range: the hours' retention and a day.
	usageMaxRange = 401 * 24 * time.Hour
)

// register adds the history's metrics.
func (h *usageHistory) register(r prometheus.Registerer) error {
	points := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "rgserver_usage_history_points",
		Help: "Points (a group's figures in one interval in which it moved) the usage history holds, by granularity (1s, 1m, 1h): on the leader, the cluster's.",
	}, []string{"granularity"})
	bytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rgserver_usage_history_bytes",
		Help: "Memory the usage history takes, as it estimates it (bounded at 256 MiB), in bytes.",
	}, func() float64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		return float64(h.bytes)
	})
	collect := &usagePointsCollector{h: h, desc: points}
	for _, c := range []prometheus.Collector{collect, bytes, h.evicted, h.written, h.persistErrors} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// usagePointsCollector reads the points per tier at each scrape.
type usagePointsCollector struct {
	h    *usageHistory
	desc *prometheus.GaugeVec
}

func (c *usagePointsCollector) Describe(ch chan<- *prometheus.Desc) { c.desc.Describe(ch) }

func (c *usagePointsCollector) Collect(ch chan<- prometheus.Metric) {
	c.h.mu.Lock()
	pts := c.h.points
	c.h.mu.Unlock()
	for k := range numUsageTiers {
		c.desc.WithLabelValues(usageTierName(k)).Set(float64(pts[k]))
	}
	c.desc.Collect(ch)
}

// reportUsage adds one bounded report of group to the history: u,
// throttled and refused as the credential book let them count, the RU
// that waited and was denied bounded per message (demand not served: no
// grant bounds it). prev is when the slot last reported the group (zero if never):
// the interval the report covers when it does not say. Called with s.mu
// held; the history's own lock is taken inside.
func (s *Server) reportUsage(name string, u ru.Consumption, throttled, refused float64, c *pb.Consumption, prev, now time.Time) {
	var f usageFigures
	f[figRRU], f[figWRU], f[figStatements], f[figThrottled] = u.RRU, u.WRU, u.Statements, throttled
	f[figRefused] = refused
	f[figWaited], f[figDenied] = c.GetWaitedRu(), c.GetDeniedRu()
	f[figCPU] = min(u.CPUSeconds, maxReportSeconds) // as the credential book let it count
	for i := range f {
		switch {
		case !(f[i] >= 0):
			f[i] = 0
		case f[i] > maxReportRU:
			f[i] = maxReportRU
		}
	}
	interval := time.Duration(c.GetIntervalMs()) * time.Millisecond
	if interval <= 0 {
		interval = time.Second
		if !prev.IsZero() {
			interval = now.Sub(prev)
		}
	}
	interval = min(interval, usageMaxInterval)
	idle := min(time.Duration(c.GetIdleMs())*time.Millisecond, interval)
	s.usage.addUntil(name, f, interval-idle, now.Add(-idle), now)
	s.reportChargeback(name, f, c, interval, idle, now)
}

// loadedErr is nil once the term's load finished, else Unavailable with
// its progress: an answer would lack what earlier terms recorded.
func (h *usageHistory) loadedErr() error {
	h.mu.Lock()
	loaded, read, total := h.loaded, h.read, h.total
	h.mu.Unlock()
	if loaded {
		return nil
	}
	pct := 0
	if total > 0 {
		pct = int(math.Floor(100 * float64(read) / float64(total)))
	}
	return status.Errorf(codes.Unavailable, "usage history loading: %d%% read; ask again in a moment", pct)
}

// usageService implements tokenpb.UsageServiceServer over a Server.
type usageService struct {
	pb.UnimplementedUsageServiceServer
	s *Server
}

// usageRequest is a validated UsageHistory request.
type usageRequest struct {
	keep     map[string]bool // nil: all groups
	tier     int
	from, to int64 // interval numbers of tier
	limit    int
}

// validateUsageRequest checks req at the leader's now and picks the tier.
func validateUsageRequest(req *pb.UsageHistoryRequest, now time.Time) (usageRequest, error) {
	var r usageRequest
	if req.GetAllGroups() == (len(req.GetGroups()) > 0) {
		return r, fmt.Errorf("want all_groups or 1 to %d group names", maxUsageGroups)
	}
	if n := len(req.GetGroups()); n > maxUsageGroups {
		return r, fmt.Errorf("%d groups, at most %d", n, maxUsageGroups)
	}
	if !req.GetAllGroups() {
		r.keep = make(map[string]bool, len(req.GetGroups()))
		for i, g := range req.GetGroups() {
			if err := resourcegroup.ValidateName(g); err != nil {
				return r, fmt.Errorf("groups[%d]: %w", i, err)
			}
			r.keep[resourcegroup.NormalizeName(g)] = true
		}
	}
	nowMs := now.UnixMilli()
	from, to := req.GetFromUnixMs(), req.GetToUnixMs()
	if to == 0 {
		to = nowMs
	}
	switch {
	case from < 0 || to <= from:
		return r, fmt.Errorf("range [%d, %d): want 0 ≤ from < to", from, to)
	case to > nowMs+usageFutureSlack.Milliseconds():
		return r, fmt.Errorf("range ends at %d, more than %v after the leader's now (%d)", to, usageFutureSlack, nowMs)
	}
	// Nothing older than the hours' retention is kept: a longer range
	// (from 0: "since the start") is cut to it.
	from = max(from, to-usageMaxRange.Milliseconds())
	switch req.GetGranularityS() {
	case 0:
		// The finest tier that keeps all of the range.
		r.tier = usageHour
		for k := range usageHour {
			if from >= (now.Unix()/usageTierSeconds(k)-usageTierKeep(k))*usageTierSeconds(k)*1000 {
				r.tier = k
				break
			}
		}
	case 1:
		r.tier = usageSec
	case 60:
		r.tier = usageMin
	case 3600:
		r.tier = usageHour
	default:
		return r, fmt.Errorf("granularity %d s: want 0, 1, 60 or 3600", req.GetGranularityS())
	}
	gms := usageTierSeconds(r.tier) * 1000
	// Intervals that start in [from, to).
	r.from, r.to = (from+gms-1)/gms, (to+gms-1)/gms
	r.limit = int(req.GetLimit())
	if r.limit <= 0 || r.limit > maxUsageRows {
		r.limit = maxUsageRows
	}
	return r, nil
}

// UsageHistory implements tokenpb.UsageServiceServer: the leader answers
// from memory; a follower names the leader; during the term's load it is
// Unavailable (the answer would lack what earlier terms recorded).
func (us usageService) UsageHistory(_ context.Context, req *pb.UsageHistoryRequest) (*pb.UsageHistoryResponse, error) {
	s := us.s
	if !s.IsLeader() {
		return &pb.UsageHistoryResponse{NotLeader: &pb.NotLeader{LeaderAddr: s.LeaderAddr()}}, nil
	}
	now := s.now()
	r, err := validateUsageRequest(req, now)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "malformed usage history request: %v", err)
	}
	h := s.usage
	if err := h.loadedErr(); err != nil {
		return nil, err
	}
	rows, truncated := h.query(r.keep, r.tier, r.from, r.to, r.limit)
	out := make([]*pb.UsageHistoryRow, 0, len(rows))
	size := 0
	for _, row := range rows {
		m := rowToPB(row, r.tier)
		n := proto.Size(m) + 4
		if size+n > usageAnswerBytes {
			truncated = true
			break
		}
		size += n
		out = append(out, m)
	}
	return &pb.UsageHistoryResponse{Rows: out, Truncated: truncated}, nil
}
