package tokenserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// startEtcdWith starts one embedded member configured by c (DataDir
// defaults to a temporary directory) and returns it with a client.
func startEtcdWith(t *testing.T, c EmbedConfig) (*EmbeddedEtcd, *clientv3.Client) {
	t.Helper()
	if c.DataDir == "" {
		c.DataDir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := StartEmbeddedEtcd(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := NewEtcdClient(e.Endpoints)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return e, cli
}

// etcdStatus returns the member's revision and database size.
func etcdStatus(t *testing.T, cli *clientv3.Client) (rev, dbSize int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, cli.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	return st.Header.Revision, st.DbSize
}

// groupsRequest asks for tokens in every named group.
func groupsRequest(proxy string, id uint64, names []string, wanted float64) *pb.TokenRequest {
	req := &pb.TokenRequest{ProxyId: proxy, RequestId: id}
	for _, n := range names {
		req.Groups = append(req.Groups, &pb.GroupTokenRequest{Group: n, TokensWanted: wanted, DemandRuPerSec: wanted * 2,
			Consumption: &pb.Consumption{Rru: wanted / 2, Statements: 1}})
	}
	return req
}

// An idle rgserver that had 1,000 active groups adds at most 5 etcd
// revisions and 256 KiB of database in 60 s (issue 15): bucket states are
// written when they change meaningfully, not every persist interval.
func TestIdleServerAfterActiveGroupsLeavesEtcdAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 80 s")
	}
	_, cli := startEtcdWith(t, EmbedConfig{})
	ts := startServerWith(t, cli, "", func(c *Config) { c.Now = time.Now }) // the default persist interval, 5 s
	waitFor(t, "leadership", ts.srv.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st := NewEtcdStore(cli)
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("g%04d", i)
		burst := resourcegroup.BurstOff
		if i%2 == 1 {
			burst = resourcegroup.BurstModerated
		}
		if err := st.CreateGroup(ctx, resourcegroup.Group{Name: names[i], RUPerSec: 100, Burst: burst}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the leader to know every group", func() bool {
		ts.srv.mu.Lock()
		defer ts.srv.mu.Unlock()
		return ts.srv.alloc.Len() == len(names)+1
	})
	// Active: three proxies ask for more than the fill every 500 ms for 6 s,
	// so every group drains, goes into debt and trickles.
	var streams []pb.TokenService_AcquireTokensClient
	for range 3 {
		s, err := pb.NewTokenServiceClient(ts.conn).AcquireTokens(ctx)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	revActive0, _ := etcdStatus(t, cli)
	for round := range 12 {
		for i, s := range streams {
			acquire(t, s, groupsRequest(fmt.Sprintf("p%d", i), uint64(round+1), names, 60))
		}
		time.Sleep(500 * time.Millisecond)
	}
	// Idle from here: let the trickles end and the last changes be saved.
	time.Sleep(2*DefaultPersistInterval + 2*time.Second)
	rev0, db0 := etcdStatus(t, cli)
	written0 := scrapeValue(t, ts, "rgserver_bucket_states_written_total")
	if written0 < float64(len(names)) || rev0 <= revActive0 {
		t.Fatalf("while active: %v states written, revision %d → %d; the test needs writes to mean anything", written0, revActive0, rev0)
	}
	time.Sleep(60 * time.Second)
	rev1, db1 := etcdStatus(t, cli)
	written1 := scrapeValue(t, ts, "rgserver_bucket_states_written_total")
	t.Logf("active: %v states written, revision %d → %d; idle 60 s: revision %d → %d (+%d), database %d → %d bytes (%+d), states written +%v",
		written0, revActive0, rev0, rev0, rev1, rev1-rev0, db0, db1, db1-db0, written1-written0)
	if rev1-rev0 > 5 {
		t.Errorf("idle for 60 s: %d etcd revisions, want ≤ 5", rev1-rev0)
	}
	if db1-db0 > 256<<10 {
		t.Errorf("idle for 60 s: database grew %d bytes, want ≤ 256 KiB", db1-db0)
	}
}

// grantedGroup creates group g and takes a first grant in it on a new
// token stream.
func grantedGroup(t *testing.T, ctx context.Context, ts *testServer, ruPerSec uint64) (pb.ResourceGroupServiceClient, pb.TokenService_AcquireTokensClient) {
	t.Helper()
	rg := pb.NewResourceGroupServiceClient(ts.conn)
	if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "g", RuPerSec: ruPerSec}}); err != nil {
		t.Fatal(err)
	}
	s, err := pb.NewTokenServiceClient(ts.conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	acquire(t, s, groupsRequest("p", 1, []string{"g"}, 10))
	return rg, s
}

// freeURL is an http URL on a free loopback port.
func freeURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "http://" + l.Addr().String()
}

// When etcd runs out of space (NOSPACE), the leader keeps granting, says
// why in EtcdProblem (/readyz) and rgserver_etcd_degraded, DDL fails with
// a clear error and writes nothing; once an operator frees space and
// disarms the alarm, everything works again.
func TestEtcdNoSpace(t *testing.T) {
	_, cli := startEtcdWith(t, EmbedConfig{QuotaBackendBytes: 4 << 20})
	ts := startServerWith(t, cli, "", nil)
	waitFor(t, "leadership", ts.srv.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rg, s := grantedGroup(t, ctx, ts, 1000)

	// Fill the database past its quota.
	junk := strings.Repeat("x", 256<<10)
	for i := 0; ; i++ {
		if _, err := cli.Put(ctx, fmt.Sprintf("/junk/%d", i), junk); err != nil {
			if !strings.Contains(err.Error(), "database space exceeded") {
				t.Fatalf("put %d: %v", i, err)
			}
			break
		}
		if i > 100 {
			t.Fatal("no NOSPACE after 25 MiB")
		}
	}
	// Grants go on; the change they make cannot be saved.
	if r := acquire(t, s, groupsRequest("p", 2, []string{"g"}, 300)); r.Grants[0].GetTokens() != 300 {
		t.Fatalf("grant under NOSPACE: %v", r)
	}
	if err := ts.srv.Persist(ctx); err == nil || !strings.Contains(err.Error(), "space exceeded") {
		t.Fatalf("persist under NOSPACE: %v", err)
	}
	waitFor(t, "EtcdProblem to name NOSPACE", func() bool { return strings.Contains(ts.srv.EtcdProblem(), "NOSPACE") })
	if v := scrapeValue(t, ts, `rgserver_etcd_degraded{reason="nospace"}`); v != 1 {
		t.Fatalf("rgserver_etcd_degraded{nospace} = %v", v)
	}
	if v := scrapeValue(t, ts, "rgserver_persist_errors_total"); v < 1 {
		t.Fatalf("rgserver_persist_errors_total = %v", v)
	}
	_, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "h", RuPerSec: 10}})
	if msg := status.Convert(err).Message(); status.Code(err) != codes.Unavailable || !strings.Contains(msg, "NOSPACE") || !strings.Contains(msg, "nothing was changed") {
		t.Fatalf("create under NOSPACE: %v", err)
	}
	_, err = rg.AlterGroup(ctx, &pb.AlterGroupRequest{Group: &pb.ResourceGroup{Name: "g", RuPerSec: 5}})
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "NOSPACE") {
		t.Fatalf("alter under NOSPACE: %v", err)
	}
	if _, err := rg.GetGroup(ctx, &pb.GetGroupRequest{Name: "h"}); status.Code(err) != codes.NotFound {
		t.Fatalf("the refused create left something: %v", err)
	}
	if g, err := rg.GetGroup(ctx, &pb.GetGroupRequest{Name: "g"}); err != nil || g.GetGroup().GetRuPerSec() != 1000 {
		t.Fatalf("the refused alter changed g: %v %v", g, err)
	}

	// The operator's way out (docs/operating.md): free space, compact,
	// defragment, disarm.
	if _, err := cli.Delete(ctx, "/junk/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	rev, _ := etcdStatus(t, cli)
	if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Defragment(ctx, cli.Endpoints()[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "EtcdProblem to clear", func() bool { return ts.srv.EtcdProblem() == "" })
	if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "h", RuPerSec: 10}}); err != nil {
		t.Fatalf("create after the alarm was disarmed: %v", err)
	}
	if err := ts.srv.Persist(ctx); err != nil {
		t.Fatalf("persist after the alarm was disarmed: %v", err)
	}
	if resp, err := cli.Get(ctx, stateKey("g")); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("g's state after recovery: %v %v", resp, err)
	}
	if v := scrapeValue(t, ts, `rgserver_etcd_degraded{reason="nospace"}`); v != 0 {
		t.Fatalf("rgserver_etcd_degraded{nospace} = %v after recovery", v)
	}
}

// When etcd goes away, the leader's session lapses, but no other replica
// can be elected without etcd: the leader keeps granting from memory and
// says so; when etcd is back with its lease and election key, it goes on
// leading on them, its fence intact.
func TestLeaderGrantsFromMemoryWhileEtcdIsDown(t *testing.T) {
	ec := EmbedConfig{DataDir: t.TempDir(), ClientURL: freeURL(t), PeerURL: freeURL(t)}
	e, cli := startEtcdWith(t, ec)
	// A lease of 4 s: etcd extends it by its TTL when it comes back, and
	// the client must reconnect within that to resume on it.
	ts := startServerWith(t, cli, "", func(c *Config) { c.Now, c.ElectionTTL = time.Now, 4*time.Second })
	waitFor(t, "leadership", ts.srv.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rg, s := grantedGroup(t, ctx, ts, 100)
	ts.srv.mu.Lock()
	key, rev := ts.srv.leaderKey, ts.srv.leaderRev
	ts.srv.mu.Unlock()

	start := time.Now()
	e.Close()
	t.Logf("etcd stopped in %v", time.Since(start).Round(time.Millisecond))
	// The session lapses one TTL after etcd's last answer (etcd answers
	// for a while as it stops).
	for deadline := time.Now().Add(40 * time.Second); !ts.srv.orphan.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the session never lapsed")
		}
	}
	t.Logf("granting from memory %v after etcd stopped", time.Since(start).Round(time.Millisecond))
	if !ts.srv.IsLeader() {
		t.Fatal("stepped down with etcd away")
	}
	r := acquire(t, s, groupsRequest("p", 2, []string{"g"}, 50))
	if r.NotLeader != nil || r.Grants[0].GetTokens() <= 0 || r.Grants[0].GetRuPerSec() != 100 {
		t.Fatalf("grant with etcd away: %v", r)
	}
	waitFor(t, "EtcdProblem to say so", func() bool { return strings.Contains(ts.srv.EtcdProblem(), "granting from memory") })
	if v := scrapeValue(t, ts, "rgserver_granting_from_memory"); v != 1 {
		t.Fatalf("rgserver_granting_from_memory = %v", v)
	}
	if v := scrapeValue(t, ts, `rgserver_etcd_degraded{reason="no_quorum"}`); v != 1 {
		t.Fatalf("rgserver_etcd_degraded{no_quorum} = %v", v)
	}
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	ddl := time.Now()
	_, err := rg.CreateGroup(dctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "h", RuPerSec: 10}})
	dcancel()
	t.Logf("CreateGroup with etcd away: %v after %v", err, time.Since(ddl).Round(time.Millisecond))
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "no quorum") {
		t.Fatalf("create with etcd away: %v", err)
	}

	start = time.Now()
	startEtcdWith(t, ec) // the same member, back
	waitFor(t, "etcd back and the leadership resumed", func() bool { return !ts.srv.orphan.Load() })
	t.Logf("resumed %v after etcd restarted", time.Since(start).Round(time.Millisecond))
	if !ts.srv.IsLeader() {
		t.Fatal("lost the leadership although its key survived")
	}
	ts.srv.mu.Lock()
	k2, r2 := ts.srv.leaderKey, ts.srv.leaderRev
	ts.srv.mu.Unlock()
	if k2 != key || r2 != rev {
		t.Fatalf("fence changed: %s@%d → %s@%d", key, rev, k2, r2)
	}
	if err := ts.srv.Persist(ctx); err != nil {
		t.Fatalf("persist after etcd came back: %v", err)
	}
	waitFor(t, "EtcdProblem to clear", func() bool { return ts.srv.EtcdProblem() == "" })
}

// The embedded member compacts its history by itself (periodic, as PD
// configures its own): old revisions go, so the database stays bounded.
func TestEmbeddedEtcdCompactsPeriodically(t *testing.T) {
	_, cli := startEtcdWith(t, EmbedConfig{CompactionRetention: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, err := cli.Put(ctx, "/t/k", "0")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if _, err := cli.Put(ctx, "/t/k", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, err := cli.Get(ctx, "/t/k", clientv3.WithRev(first.Header.Revision))
		if errors.Is(err, rpctypes.ErrCompacted) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("revision still readable 20 s later: no compaction")
		}
		// The compactor compacts to the revision it saw a retention ago.
		if _, err := cli.Put(ctx, "/t/tick", "x"); err != nil {
			t.Fatal(err)
		}
	}
}
