package main

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// counterAcc adds up the increases of counters scraped from processes that
// may restart (a counter that went down started again from 0).
type counterAcc struct {
	last  map[string]float64
	total map[string]float64
}

func newCounterAcc() *counterAcc {
	return &counterAcc{last: map[string]float64{}, total: map[string]float64{}}
}

// observe notes counter value v of group at source src; baseline only
// records it.
func (a *counterAcc) observe(src, group string, v float64, baseline bool) {
	k := src + "\x00" + group
	last, seen := a.last[k]
	a.last[k] = v
	switch {
	case baseline:
	case !seen, v < last: // born (at 0) or restarted since the last scrape
		a.total[group] += v
	default:
		a.total[group] += v - last
	}
}

// byGroup sums a family's samples by resource_group.
func byGroup(fams map[string]*dto.MetricFamily, name string) map[string]float64 {
	out := map[string]float64{}
	f, ok := fams[name]
	if !ok {
		return out
	}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "resource_group" {
				out[l.GetValue()] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// monitor scrapes every rgserver and rgproxy: consumption per group, the
// NOSPACE gauge. Its fields are read once run has returned.
type monitor struct {
	sys     *system
	startAt time.Time
	polls   int
	server  *counterAcc
	proxy   *counterAcc
	// serverRU and proxyRU are the RU consumed since the first poll, by
	// group, as rgserver recorded the proxies' reports and as the proxies
	// charged it.
	serverRU map[string]float64
	proxyRU  map[string]float64
	nospace  bool
}

func newMonitor(sys *system) *monitor {
	return &monitor{sys: sys, server: newCounterAcc(), proxy: newCounterAcc()}
}

// poll scrapes once; the first poll is the baseline.
func (m *monitor) poll() error {
	baseline := m.polls == 0
	if baseline {
		m.startAt = time.Now()
	}
	m.polls++
	for _, p := range m.sys.rgs {
		if p.exited() {
			continue
		}
		fams, err := scrape(p.status)
		if err != nil {
			continue // killed meanwhile, or starting
		}
		src := p.name + ":" + strconv.Itoa(p.pid())
		for g, v := range byGroup(fams, "rgserver_ru_consumed_total") {
			m.server.observe(src, g, v, baseline)
		}
		if v, _ := sumMetric(fams, "rgserver_etcd_degraded", map[string]string{"reason": "nospace"}); v > 0 {
			m.nospace = true
		}
	}
	m.serverRU = m.server.total
	for _, p := range m.sys.pxs {
		fams, err := scrape(p.status)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		for g, v := range byGroup(fams, "rgproxy_ru_consumed_total") {
			m.proxy.observe(p.name, g, v, baseline)
		}
	}
	m.proxyRU = m.proxy.total
	return nil
}

func (m *monitor) run(ctx context.Context, every time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		_ = m.poll() // a proxy answering late is tried again
	}
}

// ddlLoop runs the periodic resource-group DDL through the proxies, in
// turn: soak_alt's RU_PER_SEC alternates; a new soak_tmp_<k> is created,
// soak_tmp is bound to it and the previous one dropped (its sessions fall
// back to default, then renew into the new one); soak_low's PRIORITY
// toggles.
type ddlLoop struct {
	sys    *system
	ok     atomic.Int64
	cycles int

	mu      sync.Mutex
	alt     []altChange
	dropped map[string]bool
}

type altChange struct {
	at   time.Time
	rate float64
}

func newDDL(sys *system) *ddlLoop {
	return &ddlLoop{sys: sys, dropped: map[string]bool{}}
}

func (d *ddlLoop) run(ctx context.Context, every time.Duration, t *tally) {
	var dbs []*sql.DB
	for _, a := range d.sys.pxAddr {
		db, err := sql.Open("mysql", dsn(a, "root", "", ""))
		if err != nil {
			t.failure("ddl", "", time.Now(), err, "")
			return
		}
		db.SetMaxOpenConns(1)
		defer db.Close()
		dbs = append(dbs, db)
	}
	live := []string{"soak_tmp_0"} // created by setup, bound
	high := false
	for k := 1; ; k++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		db := dbs[k%len(dbs)]
		exec := func(q string) bool {
			if ctx.Err() != nil {
				return false
			}
			if _, err := db.ExecContext(ctx, q); err != nil {
				if ctx.Err() == nil {
					t.failure("ddl", "", time.Now(), fmt.Errorf("%s: %w", q, err), "")
				}
				return false
			}
			d.ok.Add(1)
			return true
		}
		d.cycles++
		// soak_alt: an increase counts from before the statement, a
		// decrease from after it, so the limit never undercounts.
		rate := float64(altLow)
		if !high {
			rate = altHigh
		}
		sent := time.Now()
		if !exec(fmt.Sprintf("ALTER RESOURCE GROUP soak_alt RU_PER_SEC = %.0f", rate)) {
			continue
		}
		at := time.Now()
		if rate > altLow {
			at = sent
		}
		d.mu.Lock()
		d.alt = append(d.alt, altChange{at: at, rate: rate})
		d.mu.Unlock()
		high = !high
		if k%3 == 0 {
			prio := "HIGH"
			if k%6 == 0 {
				prio = "LOW"
			}
			if !exec("ALTER RESOURCE GROUP soak_low PRIORITY = " + prio) {
				continue
			}
		}
		name := fmt.Sprintf("soak_tmp_%d", k)
		if !exec(fmt.Sprintf("CREATE RESOURCE GROUP %s RU_PER_SEC = %d", name, tmpRUPerSec)) {
			continue
		}
		live = append(live, name)
		if !exec("ALTER USER 'soak_tmp'@'%' RESOURCE GROUP " + name) {
			continue
		}
		var keep []string
		for _, old := range live {
			if old == name {
				keep = append(keep, old)
				continue
			}
			if exec("DROP RESOURCE GROUP " + old) {
				d.mu.Lock()
				d.dropped[old] = true
				d.mu.Unlock()
			} else {
				keep = append(keep, old)
			}
		}
		live = keep
	}
}

// altLimit is soak_alt's RU_PER_SEC integrated over [from, to], plus its
// bucket's capacity at the highest rate (1 s of it).
func (d *ddlLoop) altLimit(from, to time.Time) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	rate, top, at, sum := float64(altLow), float64(altLow), from, 0.0
	for _, c := range d.alt {
		if c.at.After(to) {
			break
		}
		if c.at.After(at) {
			sum += rate * c.at.Sub(at).Seconds()
			at = c.at
		}
		rate, top = c.rate, max(top, c.rate)
	}
	sum += rate * to.Sub(at).Seconds()
	return sum + top
}

func (d *ddlLoop) wasDropped(g string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dropped[g]
}
