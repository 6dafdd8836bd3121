package tests

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"math"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// tokenServer is a running rgserver with an embedded etcd.
type tokenServer struct {
	*process
	Addr, StatusAddr string
}

func startTokenServer(t testing.TB, extra ...string) *tokenServer {
	t.Helper()
	s := &tokenServer{Addr: freeAddr(t), StatusAddr: freeAddr(t)}
	args := append([]string{"--addr", s.Addr, "--status-addr", s.StatusAddr, "--data-dir", t.TempDir()}, extra...)
	s.process = startProcess(t, "rgserver", args...)
	waitReady(t, "http://"+s.StatusAddr+"/readyz", s.process)
	return s
}

func waitReady(t testing.TB, url string, p *process) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			t.Fatalf("process exited: %v\n%s", p.err, p.log.String())
		default:
		}
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s not ready after 20s\n%s", url, p.log.String())
}

// startMeteredProxy runs rgproxy metering against rgserver ts.
func startMeteredProxy(t testing.TB, ts *tokenServer, extra ...string) *proxy {
	t.Helper()
	return startProxy(t, append([]string{"--token-server", ts.Addr, "--log-level", "warn"}, extra...)...)
}

// metricSum adds up every sample of a metric whose labels contain all of
// the given `key="value"` pairs.
func metricSum(t testing.TB, statusAddr, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + statusAddr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", statusAddr, err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// serverRU is the RU rgserver has recorded for a group.
func serverRU(t testing.TB, ts *tokenServer, group string) float64 {
	return metricSum(t, ts.StatusAddr, "rgserver_ru_consumed_total", `resource_group="`+group+`"`)
}

// appUser creates a backend user without SUPER for the metering tests.
func appUser(t testing.TB, user string) {
	rootExec(t,
		fmt.Sprintf("CREATE USER IF NOT EXISTS '%s'@'%%' IDENTIFIED BY 'apppw'", user),
		fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP ON rgproxy_e2e.* TO '%s'@'%%'", user))
}

// adminExec runs statements through a proxy as root, failing on error.
func adminExec(t testing.TB, addr string, stmts ...string) {
	t.Helper()
	db := openDB(t, addr)
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// loadResult counts what a closed-loop load did.
type loadResult struct {
	statements, errors atomic.Int64
	firstErr           atomic.Value
}

// runLoad runs clients[i] closed-loop sessions against proxies[i], each
// running query until the deadline, and waits for them.
func runLoad(t testing.TB, proxies []*proxy, clients []int, user, query string, d time.Duration) *loadResult {
	t.Helper()
	res := &loadResult{}
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for i, px := range proxies {
		db := openDB(t, px.Addr, "user="+user, "password=apppw")
		db.SetMaxOpenConns(clients[i])
		for c := 0; c < clients[i]; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn, err := db.Conn(context.Background())
				if err != nil {
					res.errors.Add(1)
					res.firstErr.CompareAndSwap(nil, err.Error())
					return
				}
				defer conn.Close()
				for time.Now().Before(deadline) {
					if _, err := conn.ExecContext(context.Background(), query); err != nil {
						res.errors.Add(1)
						res.firstErr.CompareAndSwap(nil, err.Error())
						continue
					}
					res.statements.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	return res
}

func within(got, want, tol float64) bool { return math.Abs(got-want) <= tol*want }

// TestThrottlingHoldsAcrossThreeProxies: one group saturated through three
// proxies is held to RU_PER_SEC, and its rate is shared by clients.
func TestThrottlingHoldsAcrossThreeProxies(t *testing.T) {
	ts := startTokenServer(t)
	pxs := []*proxy{startMeteredProxy(t, ts), startMeteredProxy(t, ts), startMeteredProxy(t, ts)}
	appUser(t, "rgsat")
	const rate = 200.0
	for _, tc := range []struct {
		name    string
		clients []int
	}{
		{"even", []int{6, 6, 6}},
		{"uneven", []int{12, 4, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A fresh group per run: its bucket starts full and no proxy
			// holds tokens of it yet.
			group := "rg_sat_" + tc.name
			adminExec(t, pxs[0].Addr,
				"DROP RESOURCE GROUP IF EXISTS "+group,
				fmt.Sprintf("CREATE RESOURCE GROUP %s RU_PER_SEC = %d", group, int(rate)),
				"ALTER USER 'rgsat'@'%' RESOURCE GROUP "+group)
			settingsReach(t, pxs[0], pxs[1:]...) // the binding reaches every proxy's settings cache
			const d = 20 * time.Second
			before := serverRU(t, ts, group)
			var proxyBefore []float64
			for _, px := range pxs {
				proxyBefore = append(proxyBefore, metricSum(t, px.StatusAddr, "rgproxy_ru_consumed_total", `resource_group="`+group+`"`))
			}
			res := runLoad(t, pxs, tc.clients, "rgsat", "SELECT 1", d)
			if n := res.errors.Load(); n != 0 {
				t.Fatalf("%d statement errors, first: %v", n, res.firstErr.Load())
			}
			time.Sleep(6 * time.Second) // one report period (5 s) and some
			got := serverRU(t, ts, group) - before
			// The bucket starts full: capacity (1 s of RU_PER_SEC, BURSTABLE
			// OFF) plus the fill over the run.
			want := rate*d.Seconds() + rate
			t.Logf("%s: %d statements, %.1f RU reported to rgserver, limit × T + capacity = %.0f (%.1f%%)",
				tc.name, res.statements.Load(), got, want, 100*(got-want)/want)
			if !within(got, want, 0.05) {
				t.Errorf("consumption %.1f RU not within ±5%% of %.0f", got, want)
			}
			var total float64
			shares := make([]float64, len(pxs))
			for i, px := range pxs {
				shares[i] = metricSum(t, px.StatusAddr, "rgproxy_ru_consumed_total", `resource_group="`+group+`"`) - proxyBefore[i]
				total += shares[i]
			}
			clients := 0
			for _, c := range tc.clients {
				clients += c
			}
			for i := range pxs {
				share, clientShare := shares[i]/total, float64(tc.clients[i])/float64(clients)
				t.Logf("%s: proxy %d: %.1f%% of the RU for %.1f%% of the clients", tc.name, i, 100*share, 100*clientShare)
				if !within(share, clientShare, 0.20) {
					t.Errorf("proxy %d consumed %.1f%% of the RU, its clients are %.1f%% (±20%%)", i, 100*share, 100*clientShare)
				}
			}
		})
	}
}

// TestThrottledTransactionNeverWaitsLong: inside a transaction a statement
// waits at most --max-wait-in-txn, COMMIT never waits, and the group's
// rate still holds.
func TestThrottledTransactionNeverWaitsLong(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--max-wait-in-txn", "100ms")
	appUser(t, "rgtxn")
	// Statements inside a transaction run on debt after 100 ms; BEGIN
	// (outside one) waits until the debt is paid. So at the end of the run
	// at most one transaction per client (≈ 20 RU each here) is owed: with
	// 4 clients and 200 RU/s that is under 2% of R × T.
	const rate = 200.0
	adminExec(t, px.Addr,
		"DROP RESOURCE GROUP IF EXISTS rg_txn",
		fmt.Sprintf("CREATE RESOURCE GROUP rg_txn RU_PER_SEC = %d", int(rate)),
		"ALTER USER 'rgtxn'@'%' RESOURCE GROUP rg_txn")
	rootExec(t, "DROP TABLE IF EXISTS rgproxy_e2e.txn_t", "CREATE TABLE rgproxy_e2e.txn_t (id INT PRIMARY KEY AUTO_INCREMENT, v INT)")
	time.Sleep(time.Second)

	const d = 20 * time.Second
	before := serverRU(t, ts, "rg_txn")
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	var maxInTxn, maxCommit atomic.Int64
	var txns, errs atomic.Int64
	db := openDB(t, px.Addr, "user=rgtxn", "password=apppw", "db=rgproxy_e2e")
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			conn, err := db.Conn(ctx)
			if err != nil {
				errs.Add(1)
				return
			}
			defer conn.Close()
			timed := func(q string, max *atomic.Int64) {
				start := time.Now()
				if _, err := conn.ExecContext(ctx, q); err != nil {
					errs.Add(1)
					t.Errorf("%s: %v", q, err)
				}
				if el := time.Since(start).Microseconds(); el > max.Load() {
					max.Store(el)
				}
			}
			for time.Now().Before(deadline) {
				if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
					errs.Add(1)
					continue
				}
				for i := 0; i < 5; i++ {
					timed("INSERT INTO txn_t (v) VALUES (1)", &maxInTxn)
				}
				timed("COMMIT", &maxCommit)
				txns.Add(1)
			}
		}()
	}
	wg.Wait()
	time.Sleep(6 * time.Second)
	got := serverRU(t, ts, "rg_txn") - before
	want := rate*d.Seconds() + rate
	t.Logf("%d transactions; slowest statement in a transaction %v, slowest COMMIT %v; %.1f RU vs %.0f (%.1f%%)",
		txns.Load(), time.Duration(maxInTxn.Load())*time.Microsecond, time.Duration(maxCommit.Load())*time.Microsecond,
		got, want, 100*(got-want)/want)
	if errs.Load() != 0 {
		t.Fatalf("%d errors", errs.Load())
	}
	// 100 ms of waiting plus the statement itself on a loaded 2-core machine.
	if time.Duration(maxInTxn.Load())*time.Microsecond > 400*time.Millisecond {
		t.Errorf("a statement inside a transaction took %v (max-wait-in-txn 100ms)", time.Duration(maxInTxn.Load())*time.Microsecond)
	}
	if time.Duration(maxCommit.Load())*time.Microsecond > 300*time.Millisecond {
		t.Errorf("a COMMIT took %v; COMMIT must never wait", time.Duration(maxCommit.Load())*time.Microsecond)
	}
	if !within(got, want, 0.05) {
		t.Errorf("consumption %.1f RU not within ±5%% of %.0f", got, want)
	}
}

// mariadbCLI runs the mariadb client against a proxy and returns its output.
func mariadbCLI(t testing.TB, addr, user, pass, script string) (string, error) {
	t.Helper()
	host, port, _ := strings.Cut(addr, ":")
	args := []string{"-h" + host, "-P" + port, "-u" + user, "--comments", "--batch", "-e", script}
	if pass != "" {
		args = append(args, "-p"+pass)
	}
	out, err := exec.Command("mariadb", args...).CombinedOutput()
	return string(out), err
}

// TestAdminStatementsThroughProxies drives every admin statement and its
// errors through the mariadb CLI and go-sql-driver, across two proxies.
func TestAdminStatementsThroughProxies(t *testing.T) {
	ts := startTokenServer(t)
	a, b := startMeteredProxy(t, ts), startMeteredProxy(t, ts)
	appUser(t, "rgadm")
	root := openDB(t, a.Addr)
	mustErr := func(db *sql.DB, code uint16, q string) {
		t.Helper()
		_, err := db.Exec(q)
		if mysqlErrNo(err) != code {
			t.Fatalf("%s: want error %d, got %v", q, code, err)
		}
	}
	root.Exec("DROP RESOURCE GROUP IF EXISTS rg_a")
	root.Exec("DROP RESOURCE GROUP IF EXISTS rg_b")
	start := time.Now()
	if _, err := root.Exec("CREATE RESOURCE GROUP rg_a RU_PER_SEC = 500 PRIORITY = HIGH BURSTABLE"); err != nil {
		t.Fatal(err)
	}
	// Propagation: proxy b sees it within 1 s.
	other := openDB(t, b.Addr)
	var seen time.Duration
	for {
		var name string
		err := other.QueryRow("SELECT NAME FROM information_schema.resource_groups WHERE NAME = 'rg_a'").Scan(&name)
		if err == nil && name == "rg_a" {
			seen = time.Since(start)
			break
		}
		if time.Since(start) > time.Second {
			t.Fatalf("proxy b does not see rg_a after 1 s (%v)", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("a group created through proxy a was visible through proxy b after %v", seen)

	mustErr(root, 8248, "CREATE RESOURCE GROUP rg_a RU_PER_SEC = 1")
	mustErr(root, 8249, "ALTER RESOURCE GROUP rg_nope RU_PER_SEC = 1")
	mustErr(root, 8249, "DROP RESOURCE GROUP rg_nope")
	mustErr(root, 1064, "CREATE RESOURCE GROUP rg_x RU_PER_SEC = = 1")
	mustErr(root, 1105, "DROP RESOURCE GROUP `default`")
	mustErr(root, 1105, "CREATE RESOURCE GROUP rg_x RU_PER_SEC = 0")
	if _, err := root.Exec("ALTER RESOURCE GROUP rg_a RU_PER_SEC = 800"); err != nil {
		t.Fatal(err)
	}
	var name, ddl string
	if err := other.QueryRow("SHOW CREATE RESOURCE GROUP rg_a").Scan(&name, &ddl); err != nil {
		t.Fatal(err)
	}
	// ALTER is incremental, and a change through a reaches b.
	for deadline := time.Now().Add(time.Second); !strings.Contains(ddl, "RU_PER_SEC=800") && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		other.QueryRow("SHOW CREATE RESOURCE GROUP rg_a").Scan(&name, &ddl)
	}
	if want := "CREATE RESOURCE GROUP `rg_a` RU_PER_SEC=800 PRIORITY=HIGH BURSTABLE=MODERATED"; ddl != want {
		t.Fatalf("SHOW CREATE through b:\n got %s\nwant %s", ddl, want)
	}

	// A user without SUPER cannot manage groups...
	app := openDB(t, a.Addr, "user=rgadm", "password=apppw")
	mustErr(app, 1227, "CREATE RESOURCE GROUP rg_b RU_PER_SEC = 10")
	mustErr(app, 1227, "ALTER RESOURCE GROUP rg_a RU_PER_SEC = 10")
	mustErr(app, 1227, "DROP RESOURCE GROUP rg_a")
	mustErr(app, 1227, "ALTER USER 'rgadm'@'%' RESOURCE GROUP rg_a")
	// ...nor, in strict mode, pick a group it is not bound to.
	mustErr(app, 1227, "SET RESOURCE GROUP rg_a")
	mustErr(app, 1227, "SELECT /*+ RESOURCE_GROUP(rg_a) */ 1")
	if _, err := root.Exec("ALTER USER 'rgadm'@'%' RESOURCE GROUP rg_a"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	app2 := openDB(t, b.Addr, "user=rgadm", "password=apppw")
	app2.SetMaxOpenConns(1)
	var cur string
	for deadline := time.Now().Add(time.Second); cur != "rg_a" && time.Now().Before(deadline); {
		app2.QueryRow("SELECT CURRENT_RESOURCE_GROUP()").Scan(&cur)
	}
	if cur != "rg_a" {
		t.Fatalf("bound user's group through proxy b: %q", cur)
	}
	// Strict mode: a bound user without SUPER may not leave for default.
	mustErr(app2, 1227, "SET RESOURCE GROUP `default`")
	mustErr(app2, 8249, "SET RESOURCE GROUP rg_nope")

	// SHOW LAST STATEMENT RU reports the previous statement.
	conn, _ := root.Conn(context.Background())
	defer conn.Close()
	conn.ExecContext(context.Background(), "SELECT REPEAT('x', 100000)")
	last := lastStatementRU(t, conn)
	grp, errCode := last["RESOURCE_GROUP"], last["ERROR"]
	rru, wru, rb := num(t, last["RRU"]), num(t, last["WRU"]), num(t, last["READ_BYTES"])
	if grp != "default" || rru < 0.625+100000.0/65536 || wru != 0 || rb < 100000 || errCode != "" {
		t.Fatalf("SHOW LAST STATEMENT RU: %s rru=%v wru=%v read=%v", grp, rru, wru, rb)
	}

	// Admin statements cannot be prepared or sent inside a multi-statement.
	if _, err := root.Prepare("SELECT * FROM information_schema.resource_groups"); mysqlErrNo(err) != 1295 {
		t.Fatalf("prepared admin statement: %v", err)
	}
	multi := openDB(t, a.Addr, "multiStatements=true")
	mustErr(multi, 1295, "SELECT 1; CREATE RESOURCE GROUP rg_m RU_PER_SEC = 1")
	// Any query shape on the virtual tables: the backend evaluates it.
	var groups int
	if err := root.QueryRow("SELECT COUNT(*) FROM information_schema.resource_groups WHERE NAME = 'default'").Scan(&groups); err != nil || groups != 1 {
		t.Fatalf("COUNT(*) on information_schema.resource_groups: %d, %v", groups, err)
	}

	// The same through the mariadb CLI: 8252 when a throttled statement
	// cannot get its tokens in time.
	out, err := mariadbCLI(t, a.Addr, "root", "", "CREATE RESOURCE GROUP rg_b RU_PER_SEC = 1; SHOW CREATE RESOURCE GROUP rg_b; SELECT NAME, RU_PER_SEC FROM information_schema.resource_groups WHERE NAME = 'rg_b'")
	if err != nil || !strings.Contains(out, "CREATE RESOURCE GROUP `rg_b` RU_PER_SEC=1 PRIORITY=MEDIUM") || !strings.Contains(out, "rg_b\t1") {
		t.Fatalf("CLI admin statements: %v\n%s", err, out)
	}
	// A 1 RU/s group: a 10 KiB INSERT costs 12 WRU before it runs, more
	// than --max-wait (2 s here) can cover: 8252 at once, and the row never
	// reaches the backend.
	rootExec(t, "DROP TABLE IF EXISTS rgproxy_e2e.thr", "CREATE TABLE rgproxy_e2e.thr (v TEXT)")
	c := startMeteredProxy(t, ts, "--max-wait", "2s")
	began := time.Now()
	out, err = mariadbCLI(t, c.Addr, "root", "", "SET RESOURCE GROUP rg_b; INSERT INTO rgproxy_e2e.thr VALUES ('"+strings.Repeat("x", 10240)+"')")
	if err == nil || !strings.Contains(out, "ERROR 8252") || time.Since(began) > time.Second {
		t.Fatalf("CLI throttled: want 8252 at once, got %v after %v\n%s", err, time.Since(began), out)
	}
	var rows int
	root.QueryRow("SELECT COUNT(*) FROM rgproxy_e2e.thr").Scan(&rows)
	if rows != 0 {
		t.Fatalf("a refused INSERT reached the backend")
	}
	out, err = mariadbCLI(t, a.Addr, "rgadm", "apppw", "CREATE RESOURCE GROUP rg_c RU_PER_SEC = 1")
	if err == nil || !strings.Contains(out, "ERROR 1227") {
		t.Fatalf("CLI without SUPER: want 1227, got %v\n%s", err, out)
	}
	out, err = mariadbCLI(t, a.Addr, "root", "", "CREATE RESOURCE GROUP rg_c RU_PER_SEC = x")
	if err == nil || !strings.Contains(out, "ERROR 1064") {
		t.Fatalf("CLI syntax error: want 1064, got %v\n%s", err, out)
	}
	out, err = mariadbCLI(t, a.Addr, "root", "", "DROP RESOURCE GROUP rg_a; DROP RESOURCE GROUP rg_b")
	if err != nil {
		t.Fatalf("CLI drop: %v\n%s", err, out)
	}
}

// TestServesThroughTokenServerOutage: with rgserver stopped for 20 s under
// load, no statement fails, consumption stays near the limit from local
// refills, and the proxy resyncs when rgserver returns.
func TestServesThroughTokenServerOutage(t *testing.T) {
	dataDir := t.TempDir()
	addr, status := freeAddr(t), freeAddr(t)
	args := []string{"--addr", addr, "--status-addr", status, "--data-dir", dataDir}
	ts := &tokenServer{Addr: addr, StatusAddr: status, process: startProcess(t, "rgserver", args...)}
	waitReady(t, "http://"+status+"/readyz", ts.process)
	cacheDir := t.TempDir()
	px := startMeteredProxy(t, ts, "--degraded-after", "2s", "--cache-dir", cacheDir)
	appUser(t, "rgdeg")
	const rate = 100.0
	adminExec(t, px.Addr,
		"DROP RESOURCE GROUP IF EXISTS rg_deg",
		fmt.Sprintf("CREATE RESOURCE GROUP rg_deg RU_PER_SEC = %d", int(rate)),
		"ALTER USER 'rgdeg'@'%' RESOURCE GROUP rg_deg")
	time.Sleep(time.Second)

	proxyRU := func() float64 {
		return metricSum(t, px.StatusAddr, "rgproxy_ru_consumed_total", `resource_group="rg_deg"`)
	}
	var res *loadResult
	done := make(chan struct{})
	go func() {
		res = runLoad(t, []*proxy{px}, []int{6}, "rgdeg", "SELECT 1", 30*time.Second)
		close(done)
	}()
	time.Sleep(5 * time.Second)
	ts.stop(10 * time.Second)
	outStart, ruStart := time.Now(), proxyRU()
	time.Sleep(20 * time.Second)
	outRU, outDur := proxyRU()-ruStart, time.Since(outStart)
	if d := metricSum(t, px.StatusAddr, "rgproxy_degraded"); d != 1 {
		t.Errorf("rgproxy_degraded = %v during the outage", d)
	}
	// A proxy started while rgserver is down serves from the snapshot the
	// first one keeps, in degraded mode, and says so.
	late := startMeteredProxy(t, ts, "--degraded-after", "2s", "--cache-dir", cacheDir)
	if code, body := httpGet(t, "http://"+late.StatusAddr+"/readyz"); code != 200 || !strings.Contains(body, `"degraded":"true"`) {
		t.Errorf("/readyz of a proxy started without rgserver: %d %s", code, body)
	}
	lateDB := openDB(t, late.Addr, "user=rgdeg", "password=apppw")
	var cur string
	if err := lateDB.QueryRow("SELECT CURRENT_RESOURCE_GROUP()").Scan(&cur); err != nil || cur != "rg_deg" {
		t.Errorf("a proxy started from the snapshot puts rgdeg in %q (%v), want rg_deg", cur, err)
	}
	if _, err := lateDB.Exec("SELECT 1"); err != nil {
		t.Errorf("statement through a proxy started without rgserver: %v", err)
	}
	ts.process = startProcess(t, "rgserver", args...)
	waitReady(t, "http://"+status+"/readyz", ts.process)
	// Resync: grants flow again, under load, and the proxy leaves degraded
	// mode within 5 s of rgserver's return.
	back := time.Now()
	for metricSum(t, px.StatusAddr, "rgproxy_degraded") != 0 {
		if time.Since(back) > 5*time.Second {
			t.Fatal("still degraded 5 s after rgserver returned")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("resynced %v after rgserver was ready again", time.Since(back).Round(10*time.Millisecond))
	<-done
	if n := res.errors.Load(); n != 0 {
		t.Fatalf("%d statement errors during the outage, first: %v", n, res.firstErr.Load())
	}
	want := rate * outDur.Seconds()
	t.Logf("outage of %v: %.1f RU consumed from local refills, limit × T = %.0f (%.1f%%)", outDur.Round(time.Millisecond), outRU, want, 100*(outRU-want)/want)
	if !within(outRU, want, 0.25) {
		t.Errorf("degraded consumption %.1f RU not within ±25%% of %.0f", outRU, want)
	}
	out, err := mariadbCLI(t, px.Addr, "root", "", "SHOW RESOURCE GROUP USAGE")
	if err != nil || !strings.Contains(out, "rg_deg") {
		t.Fatalf("SHOW RESOURCE GROUP USAGE: %v\n%s", err, out)
	}
}

// TestBackendConcurrencyAdmitsByPriority: with --max-backend-concurrency 1
// and the slot busy, a HIGH group's statement queued after a LOW one runs
// first.
func TestBackendConcurrencyAdmitsByPriority(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--max-backend-concurrency", "1")
	adminExec(t, px.Addr,
		"DROP RESOURCE GROUP IF EXISTS rg_low", "DROP RESOURCE GROUP IF EXISTS rg_high",
		"CREATE RESOURCE GROUP rg_low RU_PER_SEC = 100000 PRIORITY = LOW",
		"CREATE RESOURCE GROUP rg_high RU_PER_SEC = 100000 PRIORITY = HIGH")
	// Three sessions logged in before anything is timed: on a loaded
	// machine a login can take longer than the gaps below.
	db := openDB(t, px.Addr)
	db.SetMaxOpenConns(3)
	ctx := context.Background()
	conns := sessions(t, db, 3)
	busy := make(chan error, 1)
	go func() { _, err := conns[0].ExecContext(ctx, "SELECT SLEEP(3) AS prio_busy"); busy <- err }()
	// The slot is taken once the backend runs the sleep.
	direct := openDB(t, backendAddr)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := direct.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT SLEEP(3) AS prio\\_busy%'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the busy statement did not reach the backend within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Each statement reads the backend's clock as it starts: with one
	// backend slot they run one at a time, so the earlier time is the one
	// admitted first. (The order in which the two clients see their
	// answers is not: both come within a millisecond once the slot frees,
	// and one run beside a CPU hog saw LOW's first.)
	started := make(map[string]chan string, 2)
	run := func(c *sql.Conn, group string) {
		ch := make(chan string, 1)
		started[group] = ch
		go func() {
			var at string
			if err := c.QueryRowContext(ctx, "SELECT /*+ RESOURCE_GROUP("+group+") */ DATE_FORMAT(NOW(6), '%Y-%m-%d %H:%i:%s.%f')").Scan(&at); err != nil {
				t.Errorf("%s: %v", group, err)
			}
			ch <- at
		}()
	}
	run(conns[1], "rg_low")
	time.Sleep(500 * time.Millisecond) // LOW queues first
	run(conns[2], "rg_high")
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	high, low := <-started["rg_high"], <-started["rg_low"]
	t.Logf("the backend started rg_high's statement at %s, rg_low's at %s", high, low)
	if high == "" || low == "" {
		t.FailNow()
	}
	if high >= low {
		t.Fatalf("the backend ran rg_low's statement (at %s) before rg_high's (at %s); HIGH must go before LOW", low, high)
	}
}
