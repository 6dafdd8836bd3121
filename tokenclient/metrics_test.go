package tokenclient

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

func gather(t *testing.T, reg *prometheus.Registry) map[string][]*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]*dto.Metric{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf.GetMetric()
	}
	return out
}

func label(m *dto.Metric) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == "resource_group" {
			return l.GetValue()
		}
	}
	return ""
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c, clk := newTestClient(t, func(cfg *Config) { cfg.Registerer = reg })
	setGroups(c, resourcegroup.Group{Name: "a", RUPerSec: 10}, resourcegroup.Group{Name: "unused", RUPerSec: 10},
		resourcegroup.DefaultGroupDefinition())
	wantTokens(c, "a")
	req := build(c, false)
	clk.Advance(20 * time.Millisecond)
	if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
		{Group: "a", Tokens: 7, FillRate: 10, Proxies: 1, RuPerSec: 10}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := acquireAll(context.Background(), c, "a", rruOf(2), time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := acquireAll(context.Background(), c, "a", rruOf(500), time.Second); err == nil {
		t.Fatal("not throttled")
	}
	m := gather(t, reg)
	check := func(name string, want float64, get func(*dto.Metric) float64, group string) {
		t.Helper()
		for _, x := range m[name] {
			if label(x) == group {
				if got := get(x); got != want && !(math.IsInf(want, 1) && math.IsInf(got, 1)) {
					t.Errorf("%s{%s} = %v, want %v", name, group, got, want)
				}
				return
			}
		}
		t.Errorf("%s{%s} missing", name, group)
	}
	gauge := func(x *dto.Metric) float64 { return x.GetGauge().GetValue() }
	counter := func(x *dto.Metric) float64 { return x.GetCounter().GetValue() }
	check("rgproxy_group_tokens", 5, gauge, "a")
	check("rgproxy_group_ru_per_sec", 10, gauge, "a")
	// Only the groups this proxy serves have series: not started, it
	// serves neither default nor a group it never used.
	for name, ms := range m {
		for _, x := range ms {
			if g := label(x); g == "default" || g == "unused" {
				t.Errorf("%s{%s} exported for a group this proxy does not serve", name, g)
			}
		}
	}
	check("rgproxy_degraded", 0, gauge, "")
	check("rgproxy_token_requests_total", 1, counter, "a")
	check("rgproxy_throttled_total", 1, counter, "a")
	check("rgproxy_throttle_wait_seconds", 1, func(x *dto.Metric) float64 { return float64(x.GetHistogram().GetSampleCount()) }, "a")
	check("rgproxy_token_request_duration_seconds", 0.02, func(x *dto.Metric) float64 { return x.GetHistogram().GetSampleSum() }, "")

	// Registering twice fails cleanly.
	if _, err := New(Config{Servers: []string{"x"}, Registerer: reg}); err == nil {
		t.Fatal("duplicate registration accepted")
	}
}

// At a steady 1,000 statements/s with the rate well above the demand, the
// client sends at most one message per 1,000 statements and never throttles,
// and it reports the consumption at least every ReportPeriod.
func TestSteadyStateRequestRate(t *testing.T) {
	c, clk := newTestClient(t, nil)
	setGroups(c, resourcegroup.Group{Name: "g", RUPerSec: 5000})
	const stmts = 20000 // 20 s at 1 ms apart
	const warmup = 1000 // the first second: the demand is being learnt
	msgs := 0
	var reported float64
	lastReport := clk.Now()
	for i := range stmts {
		if _, err := acquireAll(context.Background(), c, "g", rruOf(1), 0); err != nil && i >= warmup {
			t.Fatalf("statement %d: %v", i, err)
		}
		clk.Advance(time.Millisecond)
		if i%100 == 0 { // the stream loop's tick
			if req := build(c, false); req != nil {
				if i >= warmup {
					msgs++
				}
				if g := groupEntry(req, "g"); g.GetConsumption().GetRru() > 0 {
					if gap := clk.Now().Sub(lastReport); gap > 5*time.Second+100*time.Millisecond {
						t.Fatalf("report gap %v", gap)
					}
					lastReport = clk.Now()
					reported += g.GetConsumption().GetRru()
				}
				if err := c.applyResponse(grantAll(req, 2500)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if per1000 := float64(msgs) / (stmts - warmup) * 1000; per1000 > 1 {
		t.Fatalf("%d messages for %d statements: %.2f per 1,000", msgs, stmts-warmup, per1000)
	}
	t.Logf("%d messages for %d statements", msgs, stmts-warmup)
	if reported < stmts-5*1000-1 {
		t.Fatalf("reported %v RU of %d", reported, stmts)
	}
}
