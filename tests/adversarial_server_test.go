package tests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// Hostile peers of rgserver (issue 23): callers without credentials, proxy
// credentials used for what they may not do, and authenticated proxies that
// send numbers no honest proxy sends. The hostile clients are written with
// the generated tokenpb client; the honest side is a real rgproxy.

// authedServer is an rgserver that authenticates: an admin token and the
// proxy credentials of proxyLines ("<name> <token> <max-streams>").
type authedServer struct {
	*tokenServer
	dir, adminFile, proxyFile string
	adminToken                string
	proxyTokens               map[string]string // name → token
}

func startAuthedServer(t *testing.T, proxyLines ...string) *authedServer {
	t.Helper()
	s := &authedServer{dir: t.TempDir(), adminToken: "adm-" + strconv.FormatInt(time.Now().UnixNano(), 36), proxyTokens: map[string]string{}}
	s.adminFile = filepath.Join(s.dir, "admin.token")
	s.proxyFile = filepath.Join(s.dir, "proxy.tokens")
	for _, l := range proxyLines {
		f := strings.Fields(l)
		s.proxyTokens[f[0]] = f[1]
	}
	if err := os.WriteFile(s.adminFile, []byte(s.adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.proxyFile, []byte(strings.Join(proxyLines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.tokenServer = startTokenServer(t, "--admin-token-file", s.adminFile, "--proxy-token-file", s.proxyFile)
	return s
}

// proxyTokenFile writes the credential name's line for an rgproxy.
func (s *authedServer) proxyTokenFile(t *testing.T, name string) string {
	t.Helper()
	f := filepath.Join(s.dir, name+".token")
	if err := os.WriteFile(f, []byte(s.proxyTokens[name]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// honestProxy is an rgproxy with the admin token and the proxy credential name.
func (s *authedServer) honestProxy(t *testing.T, name string, extra ...string) *proxy {
	t.Helper()
	return startMeteredProxy(t, s.tokenServer, append([]string{"--token-server-token-file", s.adminFile,
		"--token-server-proxy-token-file", s.proxyTokenFile(t, name)}, extra...)...)
}

// as returns ctx carrying a bearer token.
func as(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

func dialRaw(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// hostileStream sends req every interval on one AcquireTokens stream until
// ctx ends; it fails the test if the stream is refused.
func hostileStream(t *testing.T, ctx context.Context, conn *grpc.ClientConn, req *pb.TokenRequest, interval time.Duration) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	s, err := pb.NewTokenServiceClient(conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			// A Send on a stream that has ended says only io.EOF: Recv
			// says why (rgserver's status, or the test's own cancel,
			// which beside a CPU hog once landed during a Send).
			if err := s.Send(req); err != nil {
				for errors.Is(err, io.EOF) { // past answers still queued
					if _, rerr := s.Recv(); rerr != nil {
						if !errors.Is(rerr, io.EOF) {
							err = rerr
						}
						break
					}
				}
				if ctx.Err() != nil {
					err = nil
				}
				done <- err
				return
			}
			if _, err := s.Recv(); err != nil {
				if ctx.Err() != nil {
					err = nil
				}
				done <- err
				return
			}
			select {
			case <-ctx.Done():
				done <- nil
				return
			case <-tick.C:
			}
		}
	}()
	return done
}

// TestRgserverRefusesUnauthenticatedCalls: every RPC needs a credential;
// a proxy credential reads and streams but changes nothing.
func TestRgserverRefusesUnauthenticatedCalls(t *testing.T) {
	s := startAuthedServer(t, "px "+"px-token-0123456789abc 1")
	conn := dialRaw(t, s.Addr)
	rg := pb.NewResourceGroupServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := rg.CreateGroup(as(ctx, s.adminToken), &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "adv_a", RuPerSec: 10}}); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func(context.Context) error{
		"CreateGroup": func(c context.Context) error {
			_, err := rg.CreateGroup(c, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "adv_x", RuPerSec: 10}})
			return err
		},
		"AlterGroup": func(c context.Context) error {
			_, err := rg.AlterGroup(c, &pb.AlterGroupRequest{Group: &pb.ResourceGroup{Name: "adv_a", RuPerSec: 1e6}})
			return err
		},
		"DropGroup": func(c context.Context) error {
			_, err := rg.DropGroup(c, &pb.DropGroupRequest{Name: "adv_a"})
			return err
		},
		"BindUser": func(c context.Context) error {
			_, err := rg.BindUser(c, &pb.BindUserRequest{Binding: &pb.Binding{User: "victim", Host: "%", Group: "adv_a"}})
			return err
		},
		"AddWatch": func(c context.Context) error {
			_, err := rg.AddWatch(c, &pb.AddWatchRequest{Watch: &pb.RunawayWatch{Group: "adv_a", Match: pb.WatchType_WATCH_EXACT, Text: "select 1"}})
			return err
		},
		"ListBindings": func(c context.Context) error { _, err := rg.ListBindings(c, &pb.ListBindingsRequest{}); return err },
		"ListWatches":  func(c context.Context) error { _, err := rg.ListWatches(c, &pb.ListWatchesRequest{}); return err },
		"GetGroup": func(c context.Context) error {
			_, err := rg.GetGroup(c, &pb.GetGroupRequest{Name: "adv_a"})
			return err
		},
		"Watch": func(c context.Context) error {
			w, err := rg.Watch(c, &pb.WatchRequest{})
			if err != nil {
				return err
			}
			_, err = w.Recv()
			return err
		},
		"AcquireTokens": func(c context.Context) error {
			st, err := pb.NewTokenServiceClient(conn).AcquireTokens(c)
			if err != nil {
				return err
			}
			_ = st.Send(&pb.TokenRequest{ProxyId: "adv", Groups: []*pb.GroupTokenRequest{{Group: "adv_a", TokensWanted: 1}}})
			_, err = st.Recv() // the call's status, also when Send found the stream ended
			return err
		},
		"ServerReflection": func(c context.Context) error {
			r, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(c)
			if err != nil {
				return err
			}
			_ = r.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
			_, err = r.Recv() // the call's status, also when Send found the stream ended
			return err
		},
	}
	admin := map[string]bool{"CreateGroup": true, "AlterGroup": true, "DropGroup": true, "BindUser": true, "AddWatch": true}
	refused := 0
	for name, call := range calls {
		for _, who := range []struct {
			label string
			ctx   context.Context
		}{{"nobody", ctx}, {"a wrong token", as(ctx, "not-a-token")}} {
			if err := call(who.ctx); status.Code(err) != codes.Unauthenticated {
				t.Errorf("%s by %s: %v, want Unauthenticated", name, who.label, err)
			}
			refused++
		}
		err := call(as(ctx, s.proxyTokens["px"]))
		switch {
		case admin[name] && status.Code(err) != codes.PermissionDenied:
			t.Errorf("%s with a proxy credential: %v, want PermissionDenied", name, err)
		case !admin[name] && err != nil:
			t.Errorf("%s with a proxy credential: %v, want it served", name, err)
		}
	}
	// Nothing changed.
	g, err := rg.GetGroup(as(ctx, s.adminToken), &pb.GetGroupRequest{Name: "adv_a"})
	if err != nil || g.Group.RuPerSec != 10 {
		t.Fatalf("adv_a after the refused calls: %v, %v", g, err)
	}
	if b, err := rg.ListBindings(as(ctx, s.adminToken), &pb.ListBindingsRequest{}); err != nil || len(b.Bindings) != 0 {
		t.Fatalf("bindings: %v, %v", b, err)
	}
	if got := metricSum(t, s.StatusAddr, "rgserver_auth_refused_total", `reason="no_credential"`) +
		metricSum(t, s.StatusAddr, "rgserver_auth_refused_total", `reason="bad_credential"`); got != float64(refused) {
		t.Errorf("rgserver_auth_refused_total counts %v unauthenticated calls, want %d", got, refused)
	}
	if got := metricSum(t, s.StatusAddr, "rgserver_auth_refused_total", `reason="not_admin"`); got != float64(len(admin)) {
		t.Errorf("not_admin refusals %v, want %d", got, len(admin))
	}
}

// TestHostileDemandLeavesHonestRate: two authenticated hostile streams,
// with their own credentials, claim 1e308 RU/s of demand (one only
// reporting, one asking 1 RU at a time and claiming 1e15 held) on a
// 10 RU/s group an honest rgproxy saturates: the honest proxy's statement
// rate stays within 10% of what it was before they came.
func TestHostileDemandLeavesHonestRate(t *testing.T) {
	s := startAuthedServer(t, "honest honest-token-0123456789 1", "evil1 evil1-token-0123456789 1", "evil2 evil2-token-0123456789 1")
	px := s.honestProxy(t, "honest")
	appUser(t, "advb")
	adminExec(t, px.Addr, "CREATE RESOURCE GROUP adv_rate RU_PER_SEC = 10", "ALTER USER 'advb'@'%' RESOURCE GROUP adv_rate")
	const clients, window = 8, 5 * time.Second
	query := "SELECT 1"
	runLoad(t, []*proxy{px}, []int{clients}, "advb", query, 2*time.Second) // spends the start-up burst
	ru := func() float64 {
		return metricSum(t, px.StatusAddr, "rgproxy_ru_consumed_total", `resource_group="adv_rate"`)
	}
	ru0 := ru()
	base := runLoad(t, []*proxy{px}, []int{clients}, "advb", query, window)
	ru1 := ru()

	ctx, cancel := context.WithCancel(context.Background())
	conn := dialRaw(t, s.Addr)
	e1 := hostileStream(t, as(ctx, s.proxyTokens["evil1"]), conn, &pb.TokenRequest{ProxyId: "evil-1",
		Groups: []*pb.GroupTokenRequest{{Group: "adv_rate", DemandRuPerSec: 1e308, ReportOnly: true}}}, 50*time.Millisecond)
	e2 := hostileStream(t, as(ctx, s.proxyTokens["evil2"]), conn, &pb.TokenRequest{ProxyId: "evil-2",
		Groups: []*pb.GroupTokenRequest{{Group: "adv_rate", DemandRuPerSec: 1e308, TokensWanted: 1, HeldTokens: 1e15}}}, 50*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	attacked := runLoad(t, []*proxy{px}, []int{clients}, "advb", query, window)
	ru2 := ru()
	cancel()
	for _, e := range []<-chan error{e1, e2} {
		if err := <-e; err != nil {
			t.Fatalf("a hostile stream was ended (it is authenticated, its numbers are only clamped): %v", err)
		}
	}
	b, a := float64(base.statements.Load()), float64(attacked.statements.Load())
	t.Logf("honest proxy: %.0f statements (%.1f RU) in %v alone, %.0f (%.1f RU) beside two 1e308 demand streams",
		b, ru1-ru0, window, a, ru2-ru1)
	if base.errors.Load() > 0 || attacked.errors.Load() > 0 {
		t.Fatalf("errors: %d then %d (%v, %v)", base.errors.Load(), attacked.errors.Load(), base.firstErr.Load(), attacked.firstErr.Load())
	}
	if b < 20 || a < 0.9*b {
		t.Fatalf("the honest rate fell from %.0f to %.0f statements per %v (more than 10%%)", b, a, window)
	}
	if metricSum(t, s.StatusAddr, "rgserver_token_request_clamped_total", `field="demand_ru_per_sec"`) == 0 ||
		metricSum(t, s.StatusAddr, "rgserver_token_request_clamped_total", `field="held_tokens"`) == 0 {
		t.Error("the clamped demand and held tokens are not counted")
	}
}

// TestFakeProxyIDsDoNotShrinkMaxConcurrency: 30 fake proxy ids sent with
// the honest proxy's own credential (1 stream) are refused, so rgserver
// still counts one proxy and MAX_CONCURRENCY = 8 still lets 8 SLEEP(1)
// run at once.
func TestFakeProxyIDsDoNotShrinkMaxConcurrency(t *testing.T) {
	s := startAuthedServer(t, "honest honest-token-0123456789 1")
	px := s.honestProxy(t, "honest")
	appUser(t, "advc")
	adminExec(t, px.Addr, "CREATE RESOURCE GROUP adv_mc RU_PER_SEC = 100000 MAX_CONCURRENCY = 8",
		"ALTER USER 'advc'@'%' RESOURCE GROUP adv_mc")
	db := openDB(t, px.Addr, "user=advc", "password=apppw")
	db.SetMaxOpenConns(8)
	batch := func() time.Duration { return concurrently(t, db, 8, "SELECT SLEEP(1)") }
	// The shape's first statement is its probe (copies wait for it).
	if _, err := db.Exec("SELECT SLEEP(0)"); err != nil {
		t.Fatal(err)
	}
	if d := batch(); d > 1500*time.Millisecond {
		t.Fatalf("8 × SLEEP(1) took %v before any fake id", d)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn := dialRaw(t, s.Addr)
	refused := 0
	var live []<-chan error
	for i := range 30 {
		st, err := pb.NewTokenServiceClient(conn).AcquireTokens(as(ctx, s.proxyTokens["honest"]))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&pb.TokenRequest{ProxyId: fmt.Sprintf("fake-%d", i), Groups: []*pb.GroupTokenRequest{{Group: "adv_mc", TokensWanted: 1, DemandRuPerSec: 1}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); status.Code(err) == codes.ResourceExhausted {
			refused++
			continue
		} else if err != nil {
			t.Fatalf("fake id %d: %v", i, err)
		}
		// Accepted: keep it alive as a proxy would.
		live = append(live, hostileStream(t, as(ctx, s.proxyTokens["honest"]), conn, &pb.TokenRequest{ProxyId: fmt.Sprintf("fake-%d", i),
			Groups: []*pb.GroupTokenRequest{{Group: "adv_mc", ReportOnly: true}}}, 100*time.Millisecond))
	}
	// Over a report round (5 s) the proxy hears the group's proxy count.
	var worst time.Duration
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); {
		worst = max(worst, batch())
	}
	clients := metricSum(t, s.StatusAddr, "rgserver_group_clients", `resource_group="adv_mc"`)
	t.Logf("30 fake ids: %d refused; rgserver counts %.0f proxies; slowest 8 × SLEEP(1) %v", refused, clients, worst.Round(time.Millisecond))
	if refused != 30 || clients != 1 {
		t.Errorf("%d of 30 fake ids refused, rgserver counts %.0f proxies in the group; want 30 and 1", refused, clients)
	}
	if worst > 1500*time.Millisecond {
		t.Fatalf("8 × SLEEP(1) took %v beside 30 fake ids: MAX_CONCURRENCY shrank", worst)
	}
}

// TestFakeHeldTokensKeepBurst: a proxy credential claiming to hold 1e15
// tokens of a BURSTABLE group does not erase the burst the group saved:
// the honest proxy's first 3 s run within 15% of what an untouched twin
// group runs.
func TestFakeHeldTokensKeepBurst(t *testing.T) {
	s := startAuthedServer(t, "honest honest-token-0123456789 1", "evil evil-token-01234567890 1")
	px := s.honestProxy(t, "honest")
	appUser(t, "advd")
	appUser(t, "advd2")
	adminExec(t, px.Addr,
		"CREATE RESOURCE GROUP adv_burst RU_PER_SEC = 10 BURSTABLE", "ALTER USER 'advd'@'%' RESOURCE GROUP adv_burst",
		"CREATE RESOURCE GROUP adv_twin RU_PER_SEC = 10 BURSTABLE", "ALTER USER 'advd2'@'%' RESOURCE GROUP adv_twin")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evil := hostileStream(t, as(ctx, s.proxyTokens["evil"]), dialRaw(t, s.Addr), &pb.TokenRequest{ProxyId: "evil",
		Groups: []*pb.GroupTokenRequest{{Group: "adv_burst", ReportOnly: true, HeldTokens: 1e15}}}, 50*time.Millisecond)
	time.Sleep(2 * time.Second) // the group idles with its capacity saved; the claim stands
	attacked := runLoad(t, []*proxy{px}, []int{8}, "advd", "SELECT 1", 3*time.Second)
	twin := runLoad(t, []*proxy{px}, []int{8}, "advd2", "SELECT 1", 3*time.Second)
	cancel()
	if err := <-evil; err != nil {
		t.Fatalf("the hostile stream: %v", err)
	}
	a, w := float64(attacked.statements.Load()), float64(twin.statements.Load())
	t.Logf("first 3 s of a BURSTABLE 10 RU/s group: %.0f statements beside a 1e15 held claim, %.0f in its untouched twin", a, w)
	if a < 0.85*w {
		t.Fatalf("the held claim erased the burst: %.0f statements against %.0f", a, w)
	}
}

// vmRSS is a process's resident memory in bytes (/proc/<pid>/status).
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestUnknownGroupNamesBoundedMemory: 20 messages of 10,000 unknown group
// names, sent at once on one authenticated stream, are all answered (NOT_FOUND
// or UNAVAILABLE) within seconds, without one etcd read each, and grow
// rgserver's RSS by less than 32 MiB (with rgserver's own GC settings:
// under GOGC=400, which it once set, garbage alone took 70 MiB more).
func TestUnknownGroupNamesBoundedMemory(t *testing.T) {
	t.Setenv("GOGC", "")
	s := startAuthedServer(t, "evil evil-token-01234567890 1")
	pid := s.process.cmd.Process.Pid
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := pb.NewTokenServiceClient(dialRaw(t, s.Addr)).AcquireTokens(as(ctx, s.proxyTokens["evil"]))
	if err != nil {
		t.Fatal(err)
	}
	send := func(i int) {
		req := &pb.TokenRequest{ProxyId: "evil", RequestId: uint64(i)}
		for j := range 10000 {
			req.Groups = append(req.Groups, &pb.GroupTokenRequest{Group: fmt.Sprintf("u%02d_%05d", i, j), TokensWanted: 1})
		}
		if err := st.Send(req); err != nil {
			t.Error(err)
		}
	}
	answered := 0
	recv := func() {
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range resp.Grants {
			if g.ErrorCode == pb.GrantError_GRANT_ERROR_NOT_FOUND || g.ErrorCode == pb.GrantError_GRANT_ERROR_UNAVAILABLE {
				answered++
			}
		}
	}
	send(99) // warm up the stream's buffers
	recv()
	answered = 0
	before := vmRSS(t, pid)
	began := time.Now()
	go func() {
		for i := range 20 {
			send(i)
		}
	}()
	var peak int64
	for range 20 {
		recv()
		peak = max(peak, vmRSS(t, pid))
	}
	took := time.Since(began)
	peak = max(peak, vmRSS(t, pid))
	t.Logf("200,000 unknown group names on one stream: answered %d in %v; rgserver RSS %d MiB → at most %d MiB",
		answered, took.Round(time.Millisecond), before>>20, peak>>20)
	if answered != 200000 {
		t.Errorf("%d of 200,000 unknown names answered as unknown", answered)
	}
	if took > 5*time.Second {
		t.Errorf("answering took %v: an etcd read per unknown name?", took)
	}
	if peak-before >= 32<<20 {
		t.Errorf("rgserver's RSS grew by %d MiB", (peak-before)>>20)
	}
	if metricSum(t, s.StatusAddr, "rgserver_unknown_groups_refused_total", `reason="rate_limited"`) == 0 {
		t.Error("the per-stream limit is not counted")
	}
}

// TestRgserverRefusesWildcardWithoutAuth: beyond loopback with no
// authentication rgserver does not start, and says what to add; with
// --insecure it starts and says, loudly, that it authenticates nobody.
func TestRgserverRefusesWildcardWithoutAuth(t *testing.T) {
	_, port, _ := strings.Cut(freeAddr(t), ":")
	p := startProcess(t, "rgserver", "--addr", "0.0.0.0:"+port, "--status-addr", freeAddr(t), "--data-dir", t.TempDir())
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("rgserver --addr 0.0.0.0 without authentication is still running")
	}
	if p.err == nil {
		t.Fatal("rgserver --addr 0.0.0.0 without authentication exited 0")
	}
	for _, flag := range []string{"--admin-token-file", "--proxy-token-file", "--tls-ca", "--tls-admin-names", "--insecure"} {
		if !strings.Contains(p.log.String(), flag) {
			t.Errorf("the refusal does not name %s:\n%s", flag, p.log.String())
		}
	}

	status := freeAddr(t)
	q := startProcess(t, "rgserver", "--addr", "0.0.0.0:"+port, "--status-addr", status, "--data-dir", t.TempDir(), "--insecure")
	waitReady(t, "http://"+status+"/readyz", q)
	if !strings.Contains(q.log.String(), "level=WARN msg=\"INSECURE") {
		t.Errorf("no warning at start:\n%s", q.log.String())
	}
	if _, body := httpGet(t, "http://"+status+"/readyz"); !strings.Contains(body, `"insecure":"true"`) {
		t.Errorf("/readyz does not say so: %s", body)
	}
	if v := metricSum(t, status, "rgserver_insecure"); v != 1 {
		t.Errorf("rgserver_insecure = %v", v)
	}
}

// TestHostileUsageReportsAndQueries: a proxy credential that reports what
// no proxy meters — RU and counts near their types' ends, an interval of
// 49 days, a NaN — moves the usage history only as far as its grants, its
// count bucket and the per-message bounds let it, and an honest group's
// history not at all; a usage-history request out of bounds is
// InvalidArgument, one without a credential Unauthenticated, and an
// answer never exceeds its row cap.
func TestHostileUsageReportsAndQueries(t *testing.T) {
	s := startAuthedServer(t, "honest honest-token-0123456789 1", "evil evil-token-0123456789 1")
	px := s.honestProxy(t, "honest")
	adminExec(t, px.Addr, "CREATE RESOURCE GROUP adv_hist RU_PER_SEC = 10", "CREATE RESOURCE GROUP adv_honest RU_PER_SEC = 100000")
	db := openDB(t, px.Addr)
	for range 20 {
		if _, err := db.Exec("SELECT /*+ RESOURCE_GROUP(adv_honest) */ 1"); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn := dialRaw(t, s.Addr)
	evil := as(ctx, s.proxyTokens["evil"])
	began := time.Now()
	st, err := pb.NewTokenServiceClient(conn).AcquireTokens(evil)
	if err != nil {
		t.Fatal(err)
	}
	lie := &pb.Consumption{Rru: 1e15, Wru: 1e15, Statements: math.MaxUint64, Throttled: math.MaxUint64, Refused: math.MaxUint64,
		WaitedRu: 1e300, DeniedRu: 1e300, IntervalMs: math.MaxUint32, IdleMs: math.MaxUint32}
	const lies = 3
	for range lies {
		if err := st.Send(&pb.TokenRequest{ProxyId: "evil-1", Groups: []*pb.GroupTokenRequest{{Group: "adv_hist", TokensWanted: 1, Consumption: lie}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatalf("a report with figures at their bounds: %v", err)
		}
	}
	// A NaN ends the stream with InvalidArgument: no figure of it counts.
	_ = st.Send(&pb.TokenRequest{ProxyId: "evil-1", Groups: []*pb.GroupTokenRequest{{Group: "adv_hist", ReportOnly: true,
		Consumption: &pb.Consumption{Rru: math.NaN(), Statements: 5}}}})
	if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a NaN in a report: %v, want InvalidArgument", err)
	}

	// The history, read through the honest proxy: finite, bounded sums
	// for the lying credential's group; the honest group's 20 statements.
	const q = "SELECT NAME, SUM(RU), SUM(STATEMENTS), SUM(THROTTLED), SUM(REFUSED), SUM(WAITED_RU), SUM(DENIED_RU) " +
		"FROM information_schema.resource_group_usage_history WHERE NAME IN ('adv_hist', 'adv_honest') AND GRANULARITY = 1 GROUP BY NAME ORDER BY NAME"
	var rows [][]string
	deadline := time.Now().Add(20 * time.Second)
	for {
		rows, err = queryStrings(t, db, q)
		if err == nil && len(rows) == 2 && rows[1][2] == "20" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the history of adv_hist and adv_honest within 20 s: %q, %v", rows, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	num := func(s string) float64 {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		return v
	}
	// Bounds: RU by what a 10 RU/s group could have granted the
	// credential (its first minute away, its bucket, its debt); counts by
	// the credential's count bucket (a minute of 100,000/s, refilling at
	// that rate since the stream began); the demand figures, which no
	// grant bounds, by 1e12 per message.
	counts := 100_000 * (60 + time.Since(began).Seconds())
	bounds := []struct {
		name string
		most float64
	}{{"RU", 10 * 120}, {"STATEMENTS", counts}, {"THROTTLED", counts}, {"REFUSED", counts}, {"WAITED_RU", lies * 1e12}, {"DENIED_RU", lies * 1e12}}
	for i, b := range bounds {
		if v := num(rows[0][i+1]); !(v >= 0 && v <= b.most) {
			t.Errorf("adv_hist's %s in the history: %v after %d reports claiming the most their types hold, want at most %g", b.name, v, lies, b.most)
		}
	}
	t.Logf("the history after %d lying reports: %q; the honest group: %q", lies, rows[0], rows[1])

	// UsageHistory out of bounds.
	us := pb.NewUsageServiceClient(conn)
	many := make([]string, 1001)
	for i := range many {
		many[i] = fmt.Sprintf("g%d", i)
	}
	nowMs := time.Now().UnixMilli()
	for name, req := range map[string]*pb.UsageHistoryRequest{
		"all groups and names":            {AllGroups: true, Groups: []string{"adv_hist"}},
		"neither":                         {},
		"1,001 groups":                    {Groups: many},
		"a 10 KB name":                    {Groups: []string{strings.Repeat("x", 10_000)}},
		"a range ending before it starts": {AllGroups: true, FromUnixMs: nowMs, ToUnixMs: nowMs - 1000},
		"a negative start":                {AllGroups: true, FromUnixMs: -1},
		"a range ending tomorrow":         {AllGroups: true, ToUnixMs: nowMs + 24*3600*1000},
		"a granularity of 7 s":            {AllGroups: true, GranularityS: 7},
	} {
		if _, err := us.UsageHistory(evil, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("UsageHistory with %s: %v, want InvalidArgument", name, err)
		}
	}
	if _, err := us.UsageHistory(ctx, &pb.UsageHistoryRequest{AllGroups: true}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("UsageHistory without a credential: %v, want Unauthenticated", err)
	}
	r, err := us.UsageHistory(evil, &pb.UsageHistoryRequest{AllGroups: true, Limit: math.MaxUint32})
	if err != nil || len(r.GetRows()) == 0 || len(r.GetRows()) > 100_000 {
		t.Errorf("UsageHistory asking for 4 billion rows: %d rows, %v; want the history's rows, at most 100,000", len(r.GetRows()), err)
	}
}
