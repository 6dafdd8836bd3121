package main

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/rgproxy/rgproxy/internal/binlog"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/sqlscan"
)

// metrics holds rgproxy's Prometheus collectors in their own registry.
type metrics struct {
	reg        *prometheus.Registry
	statements *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	// The children of statements and duration for each class, resolved
	// once: WithLabelValues per statement hashes the label and takes the
	// vector's lock, shared by every session.
	classStatements [sqlscan.ClassFree + 1]prometheus.Counter // by sqlscan.Class; nil for fetch, a command's class the wire never reports
	classDuration   [sqlscan.ClassFree + 1]prometheus.Observer
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		statements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgproxy_statements_total",
			Help: "Statements forwarded to the backend; rgproxy's own answers and refusals are not counted.",
		}, []string{"class"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rgproxy_statement_duration_seconds",
			Help:    "Backend time of forwarded statements: forwarded to final packet, less time blocked writing to the client.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14),
		}, []string{"class"}),
	}
	for _, c := range []sqlscan.Class{sqlscan.ClassFree, sqlscan.ClassRead, sqlscan.ClassWrite, sqlscan.ClassOther} {
		m.classStatements[c] = m.statements.WithLabelValues(c.String())
		m.classDuration[c] = m.duration.WithLabelValues(c.String())
	}
	m.reg.MustRegister(m.statements, m.duration,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// registerServer exports the wire counters that mysqlproto keeps.
func (m *metrics) registerServer(srv *mysqlproto.Server) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rgproxy_connections",
			Help: "Client sessions open now.",
		}, func() float64 { return float64(srv.Stats().Connections) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rgproxy_client_bytes_total",
			Help: "Bytes exchanged with clients, both directions, packet headers and TLS records included.",
		}, func() float64 { return float64(srv.Stats().ClientBytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rgproxy_backend_bytes_total",
			Help: "Bytes exchanged with the backend, both directions, packet headers and TLS records included.",
		}, func() float64 { return float64(srv.Stats().BackendBytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rgproxy_backend_errors_total",
			Help: "Backend dial failures and backend connections lost while a statement was on them; a backend that closes an idle session (wait_timeout, KILL) closes its client and is not counted.",
		}, func() float64 { return float64(srv.Stats().BackendErrors) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rgproxy_max_connections",
			Help: "Client sessions allowed at once: --max-connections, or the ceiling derived from the file-descriptor limit.",
		}, func() float64 { return float64(srv.MaxConnections()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rgproxy_unauthenticated_connections",
			Help: "Connections accepted that have not logged in yet (bounded by --max-unauthenticated).",
		}, func() float64 { return float64(srv.Stats().Unauthenticated) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rgproxy_command_buffer_bytes",
			Help: "Bytes held for client commands being received, beyond each session's first 16 KiB (bounded by --command-buffer-limit).",
		}, func() float64 { return float64(srv.Stats().CommandBufferBytes) }),
	)
	for r := range mysqlproto.NumRefusalReasons {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "rgproxy_connections_refused_total",
			Help:        "Connections answered ERR 1040 at once, without a backend connection.",
			ConstLabels: prometheus.Labels{"reason": r.String()},
		}, func() float64 { return float64(srv.Stats().Refused[r]) }))
	}
	for k := range mysqlproto.NumProtocolErrorKinds {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "rgproxy_protocol_errors_total",
			Help:        "Client packets refused, each answered with the ERR MariaDB sends for it (see \"Security\").",
			ConstLabels: prometheus.Labels{"kind": k.String()},
		}, func() float64 { return float64(srv.Stats().ProtocolErrors[k]) }))
	}
}

// registerBinlog exports how far behind the binary-log reader is.
func (m *metrics) registerBinlog(r *binlog.Reader) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rgproxy_binlog_lag_seconds",
		Help: "Age of the newest event the binary-log reader received (1 s resolution); 0 once the backend had nothing newer to send, and while it follows no log. Exported only with --admin-user and --write-source auto or binlog.",
	}, func() float64 { return r.Lag().Seconds() }))
}

// wrap returns a policy that counts every forwarded statement, then
// delegates to next.
func (m *metrics) wrap(next mysqlproto.Policy) mysqlproto.Policy {
	return meteredPolicy{m: m, next: next}
}

type meteredPolicy struct {
	m    *metrics
	next mysqlproto.Policy
}

// WrapsPassThrough implements mysqlproto.PassThroughWrapper: with
// --metering=false the wire metrics must not cost the server its pass-
// through shortcuts.
func (p meteredPolicy) WrapsPassThrough() bool {
	_, ok := p.next.(mysqlproto.PassThrough)
	return ok
}

func (p meteredPolicy) Open(info mysqlproto.SessionInfo) mysqlproto.SessionPolicy {
	return &meteredSession{m: p.m, next: p.next.Open(info)}
}

type meteredSession struct {
	m    *metrics
	next mysqlproto.SessionPolicy
}

func (s *meteredSession) Before(ctx context.Context, st *mysqlproto.Statement, be mysqlproto.Backend) mysqlproto.Verdict {
	return s.next.Before(ctx, st, be)
}

func (s *meteredSession) After(st *mysqlproto.Statement, out *mysqlproto.Outcome) {
	if c := int(st.Class); c < len(s.m.classStatements) && s.m.classStatements[c] != nil {
		s.m.classStatements[c].Inc()
		s.m.classDuration[c].Observe(out.BackendTime.Seconds())
	}
	s.next.After(st, out)
}

func (s *meteredSession) Event(kind mysqlproto.EventKind, info mysqlproto.SessionInfo) {
	s.next.Event(kind, info)
}

// RewriteError and Progress pass mysqlproto's optional hooks through.
func (s *meteredSession) RewriteError(st *mysqlproto.Statement, code uint16) *mysqlproto.Error {
	if r, ok := s.next.(mysqlproto.ErrorRewriter); ok {
		return r.RewriteError(st, code)
	}
	return nil
}

// FollowUp passes mysqlproto's optional FollowUpper through.
func (s *meteredSession) FollowUp(ctx context.Context, st *mysqlproto.Statement, out *mysqlproto.Outcome, be mysqlproto.Backend) {
	if f, ok := s.next.(mysqlproto.FollowUpper); ok {
		f.FollowUp(ctx, st, out, be)
	}
}

func (s *meteredSession) Progress(st *mysqlproto.Statement, responseBytes int64) {
	if o, ok := s.next.(mysqlproto.ProgressObserver); ok {
		o.Progress(st, responseBytes)
	}
}

// probeTimeout bounds a /readyz backend probe.
const probeTimeout = 2 * time.Second
