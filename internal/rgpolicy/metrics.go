package rgpolicy

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
)

// metrics are the policy's Prometheus collectors, by resource group.
type metrics struct {
	ruConsumed      *prometheus.CounterVec
	groupStatements *prometheus.CounterVec
	runaway         *prometheus.CounterVec
	// unenforced: groups whose QUERY_LIMIT this proxy cannot carry out.
	unenforced *prometheus.GaugeVec
	cpu        *prometheus.GaugeVec
	// MODE WARN: what ENFORCE would have done.
	wouldWaitN   *prometheus.CounterVec
	wouldWaitSec *prometheus.CounterVec
	wouldRefuse  *prometheus.CounterVec
	// written counts the bytes charged as written, by source (wru.go).
	written *prometheus.CounterVec

	mu   sync.Mutex
	seen map[string]*groupSeries // groups whose series exist
	// forgets counts forgetGroup calls: a session that noted a group as
	// seen before the latest one notes it again, to bring its series back.
	forgets atomic.Uint64
}

// statementClasses are the classes a statement's text may have: the
// class label values of a group's statements (fetch is a command's cost
// class, counted as the read it continues).
var statementClasses = [...]ru.Class{ru.ClassRead, ru.ClassWrite, ru.ClassOther, ru.ClassFree}

// groupSeries are a group's per-statement series, looked up by label once
// when the group is first seen (or seen again after it was forgotten), so
// that a statement's charge costs no label hashing. A session keeps the
// one of its current group. at is guarded by metrics.mu.
type groupSeries struct {
	at       time.Time // the group's last statement, as seeGroup was told
	rru, wru prometheus.Counter
	stmts    [ru.ClassFree + 1]prometheus.Counter // by class; nil for fetch
	written  [nSources]prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		ruConsumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgproxy_ru_consumed_total",
			Help: "RU charged to the group by this proxy (a failed write's byte refund lowers its bucket's charge but is not subtracted here).",
		}, []string{"resource_group", "type"}),
		groupStatements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgproxy_group_statements_total",
			Help: "Metered statements charged to the group.",
		}, []string{"resource_group", "class"}),
		runaway: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgproxy_runaway_total",
			Help: "Statements that crossed their group's QUERY_LIMIT or matched a runaway watch, by the action taken; a statement that matched a watch and then crossed the limit counts once; KILL_UNENFORCED: a KILL this proxy could not carry out (no --admin-user), so the statement ran on.",
		}, []string{"resource_group", "action"}),
		unenforced: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rgproxy_query_limit_unenforced",
			Help: "1 for each resource group whose QUERY_LIMIT this proxy cannot carry out: ACTION = KILL on a proxy started without --admin-user.",
		}, []string{"resource_group"}),
		cpu: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rgproxy_cpu_source",
			Help: "1 for where the CPU part of RU comes from for the sessions opened last, 0 for the other.",
		}, []string{"source"}),
		wouldWaitN: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgproxy_would_wait_total",
			Help: "Statements of a group in MODE = WARN that ENFORCE would have made wait (for tokens or for MAX_CONCURRENCY); they ran at once.",
		}, []string{"resource_group"}),
		wouldWaitSec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgproxy_would_wait_seconds_total",
			Help: "The wait for tokens ENFORCE would have imposed on the statements rgproxy_would_wait_total counts (0 for a wait for MAX_CONCURRENCY).",
		}, []string{"resource_group"}),
		wouldRefuse: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgproxy_would_throttle_total",
			Help: "Statements of a group in MODE = WARN that ENFORCE would have refused with 8252; they ran.",
		}, []string{"resource_group"}),
		written: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgproxy_written_bytes_total",
			Help: "Bytes charged to the group as written, by the source that measured them: packet the statements' own payload, binlog what the binary log showed beyond it (for a multi-statement, a CALL or an implicit commit on MariaDB, what the session's Binlog_bytes_written grew by, less the statements' text), estimate what the estimate added beyond it (a table's average row length or the user variables a write reads), and the size of the tables copying DDL rewrote (their sum is what the group paid for).",
		}, []string{"resource_group", "source"}),
		seen: map[string]*groupSeries{},
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.ruConsumed, m.groupStatements, m.runaway, m.unenforced, m.cpu,
			m.wouldWaitN, m.wouldWaitSec, m.wouldRefuse, m.written} {
			if err := reg.Register(c); err != nil {
				return nil, errors.Join(errors.New("rgpolicy: registering metrics"), err)
			}
		}
	}
	return m, nil
}

// seeGroup makes a group's series exist at 0, so that rate() counts its
// first event, notes that the group was used at now, and returns the
// group's per-statement series.
func (m *metrics) seeGroup(group string, now time.Time) *groupSeries {
	m.mu.Lock()
	defer m.mu.Unlock()
	if gs, ok := m.seen[group]; ok {
		gs.at = now
		return gs
	}
	gs := &groupSeries{
		at:  now,
		rru: m.ruConsumed.WithLabelValues(group, "rru"),
		wru: m.ruConsumed.WithLabelValues(group, "wru"),
	}
	for _, c := range statementClasses {
		gs.stmts[c] = m.groupStatements.WithLabelValues(group, c.String())
	}
	for i, s := range srcNames {
		gs.written[i] = m.written.WithLabelValues(group, s)
	}
	m.wouldWaitN.WithLabelValues(group)
	m.wouldWaitSec.WithLabelValues(group)
	m.wouldRefuse.WithLabelValues(group)
	m.seen[group] = gs
	return gs
}

// idleGroups returns the groups whose last statement is older than
// before (never default, whose series exist from the start).
func (m *metrics) idleGroups(before time.Time) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for g, gs := range m.seen {
		if gs.at.Before(before) && g != resourcegroup.DefaultGroup {
			out = append(out, g)
		}
	}
	return out
}

// forgetGroup deletes a group's series (dropped, or idle for long).
func (m *metrics) forgetGroup(group string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forgets.Add(1)
	delete(m.seen, group)
	m.ruConsumed.DeletePartialMatch(prometheus.Labels{"resource_group": group})
	m.groupStatements.DeletePartialMatch(prometheus.Labels{"resource_group": group})
	m.runaway.DeletePartialMatch(prometheus.Labels{"resource_group": group})
	m.written.DeletePartialMatch(prometheus.Labels{"resource_group": group})
	for _, v := range []*prometheus.CounterVec{m.wouldWaitN, m.wouldWaitSec, m.wouldRefuse} {
		v.DeleteLabelValues(group)
	}
}

func (m *metrics) wouldWait(group string, d time.Duration) {
	m.wouldWaitN.WithLabelValues(group).Inc()
	m.wouldWaitSec.WithLabelValues(group).Add(d.Seconds())
}

func (m *metrics) wouldThrottle(group string) { m.wouldRefuse.WithLabelValues(group).Inc() }

func (m *metrics) cpuSource(src CPUSource) {
	for _, s := range []CPUSource{CPUWall, CPUProc} {
		v := 0.0
		if s == src {
			v = 1
		}
		m.cpu.WithLabelValues(s.String()).Set(v)
	}
}

// charged records one metered statement's total cost in its group's
// series. Counters only go up: a failed write's refund lowers what is
// charged to the bucket but is not subtracted here (its WRU may be
// negative in the total). Series forgotten meanwhile are not revived.
func (gs *groupSeries) charged(class ru.Class, c ru.Consumption) {
	gs.added(c)
	if int(class) >= len(gs.stmts) || gs.stmts[class] == nil {
		class = ru.ClassFree
	}
	gs.stmts[class].Inc()
}

// added records RU charged to the group for a statement counted in
// another group's series (after SWITCH_GROUP, the target's part).
func (gs *groupSeries) added(c ru.Consumption) {
	if c.RRU > 0 {
		gs.rru.Add(c.RRU)
	}
	if c.WRU > 0 {
		gs.wru.Add(c.WRU)
	}
}
