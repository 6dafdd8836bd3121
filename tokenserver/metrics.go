package tokenserver

import (
	"bufio"
	"io"
	"math"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
)

// metrics are rgserver's series that are not per group. The per-group
// series are not in the registry: with 100,000 groups they are a million
// series, which client_golang would build as a million objects on every
// scrape (seconds of CPU, hundreds of MB); MetricsHandler writes them
// straight from the allocator instead.
type metrics struct {
	acquireSeconds prometheus.Histogram
	persistErrors  prometheus.Counter
	statesWritten  prometheus.Counter
	// clamped counts token request fields clamped to their bound, by field.
	clamped *prometheus.CounterVec
	// unknownRefused counts unknown group names answered without reading
	// etcd, by reason.
	unknownRefused *prometheus.CounterVec
}

// Labels of rgserver_token_request_clamped_total{field}.
const (
	fieldDemand      = "demand_ru_per_sec"
	fieldWanted      = "tokens_wanted"
	fieldHeld        = "held_tokens"
	fieldConsumption = "consumption"
)

// Labels of rgserver_unknown_groups_refused_total{reason}.
const (
	unknownCached      = "cached"
	unknownRateLimited = "rate_limited"
)

func newMetrics() *metrics {
	m := &metrics{
		acquireSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rgserver_acquire_tokens_duration_seconds",
			Help:    "Time to answer one AcquireTokens message.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16),
		}),
		persistErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rgserver_persist_errors_total",
			Help: "Persistence rounds that failed (etcd refused or did not answer); their states are tried again.",
		}),
		statesWritten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rgserver_bucket_states_written_total",
			Help: "Bucket states written to etcd (only those that changed meaningfully).",
		}),
		clamped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgserver_token_request_clamped_total",
			Help: "Group entries of token requests with a number beyond what the group can use, clamped to its bound (see \"rgserver: who may call it\").",
		}, []string{"field"}),
		unknownRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgserver_unknown_groups_refused_total",
			Help: "Unknown group names in token requests answered UNAVAILABLE without reading etcd: found missing less than 2 s before, or beyond the stream's lookups.",
		}, []string{"reason"}),
	}
	for _, f := range []string{fieldDemand, fieldWanted, fieldHeld, fieldConsumption} {
		m.clamped.WithLabelValues(f)
	}
	for _, r := range []string{unknownCached, unknownRateLimited} {
		m.unknownRefused.WithLabelValues(r)
	}
	return m
}

// helpProxiesWithoutKill is rgserver_proxies_without_kill's HELP text.
const helpProxiesWithoutKill = "Proxies with a live token stream to this replica that cannot carry out QUERY_LIMIT ACTION = KILL (started without --admin-user); while above 0 the leader refuses a new KILL rule."

func (m *metrics) register(r prometheus.Registerer, s *Server) error {
	boolGauge := func(f func() bool) func() float64 {
		return func() float64 {
			if f() {
				return 1
			}
			return 0
		}
	}
	etcdDegraded := func(f func(*etcdHealth) bool) func() float64 {
		return boolGauge(func() bool {
			h := s.health.Load()
			return h != nil && f(h)
		})
	}
	cs := []prometheus.Collector{
		m.acquireSeconds, m.persistErrors, m.statesWritten, m.clamped, m.unknownRefused,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rgserver_proxies_without_kill", Help: helpProxiesWithoutKill,
		}, s.caps.countWithoutKill),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rgserver_is_leader", Help: "1 on the replica that leads, else 0.",
		}, boolGauge(s.IsLeader)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rgserver_granting_from_memory", Help: "1 while this leader grants tokens although its etcd session lapsed (etcd unreachable or without quorum).",
		}, boolGauge(s.orphan.Load)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rgserver_etcd_degraded", Help: "1 while etcd refuses writes for that reason: nospace (a NOSPACE alarm) or no_quorum (no quorum, or etcd unreachable).",
			ConstLabels: prometheus.Labels{"reason": "nospace"},
		}, etcdDegraded(func(h *etcdHealth) bool { return h.noSpace })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rgserver_etcd_degraded", Help: "1 while etcd refuses writes for that reason: nospace (a NOSPACE alarm) or no_quorum (no quorum, or etcd unreachable).",
			ConstLabels: prometheus.Labels{"reason": "no_quorum"},
		}, etcdDegraded(func(h *etcdHealth) bool { return h.noQuorum })),
	}
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// groupRow is one group's series at one scrape.
type groupRow struct {
	label     string // the group's name escaped as a label value
	usage     ru.Consumption
	granted   float64
	throttled float64
	rate      float64 // RU_PER_SEC, +Inf when unlimited
	tokens    float64 // with limited only
	limited   bool
	clients   int
	parent    string // PARENT, unescaped; "" for none
}

// scrapeCache is what one scrape keeps for the next, so that a scrape
// of 100,000 groups costs the writing of their series and little else:
// the groups' names in order (sorted again only when groups come or go),
// the rows' memory and the gzip writer. It keeps names, not buckets, so
// that it never holds on to a dropped group's bucket or an earlier
// term's allocator. One scrape uses it at a time; a scrape that finds it
// in use (a second scraper, or a first that a slow client holds up)
// makes its own.
type scrapeCache struct {
	mu sync.Mutex
	// names are the groups by name as of the allocator's generation gen
	// (valid when listed); labels are the same names escaped as label
	// values, side by side in one string, so that writing a million
	// series reads them in order rather than from a hundred thousand
	// places in the heap.
	listed bool
	gen    uint64
	names  []string
	labels []string
	rows   []groupRow
	gz     *gzip.Writer
}

// list brings c.names and c.labels up to the allocator: when a group came
// or went since they were made, it lists the names a chunk per hold of
// the grant lock and sorts them outside it. A group added or dropped
// during the listing may or may not be in it; the next scrape sees the
// new generation and lists again.
func (s *Server) list(c *scrapeCache) {
	s.mu.Lock()
	a := s.alloc
	if c.listed && c.gen == a.gen {
		s.mu.Unlock()
		return
	}
	gen := a.gen
	names := c.names[:0]
	n := 0
	for name := range a.groups {
		names = append(names, name)
		if n++; n%walkChunk == 0 {
			s.mu.Unlock()
			runtime.Gosched() // let waiting grants in
			s.mu.Lock()
		}
	}
	s.mu.Unlock()
	slices.Sort(names)
	var arena []byte
	ends := make([]int, len(names))
	for i, name := range names {
		arena = appendLabelValue(arena, name)
		ends[i] = len(arena)
	}
	all, start := string(arena), 0
	labels := c.labels[:0]
	for _, end := range ends {
		labels = append(labels, all[start:end])
		start = end
	}
	c.listed, c.gen, c.names, c.labels = true, gen, names, labels
}

// groupRows reads every group's series, by name: a chunk of groups per
// hold of the grant lock, each copied into a row, so that a grant waits
// at most for a chunk's copy. A group dropped since list is left out.
func (s *Server) groupRows(c *scrapeCache) []groupRow {
	s.list(c)
	now := s.now()
	rows := c.rows[:0]
	for i := 0; i < len(c.names); i += walkChunk {
		s.mu.Lock()
		for k, name := range c.names[i:min(i+walkChunk, len(c.names))] {
			b := s.alloc.groups[name]
			if b == nil {
				continue
			}
			r := groupRow{label: c.labels[i+k], usage: b.usage, granted: b.granted, throttled: b.throttled, rate: float64(b.settings.RUPerSec),
				clients: len(b.slots), limited: !b.settings.Unlimited(), parent: b.settings.Parent}
			if b.settings.RUPerSec == resourcegroup.Unlimited {
				r.rate = math.Inf(1)
			}
			if r.limited {
				r.tokens = b.Tokens(now)
			}
			rows = append(rows, r)
		}
		s.mu.Unlock()
		runtime.Gosched()
	}
	c.rows = rows
	return rows
}

// groupFamily is one per-group metric family.
type groupFamily struct {
	name, help, typ string
	// labels are the values of an extra label (`type`: "rru", "wru"), one
	// series each, or none.
	labels []string
	// value returns a series' value for a row (one per labels entry,
	// or one), ok = false for none.
	value func(r *groupRow, i int) (float64, bool)
	// labelName, when set, names a label whose value is the row's own
	// (labelValue, escaped as it is written), after resource_group.
	labelName  string
	labelValue func(r *groupRow) string
}

// groupFamilies are the per-group series, every group's from its creation
// (at 0) until it is dropped.
var groupFamilies = []groupFamily{
	{name: "rgserver_ru_consumed_total", typ: "counter", labels: []string{`type="rru"`, `type="wru"`},
		help: "RU consumed, as proxies report it.",
		value: func(r *groupRow, i int) (float64, bool) {
			if i == 0 {
				return r.usage.RRU, true
			}
			return r.usage.WRU, true
		}},
	{name: "rgserver_read_bytes_total", typ: "counter", help: "Result bytes read from backends, as proxies report them.",
		value: func(r *groupRow, _ int) (float64, bool) { return r.usage.ReadBytes, true }},
	{name: "rgserver_write_bytes_total", typ: "counter", help: "Bytes written to backends, as proxies report them.",
		value: func(r *groupRow, _ int) (float64, bool) { return r.usage.WriteBytes, true }},
	{name: "rgserver_backend_seconds_total", typ: "counter", help: "Backend time of statements, as proxies report it.",
		value: func(r *groupRow, _ int) (float64, bool) { return r.usage.BackendSeconds, true }},
	{name: "rgserver_statements_total", typ: "counter", help: "Statements run, as proxies report them.",
		value: func(r *groupRow, _ int) (float64, bool) { return r.usage.Statements, true }},
	{name: "rgserver_throttled_total", typ: "counter", help: "Statements refused with 8252, as proxies report them (each proxy's rgproxy_throttled_total, summed; a proxy reports its refusals with its consumption, within 5 s).",
		value: func(r *groupRow, _ int) (float64, bool) { return r.throttled, true }},
	{name: "rgserver_tokens_granted_total", typ: "counter", help: "Tokens (RU) granted to proxies.",
		value: func(r *groupRow, _ int) (float64, bool) { return r.granted, true }},
	{name: "rgserver_group_ru_per_sec", typ: "gauge", help: "The group's RU_PER_SEC as configured (also in MODE WARN/OFF and with BURSTABLE = UNLIMITED); +Inf when RU_PER_SEC = UNLIMITED.",
		value: func(r *groupRow, _ int) (float64, bool) { return r.rate, true }},
	{name: "rgserver_group_tokens", typ: "gauge", help: "Tokens in the group's global bucket (negative: promised to running trickles); absent for groups that are never throttled (UNLIMITED, or MODE WARN or OFF).",
		value: func(r *groupRow, _ int) (float64, bool) { return r.tokens, r.limited }},
	{name: "rgserver_group_clients", typ: "gauge", help: "Proxies holding a live slot in the group.",
		value: func(r *groupRow, _ int) (float64, bool) { return float64(r.clients), true }},
	// Only the groups with a parent have a series: 100,000 groups
	// without one cost nothing.
	{name: "rgserver_resource_group_parent_info", typ: "gauge", labelName: "parent", labelValue: func(r *groupRow) string { return r.parent },
		help:  "1 for each resource group that has a PARENT, labelled with it (parent); absent for groups without one.",
		value: func(r *groupRow, _ int) (float64, bool) { return 1, r.parent != "" }},
}

// writeYield is how many series writeGroupMetrics writes between two
// yields of its processor: a scrape of 100,000 groups writes a million
// lines, and grants that wait for a processor go first.
const writeYield = 1024

// writeChunk is how many bytes writeGroupMetrics gathers before it
// writes them: at least a bufio.Writer's buffer, so that they pass it
// without a copy.
const writeChunk = 64 << 10

// writeGroupMetrics writes every group's series in the text exposition
// format.
func writeGroupMetrics(w io.Writer, rows []groupRow) error {
	buf := make([]byte, 0, writeChunk+4<<10)
	for _, f := range groupFamilies {
		buf = append(buf, "# HELP "...)
		buf = append(buf, f.name...)
		buf = append(buf, ' ')
		buf = append(buf, f.help...)
		buf = append(buf, "\n# TYPE "...)
		buf = append(buf, f.name...)
		buf = append(buf, ' ')
		buf = append(buf, f.typ...)
		buf = append(buf, '\n')
		// What comes before and after a series' group name.
		head := f.name + `{resource_group="`
		tails := []string{`"} `}
		if len(f.labels) > 0 {
			tails = tails[:0]
			for _, l := range f.labels {
				tails = append(tails, `",`+l+"} ")
			}
		}
		for i := range rows {
			if i%writeYield == writeYield-1 {
				runtime.Gosched()
			}
			r := &rows[i]
			for j, tail := range tails {
				v, ok := f.value(r, j)
				if !ok {
					continue
				}
				buf = append(buf, head...)
				buf = append(buf, r.label...)
				if f.labelValue != nil {
					buf = append(buf, `",`...)
					buf = append(buf, f.labelName...)
					buf = append(buf, `="`...)
					buf = appendLabelValue(buf, f.labelValue(r))
				}
				buf = append(buf, tail...)
				buf = appendValue(buf, v)
				buf = append(buf, '\n')
			}
			if len(buf) >= writeChunk {
				if _, err := w.Write(buf); err != nil {
					return err
				}
				buf = buf[:0]
			}
		}
	}
	_, err := w.Write(buf)
	return err
}

// appendLabelValue escapes a label value as the text format wants.
func appendLabelValue(buf []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\':
			buf = append(buf, `\\`...)
		case '"':
			buf = append(buf, `\"`...)
		case '\n':
			buf = append(buf, `\n`...)
		default:
			buf = append(buf, c)
		}
	}
	return buf
}

func appendValue(buf []byte, v float64) []byte {
	switch {
	case math.IsInf(v, 1):
		return append(buf, "+Inf"...)
	case math.IsInf(v, -1):
		return append(buf, "-Inf"...)
	case math.IsNaN(v):
		return append(buf, "NaN"...)
	}
	return strconv.AppendFloat(buf, v, 'g', -1, 64)
}

// MetricsHandler serves /metrics in the text exposition format: the
// families of g (the registry of the process and Go metrics and this
// server's own), then every group's series, copied from the allocator a
// chunk of groups per hold of the grant lock (groupRows) and written
// outside it, yielding to grants as it goes, so that a scrape of 100,000
// groups never holds grants up.
func (s *Server) MetricsHandler(g prometheus.Gatherer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mfs, err := g.Gather()
		if err != nil && len(mfs) == 0 {
			http.Error(w, "gather metrics: "+err.Error(), http.StatusInternalServerError)
			return
		}
		c := &s.scrapes
		if c.mu.TryLock() {
			defer c.mu.Unlock()
		} else {
			c = &scrapeCache{}
		}
		rows := s.groupRows(c)
		format := expfmt.NewFormat(expfmt.TypeTextPlain)
		w.Header().Set("Content-Type", string(format))
		var out io.Writer = w
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			if c.gz == nil {
				c.gz, _ = gzip.NewWriterLevel(w, gzip.BestSpeed)
			} else {
				c.gz.Reset(w)
			}
			gz := c.gz
			defer func() {
				_ = gz.Close()
				gz.Reset(io.Discard) // hold no response until the next scrape
			}()
			out = gz
		}
		bw := bufio.NewWriterSize(out, 64<<10)
		enc := expfmt.NewEncoder(bw, format)
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				return // the client went away
			}
		}
		if err := writeGroupMetrics(bw, rows); err != nil {
			return
		}
		_ = bw.Flush()
	})
}
