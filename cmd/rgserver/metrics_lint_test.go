package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenclient"
	"github.com/rgproxy/rgproxy/tokenserver"
)

// lintKnownProblems are promlint findings on names this package does not
// own, waiting for a rename in tokenserver; any other finding fails.
func lintKnownProblems() []string {
	return []string{"rgserver_group_ru_per_sec: metric names should not contain abbreviated units"}
}

// TestMetricsLint lints what rgserver's /metrics serves, built as run
// builds it, after a proxy has asked for tokens and reported consumption.
func TestMetricsLint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	e, err := tokenserver.StartEmbeddedEtcd(ctx, tokenserver.EmbedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := tokenserver.New(cli, tokenserver.Config{AdvertiseAddr: lis.Addr().String(), Logger: quiet, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	rctx, rcancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { _ = srv.Run(rctx); close(ran) }()
	defer func() { rcancel(); <-ran }()

	tc, err := tokenclient.New(tokenclient.Config{
		Servers: []string{lis.Addr().String()}, ReportPeriod: 50 * time.Millisecond, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if err := tc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tc.Store().CreateGroup(ctx, resourcegroup.Group{Name: "lint", RUPerSec: 1000}); err != nil {
		t.Fatal(err)
	}
	mux, err := statusMux(srv, cli, reg, &consoleSource{srv: srv})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(mux)
	defer hs.Close()
	cost := ru.Consumption{RRU: 2, WRU: 1, ReadBytes: 100, WriteBytes: 10, BackendSeconds: 0.001, Statements: 1}
	// Reports travel every ReportPeriod; wait until one has been recorded.
	var mfs []*dto.MetricFamily
	for {
		mfs = scrapeFamilies(t, hs.URL+"/metrics")
		if familyValue(mfs, "rgserver_statements_total", "lint") > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("no consumption report reached rgserver")
		}
		if _, _, err := tc.AcquireShare(ctx, nil, "lint", cost, cost.RU(), time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	for _, want := range []string{
		"rgserver_ru_consumed_total", "rgserver_read_bytes_total", "rgserver_write_bytes_total",
		"rgserver_backend_seconds_total", "rgserver_statements_total", "rgserver_throttled_total", "rgserver_tokens_granted_total",
		"rgserver_acquire_tokens_duration_seconds", "rgserver_is_leader", "rgserver_group_ru_per_sec",
		"rgserver_group_tokens", "rgserver_group_clients",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("%s not gathered; have %s", want, strings.Join(names, " "))
		}
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if !slices.Contains(lintKnownProblems(), p.Metric+": "+p.Text) {
			t.Errorf("%s: %s", p.Metric, p.Text)
		} else {
			t.Logf("known, to be renamed in tokenserver: %s: %s", p.Metric, p.Text)
		}
	}
}

// scrapeFamilies reads and parses the text served at url.
func scrapeFamilies(t *testing.T, url string) []*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	byName, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s does not parse: %v", url, err)
	}
	var out []*dto.MetricFamily
	for _, mf := range byName {
		out = append(out, mf)
	}
	slices.SortFunc(out, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}

// familyValue is the counter or gauge of name for group, 0 if absent.
func familyValue(mfs []*dto.MetricFamily, name, group string) float64 {
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "resource_group" && l.GetValue() == group {
					return m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}
