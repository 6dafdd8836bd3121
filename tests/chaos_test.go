package tests

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// replicaSet is three rgservers, each embedding one member of one etcd
// cluster, that the chaos tests kill and restart.
type replicaSet struct {
	t       testing.TB
	dir     string
	names   []string
	addrs   []string
	status  []string
	args    [][]string
	procs   []*process
	cluster string
}

func startReplicaSet(t testing.TB) *replicaSet {
	t.Helper()
	rs := &replicaSet{t: t, dir: t.TempDir(), names: []string{"c1", "c2", "c3"}}
	var peers []string
	for _, n := range rs.names {
		peer := "http://" + freeAddr(t)
		rs.addrs = append(rs.addrs, freeAddr(t))
		rs.status = append(rs.status, freeAddr(t))
		peers = append(peers, n+"="+peer)
		rs.args = append(rs.args, []string{"--name", n, "--etcd-peer-addr", peer})
	}
	rs.cluster = strings.Join(peers, ",")
	for i := range rs.names {
		rs.args[i] = append(rs.args[i], "--addr", rs.addrs[i], "--status-addr", rs.status[i],
			"--data-dir", filepath.Join(rs.dir, rs.names[i]), "--etcd-initial-cluster", rs.cluster, "--log-level", "warn")
		rs.procs = append(rs.procs, startProcess(t, "rgserver", rs.args[i]...))
	}
	for i := range rs.names {
		waitReady(t, "http://"+rs.status[i]+"/readyz", rs.procs[i])
	}
	return rs
}

// leader returns the index of the replica that says it leads, waiting for one.
func (rs *replicaSet) leader() int { return rs.leaderOtherThan(-1) }

// leaderOtherThan is leader, ignoring replica skip (one being stopped).
func (rs *replicaSet) leaderOtherThan(skip int) int {
	rs.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for i, p := range rs.procs {
			select {
			case <-p.done:
				continue
			default:
			}
			if i == skip {
				continue
			}
			if metricSum(rs.t, rs.status[i], "rgserver_is_leader") == 1 {
				return i
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	rs.t.Fatal("no rgserver leads")
	return -1
}

func (rs *replicaSet) restart(i int) {
	rs.t.Helper()
	rs.procs[i] = startProcess(rs.t, "rgserver", rs.args[i]...)
	waitReady(rs.t, "http://"+rs.status[i]+"/readyz", rs.procs[i])
}

func (rs *replicaSet) endpoints() string { return strings.Join(rs.addrs, ",") }

// TestChaosLeaderKilledAndResignedUnderLoad: the rgserver leader is killed
// (SIGKILL) or resigns (SIGTERM), again and again, under load through three
// proxies. No statement fails, and the group's consumption stays within
// ±10% of its limit over the run.
func TestChaosLeaderKilledAndResignedUnderLoad(t *testing.T) {
	rs := startReplicaSet(t)
	tsFirst := &tokenServer{Addr: rs.endpoints()}
	var pxs []*proxy
	for i := 0; i < 3; i++ {
		pxs = append(pxs, startProxy(t, "--token-server", tsFirst.Addr, "--log-level", "warn"))
	}
	appUser(t, "rgchaos")
	const rate = 200.0
	adminExec(t, pxs[0].Addr,
		"DROP RESOURCE GROUP IF EXISTS rg_chaos",
		fmt.Sprintf("CREATE RESOURCE GROUP rg_chaos RU_PER_SEC = %d", int(rate)),
		"ALTER USER 'rgchaos'@'%' RESOURCE GROUP rg_chaos")
	time.Sleep(time.Second)

	consumed := func() float64 {
		var sum float64
		for _, px := range pxs {
			sum += metricSum(t, px.StatusAddr, "rgproxy_ru_consumed_total", `resource_group="rg_chaos"`)
		}
		return sum
	}
	const d = 40 * time.Second
	before := consumed()
	start := time.Now()
	done := make(chan *loadResult, 1)
	go func() { done <- runLoad(t, pxs, []int{4, 4, 4}, "rgchaos", "SELECT 1", d) }()
	var events []string
	for round := 0; time.Since(start) < d-10*time.Second; round++ {
		time.Sleep(7 * time.Second)
		l := rs.leader()
		sig, how := syscall.SIGKILL, "SIGKILL"
		if round%2 == 1 {
			sig, how = syscall.SIGTERM, "resign (SIGTERM)"
		}
		at := time.Now()
		rs.procs[l].cmd.Process.Signal(sig)
		nl := rs.leaderOtherThan(l)
		events = append(events, fmt.Sprintf("%s of %s at %v: %s leads %v later", how, rs.names[l],
			at.Sub(start).Round(time.Second), rs.names[nl], time.Since(at).Round(time.Millisecond)))
		<-rs.procs[l].done
		rs.restart(l)
	}
	res := <-done
	elapsed := time.Since(start)
	for _, e := range events {
		t.Log(e)
	}
	if n := res.errors.Load(); n != 0 {
		t.Fatalf("%d statement errors, first: %v", n, res.firstErr.Load())
	}
	got := consumed() - before
	want := rate*elapsed.Seconds() + rate
	t.Logf("%d statements, %.1f RU consumed through 3 proxies in %v; limit × T + capacity = %.0f (%+.1f%%)",
		res.statements.Load(), got, elapsed.Round(time.Millisecond), want, 100*(got-want)/want)
	if !within(got, want, 0.10) {
		t.Fatalf("consumption %.1f RU not within ±10%% of %.0f", got, want)
	}
}
