package tokenclient

import (
	"errors"
	"fmt"
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// metrics are the client's Prometheus metrics (label resource_group).
type metrics struct {
	// requests counts group entries sent in TokenRequests (asks and
	// reports), by group.
	requests *prometheus.CounterVec
	// duration is the round trip of a TokenRequest.
	duration prometheus.Histogram
	// throttled counts AcquireShare refusals by group.
	throttled *prometheus.CounterVec
	// granted counts the tokens rgserver granted this proxy, by group.
	granted *prometheus.CounterVec
	// wait is the time successful Acquires waited, by group.
	wait *prometheus.HistogramVec
	// runawayDropped counts runaway events the history never got.
	runawayDropped prometheus.Counter
	// state reads tokens, RU_PER_SEC and degraded mode under the lock.
	// Every per-group series exists exactly while the group has a
	// groupState (born, forget).
	state *stateCollector
}

func newMetrics(groups *groupTable, reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgproxy_token_requests_total",
			Help: "Group entries sent to rgserver in token requests (asks and consumption reports).",
		}, []string{"resource_group"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rgproxy_token_request_duration_seconds",
			Help:    "Round trip of a token request to rgserver.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgproxy_throttled_total",
			Help: "Statements refused with 8252 — tokens, the in-flight bound, MAX_CONCURRENCY, the COOLDOWN slot or a backend slot could not be had within the wait, or a transaction's debt reached its bound — and only those: a statement that waited and ran, or ran inside a transaction on its session's debt, is not counted.",
		}, []string{"resource_group"}),
		granted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgproxy_tokens_granted_total",
			Help: "Tokens (RU) rgserver granted this proxy for a limited group (a trickle counts in full when granted).",
		}, []string{"resource_group"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rgproxy_throttle_wait_seconds",
			Help:    "How long statements waited for their group's tokens before getting them.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"resource_group"}),
		runawayDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rgproxy_runaway_events_dropped_total",
			Help: "Runaway events left out of the runaway history (information_schema.runaway_queries): the queue to rgserver was full, or rgserver refused them as malformed.",
		}),
		state: &stateCollector{groups: groups,
			tokens: prometheus.NewDesc("rgproxy_group_tokens",
				"Tokens (RU) in the group's local bucket on this proxy; negative is debt; limited groups in use here only. While the bucket holds plenty, busy sessions carry small advances of it (32 statements' worth; given back within 200 ms of a session going idle), which this does not count.", []string{"resource_group"}, nil),
			rate: prometheus.NewDesc("rgproxy_group_ru_per_sec",
				"The group's RU_PER_SEC, in every MODE (a group in WARN or OFF keeps its configured rate, for the dashboards); +Inf when RU_PER_SEC or BURSTABLE is UNLIMITED.", []string{"resource_group"}, nil),
			degraded: prometheus.NewDesc("rgproxy_degraded",
				"1 while the proxy refills its buckets locally because rgserver is unreachable.", nil, nil),
		},
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, col := range []prometheus.Collector{m.requests, m.duration, m.throttled, m.granted, m.wait, m.runawayDropped, m.state} {
		if err := reg.Register(col); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("tokenclient: register metrics: %w", err)
	}
	return m, nil
}

// stateCollector exports gauges read from the groups' state at scrape.
type stateCollector struct {
	groups                 *groupTable
	tokens, rate, degraded *prometheus.Desc
}

func (s *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- s.tokens
	ch <- s.rate
	ch <- s.degraded
}

func (s *stateCollector) Collect(ch chan<- prometheus.Metric) {
	t := s.groups
	now := t.clk.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.refreshLocked(now)
	// Only the groups this proxy serves: with 100,000 groups in the settings stream
	// cache, one series each on every proxy would be too many.
	for name, gs := range t.byName {
		if !gs.bucket.Unlimited() {
			ch <- prometheus.MustNewConstMetric(s.tokens, prometheus.GaugeValue, gs.bucket.Tokens(now), name)
		}
		if g, ok := t.cache.definition(name); ok {
			// MODE WARN and OFF keep their rate for the dashboards.
			v := float64(g.RUPerSec)
			if g.RUPerSec == resourcegroup.Unlimited || g.Burst == resourcegroup.BurstUnlimited {
				v = math.Inf(1)
			}
			ch <- prometheus.MustNewConstMetric(s.rate, prometheus.GaugeValue, v, name)
		}
	}
	d := 0.0
	if t.degraded {
		d = 1
	}
	ch <- prometheus.MustNewConstMetric(s.degraded, prometheus.GaugeValue, d)
}

// born makes a group's series exist at 0 from the moment the proxy serves
// it, so that rate() counts its first event. The gauges come with its
// state (stateCollector). It returns the group's wait histogram, which
// the group's state keeps so that a statement does not look it up by label.
func (m *metrics) born(group string) prometheus.Observer {
	m.requests.WithLabelValues(group)
	m.throttled.WithLabelValues(group)
	m.granted.WithLabelValues(group)
	return m.wait.WithLabelValues(group)
}

// forget deletes a group's series: it was dropped, or idle here for long.
func (m *metrics) forget(group string) {
	m.requests.DeleteLabelValues(group)
	m.throttled.DeleteLabelValues(group)
	m.granted.DeleteLabelValues(group)
	m.wait.DeleteLabelValues(group)
}
