package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/rgproxy/rgproxy/internal/binlog"
	"github.com/rgproxy/rgproxy/internal/rgpolicy"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenclient"
	"github.com/rgproxy/rgproxy/tokenserver"
)

// lintKnownProblems are promlint findings on names this package does not
// own, waiting for a rename in tokenclient; any other finding fails.
func lintKnownProblems() []string {
	return []string{"rgproxy_group_ru_per_sec: metric names should not contain abbreviated units"}
}

// lintTokenServer runs a real rgserver (embedded etcd, gRPC on loopback)
// in the test process and returns its address.
func lintTokenServer(t *testing.T, ctx context.Context) string {
	t.Helper()
	e, err := tokenserver.StartEmbeddedEtcd(ctx, tokenserver.EmbedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := tokenserver.New(cli, tokenserver.Config{AdvertiseAddr: lis.Addr().String(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	rctx, rcancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { _ = srv.Run(rctx); close(ran) }()
	// Cleanups run last-in first-out: stop Run and gRPC before etcd.
	t.Cleanup(func() { rcancel(); <-ran; gs.Stop() })
	return lis.Addr().String()
}

// TestMetricsLint lints rgproxy's registry (its own collectors, the wire
// counters and the token client's) after each family has samples: a
// statement counted and charged, tokens granted, one statement refused.
func TestMetricsLint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	addr := lintTokenServer(t, ctx)
	quiet := slog.New(slog.DiscardHandler)

	m := newMetrics()
	srv, err := mysqlproto.NewServer(mysqlproto.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	m.registerServer(srv)
	reader, err := binlog.New(binlog.Config{Addr: "127.0.0.1:3306", User: "lint", Logger: quiet}) // not started
	if err != nil {
		t.Fatal(err)
	}
	m.registerBinlog(reader)
	tc, err := tokenclient.New(tokenclient.Config{Servers: []string{addr}, Logger: quiet, Registerer: m.reg})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if err := tc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for _, g := range []resourcegroup.Group{{Name: "lint", RUPerSec: 1000}, {Name: "lint_tiny", RUPerSec: 1}} {
		if err := tc.Store().CreateGroup(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	cost := ru.Consumption{RRU: 1, Statements: 1}
	if _, _, err := tc.AcquireShare(ctx, nil, "lint", cost, cost.RU(), time.Second); err != nil {
		t.Fatal(err)
	}
	// 100 RU at 1 RU/s cannot be had within 10 ms: refused at once.
	if _, _, err := tc.AcquireShare(ctx, nil, "lint_tiny", ru.Consumption{RRU: 100, Statements: 1}, 100, 10*time.Millisecond); !errors.Is(err, tokenclient.ErrThrottled) {
		t.Fatalf("AcquireShare of 100 RU at 1 RU/s: %v, want ErrThrottled", err)
	}
	// The policy as run() builds it, registered on the same registry.
	rp, err := rgpolicy.New(rgpolicy.Config{Tokens: tc, Registerer: m.reg, CPU: rgpolicy.CPUWall, Logger: quiet, Binlog: reader,
		Settings: rgpolicy.Settings{MaxWait: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	st := &mysqlproto.Statement{Command: mysql.COM_QUERY, Query: "SELECT /*+ RESOURCE_GROUP(lint) */ 1"}
	if err := mysqlproto.ScanStatement(st, rgpolicy.ScanWords()); err != nil {
		t.Fatal(err)
	}
	s := m.wrap(rp).Open(mysqlproto.SessionInfo{ID: 1, User: "lint"})
	if v := s.Before(ctx, st, nil); v.Reply != nil {
		t.Fatalf("statement answered: %+v", v.Reply.Err)
	}
	s.After(st, &mysqlproto.Outcome{BackendTime: time.Millisecond})

	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	for _, want := range []string{
		"rgproxy_statements_total", "rgproxy_statement_duration_seconds", "rgproxy_ru_consumed_total",
		"rgproxy_group_statements_total", "rgproxy_connections", "rgproxy_client_bytes_total",
		"rgproxy_backend_bytes_total", "rgproxy_backend_errors_total", "rgproxy_token_requests_total",
		"rgproxy_token_request_duration_seconds", "rgproxy_throttled_total", "rgproxy_throttle_wait_seconds",
		"rgproxy_group_tokens", "rgproxy_group_ru_per_sec", "rgproxy_degraded", "rgproxy_cpu_source",
		"rgproxy_connections_refused_total", "rgproxy_protocol_errors_total", "rgproxy_unauthenticated_connections",
		"rgproxy_max_connections", "rgproxy_command_buffer_bytes",
		"rgproxy_write_source", "rgproxy_written_bytes_total", "rgproxy_binlog_lag_seconds",
		"go_goroutines", "process_cpu_seconds_total",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("%s not gathered; have %s", want, strings.Join(names, " "))
		}
	}
	problems, err := testutil.GatherAndLint(m.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if !slices.Contains(lintKnownProblems(), p.Metric+": "+p.Text) {
			t.Errorf("%s: %s", p.Metric, p.Text)
		} else {
			t.Logf("known, to be renamed in tokenclient: %s: %s", p.Metric, p.Text)
		}
	}
}
