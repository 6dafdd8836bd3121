package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rgproxy/rgproxy/tokenserver"
)

func get(t *testing.T, url string) (int, health, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var h health
	if strings.HasSuffix(url, "z") {
		if err := json.Unmarshal(b, &h); err != nil {
			t.Fatalf("%s: %q is not JSON: %v", url, b, err)
		}
	}
	return resp.StatusCode, h, string(b)
}

func TestStatusEndpoints(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
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
	reg := prometheus.NewRegistry()
	srv, err := tokenserver.New(cli, tokenserver.Config{AdvertiseAddr: "127.0.0.1:1", Logger: slog.New(slog.DiscardHandler), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	mux, err := statusMux(srv, cli, reg, &consoleSource{srv: srv, name: "r1", advertise: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(mux)
	defer hs.Close()

	// Before Run: healthy (etcd answers) but not ready (no settings, no leader).
	if code, h, _ := get(t, hs.URL+"/healthz"); code != 200 || h.Health != "true" {
		t.Fatalf("/healthz = %d %+v", code, h)
	}
	if code, h, _ := get(t, hs.URL+"/readyz"); code != 503 || h.Health != "false" || h.Reason == "" {
		t.Fatalf("/readyz before leading = %d %+v", code, h)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Run(rctx) }()
	deadline := time.Now().Add(15 * time.Second)
	for !srv.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("never became leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, h, _ := get(t, hs.URL+"/readyz"); code != 200 || h.Health != "true" || h.Leader != "127.0.0.1:1" {
		t.Fatalf("/readyz as leader = %d %+v", code, h)
	}
	// The console: its page at /, its JSON at /api/console, nothing else.
	if code, _, body := get(t, hs.URL+"/"); code != 200 || !strings.Contains(body, "rgserver console") {
		t.Fatalf("GET / = %d", code)
	}
	code, _, body := get(t, hs.URL+"/api/console")
	var c serverConsole
	if err := json.Unmarshal([]byte(body), &c); err != nil || code != 200 {
		t.Fatalf("/api/console = %d %q: %v", code, body, err)
	}
	if c.Kind != "rgserver" || !c.Leader || c.LeaderAddr != "127.0.0.1:1" || c.Name != "r1" || c.GroupsTotal != 1 ||
		len(c.Groups) != 1 || c.Groups[0].Name != "default" || c.Groups[0].RUPerSec != nil || c.Groups[0].Limited || c.Etcd != "" {
		t.Fatalf("/api/console: %+v", c)
	}
	for path, want := range map[string]int{"/api/console?groups=10001": 400, "/nope": 404, "/api/console/": 404} {
		if code, _, _ := get(t, hs.URL+path); code != want {
			t.Errorf("GET %s = %d, want %d", path, code, want)
		}
	}
	if code, _, body := get(t, hs.URL+"/metrics"); code != 200 || !strings.Contains(body, "rgserver_is_leader 1") ||
		!strings.Contains(body, `rgserver_group_ru_per_sec{resource_group="default"} +Inf`) {
		t.Fatalf("/metrics = %d\n%s", code, body)
	}
	// etcd refuses writes (its NOSPACE alarm, raised by hand here): still
	// ready, and /readyz says why.
	st, err := cli.Status(ctx, e.Endpoints[0])
	if err != nil {
		t.Fatal(err)
	}
	alarm := &etcdserverpb.AlarmRequest{Action: etcdserverpb.AlarmRequest_ACTIVATE, MemberID: st.Header.MemberId, Alarm: etcdserverpb.AlarmType_NOSPACE}
	if _, err := etcdserverpb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, alarm); err != nil {
		t.Fatal(err)
	}
	for srv.EtcdProblem() == "" {
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatal("the NOSPACE alarm was never noticed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, h, _ := get(t, hs.URL+"/readyz"); code != 200 || h.Health != "true" || !strings.Contains(h.Etcd, "NOSPACE") {
		t.Fatalf("/readyz under NOSPACE = %d %+v", code, h)
	}
	if _, _, body := get(t, hs.URL+"/metrics"); !strings.Contains(body, `rgserver_etcd_degraded{reason="nospace"} 1`) {
		t.Fatalf("/metrics under NOSPACE:\n%s", body)
	}
	if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{}); err != nil {
		t.Fatal(err)
	}
	rcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// etcd unreachable (here: the client closed, which fails the same way
	// without waiting for etcd's graceful stop): /healthz says so.
	cli.Close()
	if code, h, _ := get(t, hs.URL+"/healthz"); code != 503 || h.Health != "false" || !strings.Contains(h.Reason, "etcd") {
		t.Fatalf("/healthz without etcd = %d %+v", code, h)
	}
}
