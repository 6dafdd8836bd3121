package tokenserver

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenclient"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// scrape reads the server's real /metrics (MetricsHandler over HTTP, as
// Prometheus does) and returns every series by name{labels}, labels
// sorted as the text format prints them.
func scrape(t *testing.T, ts *testServer) map[string]float64 {
	t.Helper()
	hs := httptest.NewServer(ts.srv.MetricsHandler(ts.reg))
	defer hs.Close()
	resp, err := http.Get(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			out[seriesName(name, m)] = metricValue(m)
		}
	}
	return out
}

func seriesName(name string, m *dto.Metric) string {
	if len(m.GetLabel()) == 0 {
		return name
	}
	var ls []string
	for _, l := range m.GetLabel() {
		ls = append(ls, l.GetName()+`="`+l.GetValue()+`"`)
	}
	slices.Sort(ls)
	return name + "{" + strings.Join(ls, ",") + "}"
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

// scrapeValue reads one series from /metrics; the test fails without it.
func scrapeValue(t *testing.T, ts *testServer, series string) float64 {
	t.Helper()
	v, ok := scrape(t, ts)[series]
	if !ok {
		t.Fatalf("series %s not in /metrics", series)
	}
	return v
}

// groupSeries lists a group's series as /metrics shows them, with values.
func groupSeries(t *testing.T, ts *testServer, group string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for k, v := range scrape(t, ts) {
		if strings.Contains(k, `resource_group="`+group+`"`) {
			out[k] = v
		}
	}
	return out
}

// perGroupSeries are the series every limited group has from its creation.
func perGroupSeries(g string) []string {
	l := `resource_group="` + g + `"`
	return []string{
		`rgserver_ru_consumed_total{` + l + `,type="rru"}`, `rgserver_ru_consumed_total{` + l + `,type="wru"}`,
		`rgserver_read_bytes_total{` + l + `}`, `rgserver_write_bytes_total{` + l + `}`,
		`rgserver_backend_seconds_total{` + l + `}`, `rgserver_statements_total{` + l + `}`,
		`rgserver_throttled_total{` + l + `}`, `rgserver_tokens_granted_total{` + l + `}`, `rgserver_group_ru_per_sec{` + l + `}`,
		`rgserver_group_tokens{` + l + `}`, `rgserver_group_clients{` + l + `}`,
	}
}

// A group's series exist at 0 from its creation, on the leader and on a
// follower, carry its counts, and disappear when it is dropped; groups
// that exist when a server starts have theirs at once.
func TestGroupSeriesFromCreationToDrop(t *testing.T) {
	cli := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Created before any server runs: loaded at start.
	if err := NewEtcdStore(cli).CreateGroup(ctx, resourcegroup.Group{Name: "early", RUPerSec: 50}); err != nil {
		t.Fatal(err)
	}
	a := startServer(t, cli, "")
	waitFor(t, "a leads", a.srv.IsLeader)
	b := startServer(t, cli, "")
	waitFor(t, "b knows the leader", func() bool { return b.srv.LeaderAddr() == a.addr })
	rg := pb.NewResourceGroupServiceClient(a.conn)
	if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "fresh", RuPerSec: 100}}); err != nil {
		t.Fatal(err)
	}
	for _, ts := range []*testServer{a, b} {
		for _, g := range []string{"early", "fresh"} {
			waitFor(t, g+"'s series", func() bool { return len(groupSeries(t, ts, g)) == len(perGroupSeries(g)) })
			got := groupSeries(t, ts, g)
			for _, name := range perGroupSeries(g) {
				v, ok := got[name]
				want := 0.0
				switch {
				case strings.HasPrefix(name, "rgserver_group_ru_per_sec"), strings.HasPrefix(name, "rgserver_group_tokens"):
					want = map[string]float64{"early": 50, "fresh": 100}[g] // a full bucket holds 1 s of RU_PER_SEC
				}
				if !ok || v != want {
					t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
				}
			}
		}
	}
	// The unlimited `default` has every series but the bucket's level.
	d := groupSeries(t, a, "default")
	if _, ok := d[`rgserver_group_tokens{resource_group="default"}`]; ok || len(d) != len(perGroupSeries("default"))-1 {
		t.Errorf("default's series: %v", d)
	}

	s, err := pb.NewTokenServiceClient(a.conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	acquire(t, s, &pb.TokenRequest{ProxyId: "p", Groups: []*pb.GroupTokenRequest{{Group: "fresh", TokensWanted: 30,
		Consumption: &pb.Consumption{Rru: 1.5, Wru: 2, ReadBytes: 10, WriteBytes: 20, BackendSeconds: 0.25, Statements: 3, Throttled: 2}}}})
	want := map[string]float64{
		`rgserver_ru_consumed_total{resource_group="fresh",type="rru"}`: 1.5,
		`rgserver_ru_consumed_total{resource_group="fresh",type="wru"}`: 2,
		`rgserver_read_bytes_total{resource_group="fresh"}`:             10,
		`rgserver_write_bytes_total{resource_group="fresh"}`:            20,
		`rgserver_backend_seconds_total{resource_group="fresh"}`:        0.25,
		`rgserver_statements_total{resource_group="fresh"}`:             3,
		`rgserver_throttled_total{resource_group="fresh"}`:              2,
		`rgserver_tokens_granted_total{resource_group="fresh"}`:         30,
		`rgserver_group_tokens{resource_group="fresh"}`:                 70,
		`rgserver_group_clients{resource_group="fresh"}`:                1,
	}
	got := groupSeries(t, a, "fresh")
	for k, v := range want {
		if got[k] != v {
			t.Errorf("after a grant: %s = %v, want %v", k, got[k], v)
		}
	}

	if _, err := rg.DropGroup(ctx, &pb.DropGroupRequest{Name: "fresh"}); err != nil {
		t.Fatal(err)
	}
	for _, ts := range []*testServer{a, b} {
		waitFor(t, "fresh's series to go", func() bool { return len(groupSeries(t, ts, "fresh")) == 0 })
		if n := len(groupSeries(t, ts, "early")); n != len(perGroupSeries("early")) {
			t.Errorf("early has %d series after fresh was dropped", n)
		}
	}
}

// The text served is what client_golang's own tooling expects: testutil
// compares a family through the real endpoint.
func TestMetricsHandlerWithTestutil(t *testing.T) {
	ts := startServer(t, startEtcd(t), "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rg := pb.NewResourceGroupServiceClient(ts.conn)
	for i, n := range []string{"b", "a"} {
		if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: n, RuPerSec: uint64(10 * (i + 1))}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both groups", func() bool { return len(groupSeries(t, ts, "a")) > 0 && len(groupSeries(t, ts, "b")) > 0 })
	hs := httptest.NewServer(ts.srv.MetricsHandler(ts.reg))
	defer hs.Close()
	want := `# HELP rgserver_group_ru_per_sec The group's RU_PER_SEC as configured (also in MODE WARN/OFF and with BURSTABLE = UNLIMITED); +Inf when RU_PER_SEC = UNLIMITED.
# TYPE rgserver_group_ru_per_sec gauge
rgserver_group_ru_per_sec{resource_group="a"} 20
rgserver_group_ru_per_sec{resource_group="b"} 10
rgserver_group_ru_per_sec{resource_group="default"} +Inf
# HELP rgserver_is_leader 1 on the replica that leads, else 0.
# TYPE rgserver_is_leader gauge
rgserver_is_leader 1
`
	waitFor(t, "leadership", ts.srv.IsLeader)
	if err := testutil.ScrapeAndCompare(hs.URL, strings.NewReader(want), "rgserver_group_ru_per_sec", "rgserver_is_leader"); err != nil {
		t.Fatal(err)
	}
	// Gzip, as Prometheus asks for it.
	req, _ := http.NewRequest("GET", hs.URL, nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("Content-Encoding %q", resp.Header.Get("Content-Encoding"))
	}
}

// A scrape of many groups, read a chunk at a time under the grant lock,
// still shows every group once.
func TestMetricsManyGroups(t *testing.T) {
	ts := startServer(t, startEtcd(t), "")
	now := ts.clock.Now()
	const n = 20000
	ts.srv.mu.Lock()
	for i := range n {
		ts.srv.alloc.SetGroup(fmt.Sprintf("g%05d", i), Settings{RUPerSec: 10}, now)
	}
	ts.srv.mu.Unlock()
	got := scrape(t, ts)
	c := 0
	for k := range got {
		if strings.HasPrefix(k, "rgserver_group_clients{") {
			c++
		}
	}
	if c != n+1 { // and default
		t.Fatalf("%d groups in /metrics, want %d", c, n+1)
	}
}

// A snapshot bigger than gRPC's 4 MiB per message reaches a proxy in parts
// of at most ~1 MiB, and the proxy assembles the whole of it. (A watcher
// that does not ask for parts gets one message: TestWatchSnapshotAndResume.)
func TestWatchSnapshotInParts(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := NewEtcdStore(cli)
	for i := range 50 {
		if err := st.CreateGroup(ctx, resourcegroup.Group{Name: fmt.Sprintf("g%02d", i), RUPerSec: 10}); err != nil {
			t.Fatal(err)
		}
	}
	// Runaway watches on long statements make it big: 5 × 900 KiB.
	for i := range 5 {
		text := fmt.Sprintf("SELECT %d, '%s'", i, strings.Repeat("x", 900<<10))
		if _, err := st.AddWatch(ctx, resourcegroup.Watch{Group: "g00", Match: resourcegroup.WatchExact, Text: text}); err != nil {
			t.Fatal(err)
		}
	}
	w, err := pb.NewResourceGroupServiceClient(ts.conn).Watch(ctx, &pb.WatchRequest{SnapshotInParts: true})
	if err != nil {
		t.Fatal(err)
	}
	var parts []*pb.WatchResponse
	for {
		r, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if !r.Snapshot || (len(parts) > 0 && r.Revision != parts[0].Revision) {
			t.Fatalf("part %d: %v", len(parts), r)
		}
		parts = append(parts, r)
		if proto.Size(r) > snapshotPartBytes+(1<<20) {
			t.Fatalf("part %d is %d bytes", len(parts), proto.Size(r))
		}
		if !r.More {
			break
		}
	}
	events := 0
	for _, p := range parts {
		events += len(p.Events)
	}
	if len(parts) < 5 || events != 51+5 {
		t.Fatalf("%d parts with %d events, want ≥ 5 parts with 56 events", len(parts), events)
	}
	// A proxy (tokenclient, with gRPC's default 4 MiB limit) gets it all.
	c := startProxy(t, ctx, ts)
	if gs, err := c.Store().ListGroups(ctx); err != nil || len(gs) != 51 || len(c.Watches()) != 5 {
		t.Fatalf("the proxy's cache: %d groups (%v), %d watches", len(gs), err, len(c.Watches()))
	}
}

// startProxy starts a real proxy-side client (tokenclient) against ts.
func startProxy(t *testing.T, ctx context.Context, ts *testServer) *tokenclient.Client {
	t.Helper()
	c, err := tokenclient.New(tokenclient.Config{Servers: []string{ts.addr}, ProxyID: "px", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// What a scrape keeps for the next (scrapeCache) never shows a group that
// is gone or hides one that came, within a term or across terms, and a
// scrape that finds it in use by another still serves every group.
func TestScrapeCacheFollowsGroups(t *testing.T) {
	now := time.Now()
	s := &Server{cfg: Config{Now: func() time.Time { return now }}, alloc: NewAllocator(AllocConfig{})}
	groups := func(c *scrapeCache) []string {
		t.Helper()
		var b strings.Builder
		bw := bufio.NewWriter(&b)
		if err := writeGroupMetrics(bw, s.groupRows(c)); err != nil {
			t.Fatal(err)
		}
		if err := bw.Flush(); err != nil {
			t.Fatal(err)
		}
		p := expfmt.NewTextParser(model.LegacyValidation)
		mfs, err := p.TextToMetricFamilies(strings.NewReader(b.String()))
		if err != nil {
			t.Fatalf("does not parse: %v", err)
		}
		var out []string
		for _, m := range mfs["rgserver_group_clients"].GetMetric() {
			out = append(out, m.GetLabel()[0].GetValue())
		}
		return out
	}
	set := func(names ...string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, n := range names {
			s.alloc.SetGroup(n, Settings{RUPerSec: 10}, now)
		}
	}
	c := &s.scrapes
	steps := []struct {
		what   string
		change func()
		want   []string
	}{
		{"first", func() { set("b", "a", `q"uote`) }, []string{"a", "b", `q"uote`}},
		{"unchanged", func() {}, []string{"a", "b", `q"uote`}},
		{"one added", func() { set("c") }, []string{"a", "b", "c", `q"uote`}},
		{"one dropped", func() { s.mu.Lock(); s.alloc.RemoveGroup("b"); s.mu.Unlock() }, []string{"a", "c", `q"uote`}},
		// (Two added: without Succeed, the new allocator's generation
		// would be the one the names were listed at.)
		{"a new term, then two added", func() {
			s.mu.Lock()
			s.alloc = s.freshAllocator(now)
			s.mu.Unlock()
			set("d", "e")
		}, []string{"a", "c", "d", "e", `q"uote`}},
	}
	for _, st := range steps {
		st.change()
		if got := groups(c); !slices.Equal(got, st.want) {
			t.Errorf("%s: groups %q, want %q", st.what, got, st.want)
		}
		// A second scraper while the first holds the cache makes its own.
		if got := groups(&scrapeCache{}); !slices.Equal(got, st.want) {
			t.Errorf("%s, own cache: groups %q, want %q", st.what, got, st.want)
		}
	}
}

// rgserver_resource_group_parent_info has a series for each group with a
// PARENT, naming it, and none for a group without one; PARENT = NULL
// removes the series at the next scrape.
func TestMetricsParentInfo(t *testing.T) {
	ts := startServer(t, startEtcd(t), "")
	now := ts.clock.Now()
	ts.srv.mu.Lock()
	ts.srv.alloc.SetGroup("team", Settings{RUPerSec: 100}, now)
	ts.srv.alloc.SetGroup("etl", Settings{RUPerSec: 50, Parent: "team"}, now)
	ts.srv.alloc.SetGroup("odd", Settings{RUPerSec: 50, Parent: `we"ird`}, now)
	ts.srv.alloc.SetGroup("alone", Settings{RUPerSec: 10}, now)
	ts.srv.mu.Unlock()
	info := func() map[string]float64 {
		out := map[string]float64{}
		for k, v := range scrape(t, ts) {
			if strings.HasPrefix(k, "rgserver_resource_group_parent_info{") {
				out[k] = v
			}
		}
		return out
	}
	want := map[string]float64{
		`rgserver_resource_group_parent_info{parent="team",resource_group="etl"}`:   1,
		`rgserver_resource_group_parent_info{parent="we"ird",resource_group="odd"}`: 1,
	}
	if got := info(); !maps.Equal(got, want) {
		t.Fatalf("parent series %v, want %v", got, want)
	}
	ts.srv.mu.Lock()
	ts.srv.alloc.SetGroup("etl", Settings{RUPerSec: 50}, now)
	ts.srv.mu.Unlock()
	delete(want, `rgserver_resource_group_parent_info{parent="team",resource_group="etl"}`)
	if got := info(); !maps.Equal(got, want) {
		t.Fatalf("after PARENT = NULL: parent series %v, want %v", got, want)
	}
}
