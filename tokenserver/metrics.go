package tokenserver

import (
	"math"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// metrics are rgserver's Prometheus series; all by resource_group unless noted.
type metrics struct {
	ruConsumed     *prometheus.CounterVec
	readBytes      *prometheus.CounterVec
	writeBytes     *prometheus.CounterVec
	backendSeconds *prometheus.CounterVec
	statements     *prometheus.CounterVec
	tokensGranted  *prometheus.CounterVec
	acquireSeconds prometheus.Histogram

	mu     sync.Mutex
	groups map[string]*groupCounters
}

func newMetrics() *metrics {
	byGroup := []string{"resource_group"}
	return &metrics{
		groups: map[string]*groupCounters{},
		ruConsumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgserver_ru_consumed_total", Help: "Request units consumed, as reported by proxies, by kind (rru, wru).",
		}, []string{"resource_group", "type"}),
		readBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgserver_read_bytes_total", Help: "Result bytes read from backends, as reported by proxies.",
		}, byGroup),
		writeBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgserver_write_bytes_total", Help: "Bytes written to backends, as reported by proxies.",
		}, byGroup),
		backendSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgserver_backend_seconds_total", Help: "Backend time spent on statements, as reported by proxies.",
		}, byGroup),
		statements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgserver_statements_total", Help: "Statements run, as reported by proxies.",
		}, byGroup),
		tokensGranted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgserver_tokens_granted_total", Help: "Tokens (RU) granted to proxies.",
		}, byGroup),
		acquireSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rgserver_acquire_tokens_duration_seconds",
			Help:    "Time to answer one AcquireTokens stream message.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16),
		}),
	}
}

func (m *metrics) register(r prometheus.Registerer, s *Server) error {
	cs := []prometheus.Collector{
		m.ruConsumed, m.readBytes, m.writeBytes, m.backendSeconds, m.statements, m.tokensGranted, m.acquireSeconds,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rgserver_is_leader", Help: "1 if this replica is the leader, else 0.",
		}, func() float64 {
			if s.IsLeader() {
				return 1
			}
			return 0
		}),
		newGroupCollector(s),
	}
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// groupCounters are one group's counters, looked up once rather than by
// label values on every grant (the hot path).
type groupCounters struct {
	rru, wru, readBytes, writeBytes, backendSeconds, statements, granted prometheus.Counter
}

// group returns a group's counters, creating them on first use.
func (m *metrics) group(name string) *groupCounters {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.groups[name]; c != nil {
		return c
	}
	c := &groupCounters{
		rru:            m.ruConsumed.WithLabelValues(name, "rru"),
		wru:            m.ruConsumed.WithLabelValues(name, "wru"),
		readBytes:      m.readBytes.WithLabelValues(name),
		writeBytes:     m.writeBytes.WithLabelValues(name),
		backendSeconds: m.backendSeconds.WithLabelValues(name),
		statements:     m.statements.WithLabelValues(name),
		granted:        m.tokensGranted.WithLabelValues(name),
	}
	m.groups[name] = c
	return c
}

// record adds one group's reported consumption and granted tokens.
func (m *metrics) record(group string, c *pb.Consumption, granted float64) {
	if c == nil && granted <= 0 {
		return
	}
	gc := m.group(group)
	if granted > 0 {
		gc.granted.Add(granted)
	}
	if c == nil {
		return
	}
	if c.Rru > 0 {
		gc.rru.Add(c.Rru)
	}
	if c.Wru > 0 {
		gc.wru.Add(c.Wru)
	}
	if c.ReadBytes > 0 {
		gc.readBytes.Add(float64(c.ReadBytes))
	}
	if c.WriteBytes > 0 {
		gc.writeBytes.Add(float64(c.WriteBytes))
	}
	if c.BackendSeconds > 0 {
		gc.backendSeconds.Add(c.BackendSeconds)
	}
	if c.Statements > 0 {
		gc.statements.Add(float64(c.Statements))
	}
}

// forget drops a dropped group's series.
func (m *metrics) forget(group string) {
	m.mu.Lock()
	delete(m.groups, group)
	m.mu.Unlock()
	l := prometheus.Labels{"resource_group": group}
	for _, v := range []*prometheus.CounterVec{m.ruConsumed, m.readBytes, m.writeBytes, m.backendSeconds, m.statements, m.tokensGranted} {
		v.DeletePartialMatch(l)
	}
}

// groupCollector reads the allocator's buckets at scrape time, so dropped
// groups vanish from the gauges at once.
type groupCollector struct {
	s                                     *Server
	descRUPerSec, descTokens, descClients *prometheus.Desc
}

func newGroupCollector(s *Server) groupCollector {
	return groupCollector{
		s: s,
		descRUPerSec: prometheus.NewDesc("rgserver_group_ru_per_sec",
			"The group's configured RU_PER_SEC; +Inf when RU_PER_SEC = UNLIMITED.", []string{"resource_group"}, nil),
		descTokens: prometheus.NewDesc("rgserver_group_tokens",
			"Tokens in the group's global bucket (negative: promised to running trickles). Absent for unlimited groups.", []string{"resource_group"}, nil),
		descClients: prometheus.NewDesc("rgserver_group_clients",
			"Proxies holding a live slot in the group.", []string{"resource_group"}, nil),
	}
}

func (c groupCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.descRUPerSec
	ch <- c.descTokens
	ch <- c.descClients
}

func (c groupCollector) Collect(ch chan<- prometheus.Metric) {
	// Read under the lock, send after it: sending may wait for the
	// registry, and grants must not wait for a scrape.
	type row struct {
		name          string
		rate, tokens  float64
		clients       int
		limitedBucket bool
	}
	now := c.s.now()
	c.s.mu.Lock()
	names := c.s.alloc.Groups()
	rows := make([]row, 0, len(names))
	for _, name := range names {
		b := c.s.alloc.Group(name)
		r := row{name: name, rate: float64(b.settings.RUPerSec), clients: len(b.slots), limitedBucket: !b.settings.Unlimited()}
		if b.settings.RUPerSec == resourcegroup.Unlimited {
			r.rate = math.Inf(1)
		}
		if r.limitedBucket {
			r.tokens = b.Tokens(now)
		}
		rows = append(rows, r)
	}
	c.s.mu.Unlock()
	for _, r := range rows {
		if r.limitedBucket {
			ch <- prometheus.MustNewConstMetric(c.descTokens, prometheus.GaugeValue, r.tokens, r.name)
		}
		ch <- prometheus.MustNewConstMetric(c.descRUPerSec, prometheus.GaugeValue, r.rate, r.name)
		ch <- prometheus.MustNewConstMetric(c.descClients, prometheus.GaugeValue, float64(r.clients), r.name)
	}
}
