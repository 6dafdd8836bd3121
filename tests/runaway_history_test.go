package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// historyQ reads a group's rows of the runaway history.
const historyQ = "SELECT INSTANCE, REPEATS, MATCH_TYPE, ACTION, RULE, ACCOUNT, SAMPLE_SQL, START_TIME, SQL_DIGEST " +
	"FROM information_schema.runaway_queries WHERE RESOURCE_GROUP_NAME = 'rg_hist' ORDER BY INSTANCE"

// TestRunawayHistory: runaways on two proxies show in
// information_schema.runaway_queries through either, one row per
// instance with their repeats collapsed; a user of another group sees
// none; the rows survive a restart of rgserver, and a new repeat joins
// its row.
func TestRunawayHistory(t *testing.T) {
	dir := t.TempDir()
	addr, statusAddr := freeAddr(t), freeAddr(t)
	ts := &tokenServer{Addr: addr, StatusAddr: statusAddr}
	start := func() {
		ts.process = startProcess(t, "rgserver", "--addr", addr, "--status-addr", statusAddr, "--data-dir", dir)
		waitReady(t, "http://"+statusAddr+"/readyz", ts.process)
	}
	start()
	a, b := startMeteredProxy(t, ts), startMeteredProxy(t, ts)
	adminExec(t, a.Addr, "CREATE RESOURCE GROUP rg_hist RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '100ms', ACTION = DRYRUN)")
	appUser(t, "hist_app")
	appUser(t, "hist_other")
	adminExec(t, a.Addr, "ALTER USER 'hist_app'@'%' RESOURCE GROUP rg_hist")
	settingsReach(t, a, b) // b's SET RESOURCE GROUP below needs the group

	app := openDB(t, a.Addr, "user=hist_app", "password=apppw")
	app.SetMaxOpenConns(1)
	for range 2 {
		if _, err := app.Exec("SELECT SLEEP(0.3) AS hist_probe"); err != nil {
			t.Fatal(err)
		}
	}
	root := openDB(t, b.Addr)
	root.SetMaxOpenConns(1)
	if _, err := root.Exec("SET RESOURCE GROUP rg_hist"); err != nil {
		t.Fatal(err)
	}
	// The guard fires 100 ms into the statement: the event leaves then.
	fired := time.Now().Add(100 * time.Millisecond)
	if _, err := root.Exec("SELECT SLEEP(0.3) AS hist_probe"); err != nil {
		t.Fatal(err)
	}
	ran := time.Now()

	// Both instances' rows through proxy a, within seconds.
	reader := openDB(t, a.Addr)
	var rows [][]string
	for {
		var err error
		rows, err = queryStrings(t, reader, historyQ)
		if err == nil && len(rows) == 2 {
			break
		}
		if time.Since(ran) > 10*time.Second {
			t.Fatalf("runaway_queries after 10 s: %v, %v", rows, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("runaway history rows visible %v after the last runaway fired (%v after its statement ended): %q",
		time.Since(fired), time.Since(ran), rows)
	want := map[string]string{a.Addr: "2", b.Addr: "1"}
	for _, r := range rows {
		if want[r[0]] != r[1] || r[2] != "IDENTIFY" || r[3] != "DRYRUN" || r[4] != `EXEC_ELAPSED='100ms'` || len(r[8]) != 16 {
			t.Errorf("row %q: want INSTANCE with REPEATS %v, IDENTIFY, DRYRUN, the rule and a digest", r, want)
		}
		switch r[0] {
		case a.Addr:
			if r[5] != "hist_app@%" || !strings.Contains(r[6], "SLEEP(0.3)") {
				t.Errorf("proxy a's row: account %q, sample %q", r[5], r[6])
			}
		case b.Addr:
			if !strings.HasPrefix(r[5], "root@") {
				t.Errorf("proxy b's row: account %q", r[5])
			}
		}
	}
	if rows[0][8] != rows[1][8] {
		t.Errorf("one statement, two digests: %q", rows)
	}

	// hist_app sees its group's rows, root's statement only as its digest
	// text; hist_other, in default, sees none.
	own, err := queryStrings(t, openDB(t, b.Addr, "user=hist_app", "password=apppw"), historyQ)
	if err != nil || len(own) != 2 {
		t.Fatalf("hist_app's rows: %q, %v", own, err)
	}
	for _, r := range own {
		if r[0] == b.Addr && strings.Contains(r[6], "0.3") {
			t.Errorf("hist_app sees root's literals: %q", r[6])
		}
	}
	other := openDB(t, a.Addr, "user=hist_other", "password=apppw")
	for _, q := range []string{historyQ, "SELECT COUNT(*) FROM information_schema.runaway_queries"} {
		got, err := queryStrings(t, other, q)
		if err != nil {
			t.Fatalf("%s as hist_other: %v", q, err)
		}
		if len(got) != 0 && !(len(got) == 1 && len(got[0]) == 1 && got[0][0] == "0") {
			t.Errorf("%s as hist_other: %q, want nothing", q, got)
		}
	}

	// rgserver restarts: the rows come back from etcd.
	before := fmt.Sprint(rows)
	if err := ts.stop(10 * time.Second); err != nil {
		t.Logf("rgserver stop: %v", err)
	}
	if _, err := reader.Exec("SELECT * FROM information_schema.runaway_queries"); err == nil ||
		mysqlErrNo(err) != 1105 || !strings.Contains(err.Error(), "rgserver") {
		t.Errorf("runaway_queries without rgserver: %v, want a readable 1105", err)
	}
	restarted := time.Now()
	start()
	for {
		got, err := queryStrings(t, reader, historyQ)
		if err == nil && fmt.Sprint(got) == before {
			break
		}
		if time.Since(restarted) > 20*time.Second {
			t.Fatalf("after rgserver's restart: %q, %v; want %s", got, err, before)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("runaway history back %v after rgserver was started again", time.Since(restarted))

	// A new repeat joins proxy a's row (same START_TIME, REPEATS 3).
	byInstance := func(rows [][]string) map[string][]string {
		m := map[string][]string{}
		for _, r := range rows {
			m[r[0]] = r
		}
		return m
	}
	startA := byInstance(rows)[a.Addr][7]
	fired = time.Now().Add(100 * time.Millisecond)
	if _, err := app.Exec("SELECT SLEEP(0.3) AS hist_probe"); err != nil {
		t.Fatal(err)
	}
	ran = time.Now()
	for {
		got, err := queryStrings(t, reader, historyQ)
		m := byInstance(got)
		if err == nil && len(got) == 2 && m[a.Addr][1] == "3" {
			if m[a.Addr][7] != startA || m[b.Addr][1] != "1" {
				t.Errorf("after the restart: %q, want proxy a's row from %s with REPEATS 3", got, startA)
			}
			break
		}
		if time.Since(ran) > 20*time.Second {
			t.Fatalf("the repeat after the restart: %q, %v", got, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("a repeat after the restart joined its row %v after it fired", time.Since(fired))
}

// TestRunawayHistoryBounded: a flood of 10,500 runaway events of one
// group with different digests leaves the group's newest 10,000 rows;
// the proxy counts them within seconds.
func TestRunawayHistoryBounded(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts)
	cl := pb.NewRunawayServiceClient(dialRaw(t, ts.Addr))
	// Events are kept only for groups that exist.
	if _, err := pb.NewResourceGroupServiceClient(dialRaw(t, ts.Addr)).CreateGroup(context.Background(),
		&pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "rg_flood", RuPerSec: 100}}); err != nil {
		t.Fatal(err)
	}
	const n = 10_500
	now := time.Now().UnixMilli()
	for i := 0; i < n; i += 1000 {
		req := &pb.RecordRunawaysRequest{Instance: "flood:1"}
		for j := i; j < min(i+1000, n); j++ {
			req.Events = append(req.Events, &pb.RunawayEvent{ResourceGroup: "rg_flood", TimeUnixMs: now,
				SqlDigest: fmt.Sprintf("%016x", j), SampleSql: fmt.Sprintf("SELECT %d", j), MatchType: "IDENTIFY",
				Action: "DRYRUN", Rule: `EXEC_ELAPSED='1s'`, Account: "flood@%"})
		}
		resp, err := cl.RecordRunaways(context.Background(), req)
		if err != nil || int(resp.GetAccepted()) != len(req.Events) {
			t.Fatalf("RecordRunaways: %v, %v", resp, err)
		}
	}
	db := openDB(t, px.Addr)
	q := "SELECT COUNT(*), MIN(SQL_DIGEST), MAX(SQL_DIGEST) FROM information_schema.runaway_queries WHERE RESOURCE_GROUP_NAME = 'rg_flood'"
	rows, took := timedQuery(t, db, q)
	t.Logf("%s: %q in %v", q, rows, took)
	if fmt.Sprint(rows) != fmt.Sprintf("[[10000 %016x %016x]]", 500, n-1) {
		t.Errorf("after %d events: %q, want the newest 10000", n, rows)
	}
	if v := metricSum(t, ts.StatusAddr, "rgserver_runaway_history_rows"); v != 10000 {
		t.Errorf("rgserver_runaway_history_rows = %v, want 10000", v)
	}
	if v := metricSum(t, ts.StatusAddr, "rgserver_runaway_history_dropped_total", `reason="group_limit"`); v != 500 {
		t.Errorf("rgserver_runaway_history_dropped_total{reason=group_limit} = %v, want 500", v)
	}
	if took > 5*time.Second {
		t.Errorf("COUNT(*) over 10,000 rows took %v", took)
	}
}

// TestRunawayHistoryAuthenticated: with credentials configured, the
// history's RPCs refuse a missing or wrong token and take a proxy's;
// malformed requests are refused whole.
func TestRunawayHistoryAuthenticated(t *testing.T) {
	s := startAuthedServer(t, "px pr0xy-token-runaway-0123 2")
	s.createGroup(t, "rg_auth", 100) // events are kept only for groups that exist
	cl := pb.NewRunawayServiceClient(dialRaw(t, s.Addr))
	ev := &pb.RunawayEvent{ResourceGroup: "rg_auth", SqlDigest: "00000000000000aa", MatchType: "WATCH", Action: "KILL"}
	rec := &pb.RecordRunawaysRequest{Instance: "auth:1", Events: []*pb.RunawayEvent{ev}}
	bg := context.Background()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want codes.Code
	}{
		{"no token", bg, codes.Unauthenticated},
		{"wrong token", as(bg, "nope-nope-nope-nope"), codes.Unauthenticated},
		{"proxy token", as(bg, "pr0xy-token-runaway-0123"), codes.OK},
	} {
		_, err := cl.RecordRunaways(tc.ctx, rec)
		if status.Code(err) != tc.want {
			t.Errorf("RecordRunaways with %s: %v, want %v", tc.name, err, tc.want)
		}
		resp, err := cl.ListRunaways(tc.ctx, &pb.ListRunawaysRequest{AllGroups: true})
		if status.Code(err) != tc.want {
			t.Errorf("ListRunaways with %s: %v, want %v", tc.name, err, tc.want)
		}
		if tc.want == codes.OK && (len(resp.GetRows()) != 1 || resp.GetRows()[0].GetInstance() != "auth:1") {
			t.Errorf("ListRunaways with the proxy token: %v", resp)
		}
	}
	px := as(bg, "pr0xy-token-runaway-0123")
	many := &pb.RecordRunawaysRequest{Instance: "auth:1"}
	for range 1001 {
		many.Events = append(many.Events, ev)
	}
	for name, req := range map[string]*pb.RecordRunawaysRequest{
		"no instance":   {Events: []*pb.RunawayEvent{ev}},
		"long instance": {Instance: strings.Repeat("x", 257), Events: []*pb.RunawayEvent{ev}},
		"1001 events":   many,
	} {
		if _, err := cl.RecordRunaways(px, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("RecordRunaways with %s: %v, want InvalidArgument", name, err)
		}
	}
	resp, err := cl.RecordRunaways(px, &pb.RecordRunawaysRequest{Instance: "auth:1", Events: []*pb.RunawayEvent{
		{ResourceGroup: "rg_auth", SqlDigest: "not hex", MatchType: "WATCH", Action: "KILL"},
		{ResourceGroup: "", SqlDigest: "00", MatchType: "WATCH", Action: "KILL"},
		{ResourceGroup: "rg_auth", SqlDigest: "00", MatchType: "OTHER", Action: "KILL"},
	}})
	if err != nil || resp.GetAccepted() != 0 {
		t.Errorf("malformed events: %v, %v; want none accepted", resp, err)
	}
	groups := make([]string, 1001)
	for i := range groups {
		groups[i] = fmt.Sprintf("g%d", i)
	}
	if _, err := cl.ListRunaways(px, &pb.ListRunawaysRequest{Groups: groups}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ListRunaways with 1001 groups: %v", err)
	}
}

// TestRunawayOneNameOneRow: the proxy that adds a watch is its SOURCE in
// runaway_watches under the same name as its INSTANCE in runaway_queries
// (its MySQL address); ACCOUNT is user@host, also for a user bound to no
// group; and a statement that matches a watch and then crosses its
// group's limit makes one history row, not one per rule.
func TestRunawayOneNameOneRow(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--cpu-source", "wall")
	adminExec(t, px.Addr, "DROP RESOURCE GROUP IF EXISTS rg_onerow",
		"CREATE RESOURCE GROUP rg_onerow RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '100ms', ACTION = DRYRUN, WATCH = EXACT DURATION = '10m')")
	root := openDB(t, px.Addr)
	root.SetMaxOpenConns(1)
	const q = "SELECT /*+ RESOURCE_GROUP(rg_onerow) */ SLEEP(0.3) AS onerow_probe"
	if _, err := root.Exec(q); err != nil {
		t.Fatal(err)
	}
	const watchesQ = "SELECT SOURCE, WATCH FROM information_schema.runaway_watches WHERE RESOURCE_GROUP_NAME = 'rg_onerow'"
	var watches [][]string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if watches, err = queryStrings(t, root, watchesQ); err == nil && len(watches) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runaway_watches after 10 s: %q, %v", watches, err)
		}
	}
	if watches[0][0] != px.Addr || watches[0][1] != "EXACT" {
		t.Errorf("runaway_watches row %q: want SOURCE %s (the proxy's INSTANCE), EXACT", watches[0], px.Addr)
	}
	// The second run matches the watch first (a WATCH event), then
	// crosses the limit: still one event.
	if _, err := root.Exec(q); err != nil {
		t.Fatal(err)
	}
	const rowsQ = "SELECT INSTANCE, MATCH_TYPE, REPEATS, ACCOUNT FROM information_schema.runaway_queries " +
		"WHERE RESOURCE_GROUP_NAME = 'rg_onerow' ORDER BY MATCH_TYPE"
	want := [][]string{{px.Addr, "IDENTIFY", "1"}, {px.Addr, "WATCH", "1"}}
	var rows [][]string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		rows, err = queryStrings(t, root, rowsQ)
		if err == nil && len(rows) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runaway_queries after 10 s: %q, %v", rows, err)
		}
	}
	// A late second event would land in a row already there: give it
	// the history's batching time before reading the rows for good.
	time.Sleep(500 * time.Millisecond)
	rows, err := queryStrings(t, root, rowsQ)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("runaway_queries: %q, want %q", rows, want)
	}
	for i, r := range rows {
		if r[0] != want[i][0] || r[1] != want[i][1] || r[2] != want[i][2] || !strings.HasPrefix(r[3], "root@") {
			t.Errorf("runaway_queries row %q, want %q and ACCOUNT root@host", r, want[i])
		}
	}
}
