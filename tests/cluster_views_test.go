package tests

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// queryStrings runs q and returns every row as strings ("NULL" for NULL).
func queryStrings(t testing.TB, db interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, q string) ([][]string, error) {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	var out [][]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		row := make([]string, len(cols))
		for i, v := range vals {
			row[i] = "NULL"
			if v.Valid {
				row[i] = v.String
			}
		}
		out = append(out, row)
	}
	return out, rows.Err()
}

// timedQuery runs q, failing the test on error, and returns its rows and
// how long the answer took.
func timedQuery(t testing.TB, db *sql.DB, q string) ([][]string, time.Duration) {
	t.Helper()
	start := time.Now()
	rows, err := queryStrings(t, db, q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return rows, time.Since(start)
}

// TestClusterViews: three proxies on one rgserver. Statements run through
// each proxy show in information_schema.cluster_statements_summary under
// the proxy's INSTANCE with its own counts; the cluster usage per
// instance is each proxy's own SHOW RESOURCE GROUP USAGE, so its sums are
// the cluster's; a user without SUPER sees only its groups' rows; every
// answer comes within a second; a stalled proxy is named with a NULL row
// after the deadline instead of holding the view, a killed one drops out;
// with rgserver gone the view is a readable MySQL error.
func TestClusterViews(t *testing.T) {
	ts := startTokenServer(t)
	var pxs []*proxy
	for range 3 {
		pxs = append(pxs, startMeteredProxy(t, ts, "--max-wait", "10ms"))
	}
	adminExec(t, pxs[0].Addr,
		"CREATE RESOURCE GROUP cv_a RU_PER_SEC = 100000",
		"CREATE RESOURCE GROUP cv_tiny RU_PER_SEC = 1",
		"CREATE RESOURCE GROUP cv_other RU_PER_SEC = 100000")
	appUser(t, "cv_app")
	adminExec(t, pxs[0].Addr, "ALTER USER 'cv_app'@'%' RESOURCE GROUP cv_a")
	settingsReach(t, pxs[0], pxs[1:]...) // else cv_app's probes there land in default

	// Every proxy must have its inspect stream open before the counts
	// below can be compared: wait until the view names all three.
	root := openDB(t, pxs[1].Addr)
	deadline := time.Now().Add(15 * time.Second)
	for {
		rows, err := queryStrings(t, root, "SELECT DISTINCT INSTANCE FROM information_schema.cluster_resource_group_usage")
		if err == nil && len(rows) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster view does not name the 3 proxies: %v, %v", rows, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The same shape through each proxy, a different number of times, in
	// cv_a (the app user's group); root's own shape in default and in
	// cv_other through the first proxy.
	counts := []int{3, 5, 7}
	for i, px := range pxs {
		app := openDB(t, px.Addr, "user=cv_app", "password=apppw")
		for range counts[i] {
			if _, err := app.Exec("SELECT 1 AS cv_probe"); err != nil {
				t.Fatal(err)
			}
		}
	}
	adminExec(t, pxs[0].Addr, "SELECT 2 AS cv_root_probe", "SELECT /*+ RESOURCE_GROUP(cv_other) */ 3 AS cv_other_probe")

	const probeQ = "SELECT INSTANCE, RESOURCE_GROUP, EXEC_COUNT FROM information_schema.cluster_statements_summary " +
		"WHERE DIGEST_TEXT LIKE '%cv\\_probe%' ORDER BY INSTANCE"
	rows, took := timedQuery(t, root, probeQ)
	t.Logf("cluster_statements_summary through %s: %d rows in %v", pxs[1].Addr, len(rows), took)
	if took > time.Second {
		t.Errorf("cluster_statements_summary took %v, more than a second", took)
	}
	want := map[string]string{}
	for i, px := range pxs {
		want[px.Addr] = strconv.Itoa(counts[i])
	}
	if len(rows) != 3 {
		t.Fatalf("cluster_statements_summary rows for cv_probe: %v, want one per proxy", rows)
	}
	for _, r := range rows {
		if r[1] != "cv_a" || want[r[0]] != r[2] {
			t.Errorf("row %v: want INSTANCE with its count (%v) in cv_a", r, want)
		}
	}
	rows, _ = timedQuery(t, root, "SELECT INSTANCE, RESOURCE_GROUP FROM information_schema.cluster_statements_summary "+
		"WHERE DIGEST_TEXT LIKE '%cv\\_root\\_probe%' OR DIGEST_TEXT LIKE '%cv\\_other\\_probe%' ORDER BY RESOURCE_GROUP")
	if fmt.Sprint(rows) != fmt.Sprintf("[[%s cv_other] [%s default]]", pxs[0].Addr, pxs[0].Addr) {
		t.Errorf("root's shapes: %v, want them on %s in cv_other and default", rows, pxs[0].Addr)
	}

	// A user without SUPER: only its groups' rows, whatever the query.
	app := openDB(t, pxs[2].Addr, "user=cv_app", "password=apppw")
	rows, took = timedQuery(t, app, probeQ)
	if len(rows) != 3 || took > time.Second {
		t.Errorf("cv_app's cv_probe rows: %v in %v, want 3 within a second", rows, took)
	}
	for _, q := range []string{
		"SELECT COUNT(*) FROM information_schema.cluster_statements_summary WHERE RESOURCE_GROUP IS NULL OR RESOURCE_GROUP <> 'cv_a'",
		"SELECT COUNT(*) FROM information_schema.cluster_resource_group_usage WHERE NAME IS NULL OR NAME <> 'cv_a'",
		"SELECT COUNT(*) FROM (SELECT DIGEST_TEXT FROM information_schema.cluster_statements_summary) s WHERE DIGEST_TEXT LIKE '%probe%' AND DIGEST_TEXT NOT LIKE '%cv\\_probe%'",
	} {
		if rows, _ := timedQuery(t, app, q); fmt.Sprint(rows) != "[[0]]" {
			t.Errorf("cv_app: %s = %v, want 0: another group's rows leak", q, rows)
		}
	}
	if rows, _ := timedQuery(t, app, "SELECT COUNT(*) FROM information_schema.cluster_resource_group_usage WHERE NAME = 'cv_a'"); fmt.Sprint(rows) != "[[3]]" {
		t.Errorf("cv_app sees cv_a's usage on %v proxies, want 3", rows)
	}

	// Throttle cv_tiny on every proxy, then compare each proxy's own
	// usage with its row in the cluster view, and their sums.
	var localSum int
	local := map[string]string{}
	for _, px := range pxs {
		db := openDB(t, px.Addr)
		refused := 0
		for i := 0; i < 500 && refused < 2+len(local); i++ {
			if _, err := db.Exec("SELECT /*+ RESOURCE_GROUP(cv_tiny) */ 1"); mysqlErrNo(err) == 8252 {
				refused++
			} else if err != nil {
				t.Fatal(err)
			}
		}
		rows, err := queryStrings(t, db, "SHOW RESOURCE GROUP USAGE LIKE 'cv_tiny'")
		if err != nil || len(rows) != 1 {
			t.Fatalf("local usage on %s: %v, %v", px.Addr, rows, err)
		}
		local[px.Addr] = rows[0][3]
		n, _ := strconv.Atoi(rows[0][3])
		if n == 0 {
			t.Fatalf("cv_tiny was not throttled on %s: %v", px.Addr, rows)
		}
		localSum += n
	}
	rows, took = timedQuery(t, root, "SELECT INSTANCE, THROTTLED FROM information_schema.cluster_resource_group_usage WHERE NAME = 'cv_tiny' ORDER BY INSTANCE")
	if len(rows) != 3 || took > time.Second {
		t.Fatalf("cluster usage of cv_tiny: %v in %v", rows, took)
	}
	for _, r := range rows {
		if local[r[0]] != r[1] {
			t.Errorf("cluster usage %v, but %s's own SHOW RESOURCE GROUP USAGE says THROTTLED %s", r, r[0], local[r[0]])
		}
	}
	rows, _ = timedQuery(t, root, "SELECT SUM(THROTTLED) FROM information_schema.cluster_resource_group_usage WHERE NAME = 'cv_tiny'")
	if rows[0][0] != strconv.Itoa(localSum) {
		t.Errorf("SUM(THROTTLED) = %v, the proxies' own figures sum to %d", rows, localSum)
	}
	t.Logf("cv_tiny throttled per proxy %v, sum %d", local, localSum)
	// SHOW CLUSTER RESOURCE GROUP USAGE: answered by the proxy itself, and
	// with a filter through the backend.
	rows, _ = timedQuery(t, root, "SHOW CLUSTER RESOURCE GROUP USAGE")
	seen := map[string]bool{}
	for _, r := range rows {
		if len(r) != 7 {
			t.Fatalf("SHOW CLUSTER RESOURCE GROUP USAGE row %v: want INSTANCE and the 6 columns of USAGE", r)
		}
		if r[1] == "cv_tiny" {
			seen[r[0]] = true
			if local[r[0]] != r[4] {
				t.Errorf("SHOW CLUSTER row %v, local THROTTLED %s", r, local[r[0]])
			}
		}
	}
	if len(seen) != 3 {
		t.Errorf("SHOW CLUSTER RESOURCE GROUP USAGE names cv_tiny on %v, want the 3 proxies", seen)
	}
	rows, _ = timedQuery(t, root, "SHOW CLUSTER RESOURCE GROUP USAGE LIKE 'cv\\_tiny'")
	if len(rows) != 3 {
		t.Errorf("SHOW CLUSTER RESOURCE GROUP USAGE LIKE: %v", rows)
	}
	rows, _ = timedQuery(t, root, "SHOW CLUSTER RESOURCE GROUP USAGE WHERE THROTTLED > 0 AND NAME = 'cv_tiny'")
	if len(rows) != 3 {
		t.Errorf("SHOW CLUSTER RESOURCE GROUP USAGE WHERE: %v", rows)
	}

	// A stalled proxy: named after the deadline, with NULLs, not waited for.
	stalled := pxs[2]
	stalled.pause(t)
	rows, took = timedQuery(t, root, "SELECT INSTANCE, EXEC_COUNT FROM information_schema.cluster_statements_summary "+
		"WHERE DIGEST_TEXT LIKE '%cv\\_probe%' OR RESOURCE_GROUP IS NULL ORDER BY INSTANCE")
	t.Logf("with %s stopped: %v in %v", stalled.Addr, rows, took)
	if took > time.Second {
		t.Errorf("a stalled proxy held the view %v", took)
	}
	got := map[string]string{}
	for _, r := range rows {
		got[r[0]] = r[1]
	}
	if got[pxs[0].Addr] != "3" || got[pxs[1].Addr] != "5" || got[stalled.Addr] != "NULL" || len(got) != 3 {
		t.Errorf("with %s stopped: %v, want the others' counts and a NULL row for it", stalled.Addr, rows)
	}
	stalled.resume()
	// Back: it answers again (its late reply to the stalled view is dropped).
	deadline = time.Now().Add(10 * time.Second)
	for {
		rows, _ = timedQuery(t, root, probeQ)
		if len(rows) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the continued proxy does not answer again: %v", rows)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A killed proxy drops out of the view; nobody waits for it.
	killed := pxs[1]
	if err := killed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-killed.done
	r0 := openDB(t, pxs[0].Addr)
	deadline = time.Now().Add(10 * time.Second)
	for {
		rows, took = timedQuery(t, r0, "SELECT DISTINCT INSTANCE FROM information_schema.cluster_resource_group_usage ORDER BY INSTANCE")
		if len(rows) == 2 && rows[0][0] != killed.Addr && rows[1][0] != killed.Addr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after killing %s the view says %v", killed.Addr, rows)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if took >= 450*time.Millisecond { // waiting for it would take rgserver's 500 ms
		t.Errorf("without the killed proxy the view took %v: was it waited for?", took)
	}

	// rgserver gone: a readable error, not gRPC's text.
	ts.stop(10 * time.Second)
	db := r0
	for _, q := range []string{"SELECT * FROM information_schema.cluster_statements_summary", "SHOW CLUSTER RESOURCE GROUP USAGE"} {
		start := time.Now()
		_, err := queryStrings(t, db, q)
		t.Logf("%s without rgserver: %v (%v)", q, err, time.Since(start))
		if mysqlErrNo(err) != 1105 || !strings.Contains(err.Error(), "rgserver") || strings.Contains(err.Error(), "rpc error") ||
			strings.Contains(err.Error(), "desc =") {
			t.Errorf("%s without rgserver: %v, want a readable 1105", q, err)
		}
		if time.Since(start) > 2*time.Second {
			t.Errorf("%s without rgserver took %v", q, time.Since(start))
		}
	}
	if _, err := db.Exec("SELECT 1"); err != nil {
		t.Errorf("the session after the error: %v", err)
	}
}

// TestInspectStreamsBoundToCredentials: the Inspect stream speaks only for
// a proxy id its credential streams tokens under, and a credential holds
// at most max-streams + 1 of them, so a proxy credential cannot add made-up
// instances to the cluster views; without a credential neither RPC is
// served. The honest rgproxy, with the same credential, stays the one
// instance the view names.
func TestInspectStreamsBoundToCredentials(t *testing.T) {
	s := startAuthedServer(t, "honest honest-token-0123456789 1")
	px := s.honestProxy(t, "honest")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := dialRaw(t, s.Addr)
	insp := pb.NewInspectServiceClient(conn)
	honest := as(ctx, s.proxyTokens["honest"])

	// The honest proxy shows in the view, asked with its own credential.
	var view *pb.ClusterInspectResponse
	deadline := time.Now().Add(15 * time.Second)
	for {
		var err error
		view, err = insp.ClusterInspect(honest, &pb.ClusterInspectRequest{Kind: pb.InspectKind_INSPECT_KIND_USAGE, AllGroups: true})
		if err == nil && len(view.GetInstances()) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the honest proxy is not in the view: %v, %v", view, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := view.GetInstances()[0].GetInstance(); got != px.Addr {
		t.Fatalf("INSTANCE %q, want %q", got, px.Addr)
	}

	// Made-up proxy ids under the same credential: refused, whatever the
	// instance they claim; and no more than max-streams + 1 streams.
	var held []pb.InspectService_InspectClient
	refusedIDs, refusedStreams := 0, 0
	for i := range 6 {
		st, err := insp.Inspect(honest)
		if err != nil {
			t.Fatal(err)
		}
		hello := &pb.InspectReply{Hello: &pb.InspectHello{ProxyId: fmt.Sprintf("fake-%d", i), Instance: fmt.Sprintf("10.6.6.6:%d", 4000+i)}}
		if err := st.Send(hello); err != nil {
			t.Fatal(err)
		}
		recvd := make(chan error, 1)
		go func() { _, err := st.Recv(); recvd <- err }()
		select {
		case err := <-recvd:
			switch status.Code(err) {
			case codes.FailedPrecondition:
				refusedIDs++
			case codes.ResourceExhausted:
				refusedStreams++
			default:
				t.Fatalf("fake id %d: %v", i, err)
			}
		case <-time.After(2 * time.Second):
			held = append(held, st) // accepted: the leader sends nothing until asked
		}
	}
	// Streams that say nothing count too: with the honest proxy's, the
	// credential holds max-streams + 1 = 2.
	silent := 0
	for range 4 {
		st, err := insp.Inspect(honest)
		if err != nil {
			t.Fatal(err)
		}
		recvd := make(chan error, 1)
		go func() { _, err := st.Recv(); recvd <- err }()
		select {
		case err := <-recvd:
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("a silent stream: %v", err)
			}
			refusedStreams++
		case <-time.After(time.Second):
			silent++
		}
	}
	if silent != 1 {
		t.Errorf("%d silent inspect streams held open beside the honest proxy's, want 1 (max-streams + 1 in all)", silent)
	}
	view, err := insp.ClusterInspect(honest, &pb.ClusterInspectRequest{Kind: pb.InspectKind_INSPECT_KIND_USAGE, AllGroups: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("6 fake ids: %d refused as ids, %d as streams, %d accepted; the view names %d instances, %d unanswered",
		refusedIDs, refusedStreams, len(held), len(view.GetInstances()), len(view.GetUnanswered()))
	if len(held) != 0 || len(view.GetInstances()) != 1 || len(view.GetUnanswered()) != 0 {
		t.Errorf("fake inspect streams: %d accepted; view %v: want none accepted and the honest proxy alone", len(held), view)
	}

	// Without a credential, or with a wrong one: nothing.
	for _, c := range []context.Context{ctx, as(ctx, "not-a-token")} {
		if _, err := insp.ClusterInspect(c, &pb.ClusterInspectRequest{Kind: pb.InspectKind_INSPECT_KIND_USAGE, AllGroups: true}); status.Code(err) != codes.Unauthenticated {
			t.Errorf("ClusterInspect without a credential: %v", err)
		}
		st, err := insp.Inspect(c)
		if err == nil {
			_ = st.Send(&pb.InspectReply{Hello: &pb.InspectHello{ProxyId: "x", Instance: "x:1"}})
			_, err = st.Recv()
		}
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("Inspect without a credential: %v", err)
		}
	}
	// The honest proxy still answers.
	rows, _ := timedQuery(t, openDB(t, px.Addr), "SELECT DISTINCT INSTANCE FROM information_schema.cluster_resource_group_usage")
	if fmt.Sprint(rows) != fmt.Sprintf("[[%s]]", px.Addr) {
		t.Errorf("the view through the honest proxy: %v", rows)
	}
}

// BenchmarkClusterViews: rgserver and 10 rgproxies, each having run 1,000
// statement shapes; one op is one cluster view read through one proxy
// with the mariadb protocol (the whole way: the fan-out through rgserver,
// the rewrite, the backend's evaluation of the rows). Reports the slowest
// op, rgserver's part of an op (rgserver_cluster_inspect_duration_seconds),
// the bytes the asking proxy exchanged with the backend per op (the
// rewritten statement, mostly) and the rows; "stalled" stops one proxy first (SIGSTOP), so each op
// waits out rgserver's deadline. `make bench-cluster-views`.
func BenchmarkClusterViews(b *testing.B) {
	const proxies, shapes = 10, 1000
	ts := startTokenServer(b)
	var pxs []*proxy
	for range proxies {
		pxs = append(pxs, startMeteredProxy(b, ts))
	}
	errs := make(chan error, proxies)
	for i, px := range pxs {
		go func() {
			db, err := sql.Open("mysql", dsn(px.Addr))
			if err != nil {
				errs <- err
				return
			}
			defer db.Close()
			for j := range shapes {
				if _, err := db.Exec(fmt.Sprintf("SELECT %d AS shape_%d_%d", j, i, j)); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range pxs {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	db := openDB(b, pxs[0].Addr)
	deadline := time.Now().Add(20 * time.Second)
	for {
		rows, err := queryStrings(b, db, "SELECT COUNT(DISTINCT INSTANCE) FROM information_schema.cluster_resource_group_usage")
		if err == nil && fmt.Sprint(rows) == fmt.Sprintf("[[%d]]", proxies) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the view does not name the %d proxies: %v, %v", proxies, rows, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	run := func(b *testing.B, q string) {
		var worst time.Duration
		var got string
		fanout := func() (float64, float64) {
			return metricSum(b, ts.StatusAddr, "rgserver_cluster_inspect_duration_seconds_sum"),
				metricSum(b, ts.StatusAddr, "rgserver_cluster_inspect_duration_seconds_count")
		}
		sum0, n0 := fanout()
		bytes0 := metricSum(b, pxs[0].StatusAddr, "rgproxy_backend_bytes_total")
		for b.Loop() {
			start := time.Now()
			rows, err := queryStrings(b, db, q)
			if err != nil {
				b.Fatal(err)
			}
			worst = max(worst, time.Since(start))
			got = fmt.Sprint(rows)
		}
		sum1, n1 := fanout()
		b.ReportMetric((metricSum(b, pxs[0].StatusAddr, "rgproxy_backend_bytes_total")-bytes0)/float64(b.N), "backend-B/op")
		b.ReportMetric(float64(worst.Microseconds())/1000, "max-ms")
		b.ReportMetric((sum1-sum0)/max(n1-n0, 1)*1000, "rgserver-ms/op")
		b.Logf("%s: %s, slowest %v", q, got, worst)
	}
	const summary = "SELECT COUNT(*), COUNT(DISTINCT INSTANCE), SUM(EXEC_COUNT) FROM information_schema.cluster_statements_summary"
	b.Run("statements_summary", func(b *testing.B) { run(b, summary) })
	b.Run("usage", func(b *testing.B) {
		run(b, "SELECT COUNT(*), COUNT(DISTINCT INSTANCE) FROM information_schema.cluster_resource_group_usage")
	})
	b.Run("stalled", func(b *testing.B) {
		stalled := pxs[proxies-1]
		stalled.pause(b)
		defer stalled.resume()
		run(b, summary)
	})
}
