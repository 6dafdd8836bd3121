// Command bench-server (`make bench-server`) measures rgserver's token
// throughput: many simulated proxies, each with one AcquireTokens stream,
// drive one real rgserver over loopback gRPC closed-loop (each proxy sends
// its next batch as soon as the last is answered). It prints group-grants
// per second, the p50/p99 latency of one stream message, and the server's
// CPU microseconds per group-grant (from its process_cpu_seconds_total).
// Meanwhile it scrapes /metrics as Prometheus would, and halfway through a
// new proxy (tokenclient) joins: the time until it holds the settings stream's
// snapshot of every group is printed, and so is the server's resident
// memory at the end.
//
// --groups takes a list: each count is a run of its own against a fresh
// rgserver, and the runs are compared side by side at the end, with the
// ratio of each run's p99 to the first's (a scrape or any other pass over
// every group must not hold grants up: make bench-server wants at most 3×
// from 1,000 to 100,000 groups).
//
//	bin/bench-server --rgserver ./bin/rgserver   # spawns one
//	bin/bench-server --rgserver ./bin/rgserver --groups 1000,100000 --rate 20000
//	bin/bench-server --addr 127.0.0.1:3379 --status-addr 127.0.0.1:3380
//
// It lives under cmd/, not beside rgserver's code, because it imports
// tokenclient, which package tokenserver must never do.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rgproxy/rgproxy/tokenclient"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// options are the benchmark's flags.
type options struct {
	// bin is the rgserver binary to spawn; "" = use addr.
	bin string
	// addr and statusAddr locate a running rgserver when bin is "".
	addr, statusAddr string
	// proxies is the number of simulated proxies (streams). Default 200.
	proxies int
	// groups is the number of resource groups of this run. Default 1000.
	groups int
	// perMsg is how many groups one message asks for. Default 50.
	perMsg int
	// ruPerSec is every group's RU_PER_SEC. Default 1,000,000.
	ruPerSec uint64
	// warmup is discarded before measuring; duration is measured. Defaults 2 s, 10 s.
	warmup, duration time.Duration
	// rate paces the proxies to this many group-grants/s in total (each
	// still waits for its answer before the next message); 0 = closed loop,
	// as fast as answers come. Default 0.
	rate float64
	// createWorkers create the groups in parallel. Default 32.
	createWorkers int
	// scrapeEvery scrapes /metrics this often during the run; 0 = never.
	// Default 5 s.
	scrapeEvery time.Duration
	// join: a proxy joins halfway through and times its Watch snapshot.
	join bool
	// parentEvery: of every parentEvery groups, the first is the PARENT
	// of the others (0 = no parents), so that rgserver shares parents'
	// pools at every rebalance of the run. Default 0.
	parentEvery int
}

func main() {
	var o options
	flag.StringVar(&o.bin, "rgserver", "", "rgserver binary to spawn (fresh data dir and ports)")
	flag.StringVar(&o.addr, "addr", "127.0.0.1:3379", "gRPC address of a running rgserver (without --rgserver)")
	flag.StringVar(&o.statusAddr, "status-addr", "127.0.0.1:3380", "status address of a running rgserver (for CPU time)")
	flag.IntVar(&o.proxies, "proxies", 200, "simulated proxies, one stream each")
	groupsList := flag.String("groups", "1000", "resource groups; a comma-separated list runs each against a fresh rgserver and compares them")
	flag.IntVar(&o.perMsg, "groups-per-message", 50, "groups asked for in one message")
	flag.Uint64Var(&o.ruPerSec, "ru-per-sec", 1_000_000, "RU_PER_SEC of every group")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "warm-up time, not measured")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measured time")
	flag.Float64Var(&o.rate, "rate", 0, "pace to this many group-grants/s in total (0 = closed loop, find the maximum)")
	flag.IntVar(&o.createWorkers, "create-workers", 32, "groups created in parallel before the run")
	flag.DurationVar(&o.scrapeEvery, "scrape-every", 5*time.Second, "scrape /metrics this often during the run, as Prometheus would (0 = never)")
	flag.BoolVar(&o.join, "join", true, "halfway through, a new proxy joins and times its Watch snapshot of every group")
	flag.IntVar(&o.parentEvery, "parent-every", 0, "of every this many groups, the first is the PARENT of the others (0 = no parents)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// The load generator allocates per message too; keep its GC from
	// competing with the server for the same cores.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	counts, err := parseCounts(*groupsList)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-server: --groups:", err)
		os.Exit(2)
	}
	var results []result
	for i, n := range counts {
		o := o
		o.groups = n
		if i > 0 {
			fmt.Println()
		}
		r, err := run(context.Background(), o, os.Stdout, log)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench-server:", err)
			os.Exit(1)
		}
		results = append(results, r)
	}
	if len(results) > 1 {
		fmt.Println()
		compare(os.Stdout, results, o)
	}
}

// parseCounts parses --groups: positive counts separated by commas.
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number of groups", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// result is what one run measured, for the comparison.
type result struct {
	groups        int
	p50, p99, max time.Duration
	// cpuPerGrant is the server's CPU µs per group-grant, NaN if unknown.
	cpuPerGrant float64
	// rssPeak is the server's peak resident memory in bytes, 0 if unknown.
	rssPeak float64
	// scrapes and slowestScrape describe the /metrics scrapes.
	scrapes       int
	slowestScrape time.Duration
}

// compare prints runs side by side, each p99 as a multiple of the first's.
func compare(out io.Writer, rs []result, o options) {
	scr := "no /metrics scrapes"
	if o.scrapeEvery > 0 {
		scr = fmt.Sprintf("/metrics scraped every %v", o.scrapeEvery)
	}
	mode := "closed loop"
	if o.rate > 0 {
		mode = fmt.Sprintf("paced at %.0f group-grants/s", o.rate)
	}
	fmt.Fprintf(out, "compared: %d proxies, %d groups per message, %s, %s\n", o.proxies, o.perMsg, mode, scr)
	fmt.Fprintf(out, "%8s  %9s  %9s  %9s  %9s  %13s  %8s  %14s\n", "groups", "p50", "p99", "max", "p99 ratio", "CPU per grant", "peak RSS", "slowest scrape")
	for _, r := range rs {
		cpu, rss := "unknown", "unknown"
		if !math.IsNaN(r.cpuPerGrant) {
			cpu = fmt.Sprintf("%.2f µs", r.cpuPerGrant)
		}
		if r.rssPeak > 0 {
			rss = fmt.Sprintf("%.0f MiB", r.rssPeak/(1<<20))
		}
		slowest := "-"
		if r.scrapes > 0 {
			slowest = r.slowestScrape.Round(time.Millisecond).String()
		}
		fmt.Fprintf(out, "%8d  %9v  %9v  %9v  %8.2fx  %13s  %8s  %14s\n", r.groups, round(r.p50), round(r.p99), round(r.max),
			float64(r.p99)/float64(rs[0].p99), cpu, rss, slowest)
	}
	last := rs[len(rs)-1]
	fmt.Fprintf(out, "p99 at %d groups is %.2fx the p99 at %d (target: at most 3x, RSS under 1 GiB)\n",
		last.groups, float64(last.p99)/float64(rs[0].p99), rs[0].groups)
}

// round keeps three significant digits of a latency.
func round(d time.Duration) time.Duration {
	switch {
	case d >= 100*time.Millisecond:
		return d.Round(time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// spawn starts rgserver with a temporary data dir and waits for /readyz.
// pid is the server's process id.
func spawn(ctx context.Context, o *options) (stop func(), pid int, err error) {
	dir, err := os.MkdirTemp("", "rgserver-bench")
	if err != nil {
		return nil, 0, err
	}
	if o.addr, err = freeAddr(); err != nil {
		return nil, 0, err
	}
	if o.statusAddr, err = freeAddr(); err != nil {
		return nil, 0, err
	}
	cmd := exec.CommandContext(ctx, o.bin, "--addr", o.addr, "--status-addr", o.statusAddr, "--data-dir", dir+"/data", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, 0, err
	}
	stop = func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		os.RemoveAll(dir)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + o.statusAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return stop, cmd.Process.Pid, nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	return nil, 0, errors.New("rgserver not ready after 30 s")
}

// serverMetric reads one unlabelled series (e.g. process_cpu_seconds_total)
// from the status port.
func serverMetric(statusAddr, name string) (float64, error) {
	resp, err := http.Get("http://" + statusAddr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /metrics", name)
}

// scrape reads the whole of /metrics, as Prometheus does (gzip asked
// for), and returns how long it took and how many bytes came. The body is
// not decompressed: Prometheus does that on its own machine, and here it
// would take the server's cores.
func scrape(statusAddr string) (time.Duration, int64, error) {
	start := time.Now()
	req, err := http.NewRequest(http.MethodGet, "http://"+statusAddr+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	return time.Since(start), n, err
}

// procStatus reads a kB field (VmRSS, VmHWM) of /proc/<pid>/status, in bytes.
func procStatus(pid int, field string) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// createGroups creates the groups with o.createWorkers in parallel: with
// o.parentEvery, the parents first, then their children.
func createGroups(ctx context.Context, rg pb.ResourceGroupServiceClient, names []string, o options) error {
	if o.parentEvery <= 1 {
		return createSome(ctx, rg, names, func(int) string { return "" }, o)
	}
	var parents, children []string
	for i, n := range names {
		if i%o.parentEvery == 0 {
			parents = append(parents, n)
		} else {
			children = append(children, n)
		}
	}
	if err := createSome(ctx, rg, parents, func(int) string { return "" }, o); err != nil {
		return err
	}
	// children[k] is names[i] with i = k + k/(parentEvery-1) + 1; its
	// parent is names[i - i%parentEvery].
	return createSome(ctx, rg, children, func(k int) string {
		i := k + k/(o.parentEvery-1) + 1
		return names[i-i%o.parentEvery]
	}, o)
}

// createSome creates the groups names (names[k]'s PARENT parentOf(k))
// with o.createWorkers in parallel.
func createSome(ctx context.Context, rg pb.ResourceGroupServiceClient, names []string, parentOf func(int) string, o options) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	errs := make(chan error, max(o.createWorkers, 1))
	var wg sync.WaitGroup
	for range max(o.createWorkers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				name := names[k]
				_, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: name, RuPerSec: o.ruPerSec, Burst: pb.BurstMode_BURST_MODERATED, Parent: parentOf(k)}})
				if err != nil && status.Code(err) != codes.AlreadyExists {
					errs <- fmt.Errorf("create %s: %w", name, err)
					cancel()
					return
				}
			}
		}()
	}
	for k := range names {
		select {
		case next <- k:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	return <-errs
}

// joinProxy starts a tokenclient, as a proxy that joins does, and returns
// how long Start took (it returns once the settings snapshot is applied) and
// how many groups the snapshot held.
func joinProxy(ctx context.Context, addr string) (time.Duration, int, error) {
	dir, err := os.MkdirTemp("", "rgserver-bench-join")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	c, err := tokenclient.New(tokenclient.Config{Servers: []string{addr}, ProxyID: "bench-joiner", CacheDir: dir,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	start := time.Now()
	if err := c.Start(ctx); err != nil {
		return 0, 0, err
	}
	took := time.Since(start)
	groups, err := c.Store().ListGroups(ctx)
	return took, len(groups), err
}

// proxyStats is what one simulated proxy measured.
type proxyStats struct {
	grants    int
	latencies []time.Duration
	// sentAt is when each message was sent, after the start of the
	// measured window.
	sentAt []time.Duration
}

func run(ctx context.Context, o options, out io.Writer, log *slog.Logger) (result, error) {
	res := result{groups: o.groups, cpuPerGrant: math.NaN()}
	pid := 0
	if o.bin != "" {
		stop, p, err := spawn(ctx, &o)
		if err != nil {
			return res, err
		}
		defer stop()
		pid = p
	}
	conn, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return res, err
	}
	defer conn.Close()
	rg := pb.NewResourceGroupServiceClient(conn)
	names := make([]string, o.groups)
	for i := range names {
		names[i] = fmt.Sprintf("bench%04d", i)
	}
	createStart := time.Now()
	if err := createGroups(ctx, rg, names, o); err != nil {
		return res, err
	}
	log.Info("groups ready", "groups", o.groups, "proxies", o.proxies, "groups_per_message", o.perMsg, "parent_every", o.parentEvery,
		"created_in", time.Since(createStart).Round(time.Millisecond).String())

	// One connection per 20 proxies, as separate proxies would have their own.
	conns := make([]*grpc.ClientConn, (o.proxies+19)/20)
	for i := range conns {
		if conns[i], err = grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return res, err
		}
		defer conns[i].Close()
	}

	start := time.Now()
	measureFrom := start.Add(o.warmup)
	end := measureFrom.Add(o.duration)
	var cpu0 float64
	var cpuOnce sync.Once
	// Prometheus scrapes, and a proxy joining halfway, during the run.
	var side sync.WaitGroup
	var scrapes, scrapeAt []time.Duration
	var scrapeBytes int64
	if o.scrapeEvery > 0 {
		side.Add(1)
		go func() {
			defer side.Done()
			t := time.NewTicker(o.scrapeEvery)
			defer t.Stop()
			for ; time.Now().Before(end); <-t.C {
				at := time.Since(measureFrom)
				if d, n, err := scrape(o.statusAddr); err == nil {
					scrapes, scrapeBytes = append(scrapes, d), n
					scrapeAt = append(scrapeAt, at)
				} else {
					log.Warn("scrape", "err", err)
				}
			}
		}()
	}
	var joinTook time.Duration
	var joinGroups int
	var joinErr error
	if o.join {
		side.Add(1)
		go func() {
			defer side.Done()
			time.Sleep(time.Until(measureFrom.Add(o.duration / 2)))
			joinTook, joinGroups, joinErr = joinProxy(ctx, o.addr)
		}()
	}
	stats := make([]proxyStats, o.proxies)
	errs := make(chan error, o.proxies)
	var wg sync.WaitGroup
	for p := 0; p < o.proxies; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			var every time.Duration
			if o.rate > 0 {
				every = time.Duration(float64(time.Second) * float64(o.proxies*o.perMsg) / o.rate)
			}
			errs <- proxy(ctx, conns[p/20], p, names, o.perMsg, every, measureFrom, end, &stats[p], func() {
				cpuOnce.Do(func() { cpu0, _ = serverMetric(o.statusAddr, "process_cpu_seconds_total") })
			})
		}(p)
	}
	wg.Wait()
	cpu1, cpuErr := serverMetric(o.statusAddr, "process_cpu_seconds_total")
	side.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return res, err
		}
	}
	var all []time.Duration
	grants := 0
	for _, s := range stats {
		grants += s.grants
		all = append(all, s.latencies...)
	}
	if len(all) == 0 {
		return res, errors.New("no message answered in the measured window")
	}
	slices.Sort(all)
	pct := func(q float64) time.Duration { return all[min(len(all)-1, int(q*float64(len(all))))] }
	// When the slowest 1% were sent, by half second, beside when the
	// scrapes and the join began: what holds grants up.
	slowAt := map[time.Duration]int{}
	for _, s := range stats {
		for i, d := range s.latencies {
			if d >= pct(0.99) {
				slowAt[s.sentAt[i].Truncate(500*time.Millisecond)]++
			}
		}
	}
	secs := o.duration.Seconds()
	mode := "closed loop"
	if o.rate > 0 {
		mode = fmt.Sprintf("paced at %.0f group-grants/s", o.rate)
	}
	fmt.Fprintf(out, "proxies %d, groups %d, groups per message %d, %s, measured %v\n", o.proxies, o.groups, o.perMsg, mode, o.duration)
	fmt.Fprintf(out, "group-grants/s        %.0f\n", float64(grants)/secs)
	fmt.Fprintf(out, "messages/s            %.0f\n", float64(len(all))/secs)
	res.p50, res.p99, res.max = pct(0.50), pct(0.99), all[len(all)-1]
	fmt.Fprintf(out, "latency per message   p50 %v  p99 %v  max %v\n", res.p50, res.p99, res.max)
	if cpuErr == nil && cpu0 > 0 {
		res.cpuPerGrant = (cpu1 - cpu0) * 1e6 / float64(grants)
		fmt.Fprintf(out, "server CPU per grant  %.2f µs\n", res.cpuPerGrant)
	} else {
		fmt.Fprintf(out, "server CPU per grant  unknown (%v)\n", cpuErr)
	}
	if pid > 0 {
		rss, err1 := procStatus(pid, "VmRSS")
		hwm, err2 := procStatus(pid, "VmHWM")
		if err := errors.Join(err1, err2); err != nil {
			fmt.Fprintf(out, "server RSS            unknown (%v)\n", err)
		} else {
			res.rssPeak = hwm
			fmt.Fprintf(out, "server RSS            %.0f MiB at the end, peak %.0f MiB (%.1f KiB per group)\n", rss/(1<<20), hwm/(1<<20), hwm/1024/float64(o.groups))
		}
	} else if rss, err := serverMetric(o.statusAddr, "process_resident_memory_bytes"); err == nil {
		fmt.Fprintf(out, "server RSS            %.0f MiB at the end\n", rss/(1<<20))
	}
	if len(scrapes) > 0 {
		slices.Sort(scrapes)
		res.scrapes, res.slowestScrape = len(scrapes), scrapes[len(scrapes)-1]
		fmt.Fprintf(out, "/metrics scrape       %d scrapes, slowest %v, %d KiB gzip\n", len(scrapes), scrapes[len(scrapes)-1], scrapeBytes/1024)
	}
	var slow []string
	for _, at := range slices.Sorted(maps.Keys(slowAt)) {
		slow = append(slow, fmt.Sprintf("+%v (%d)", at, slowAt[at]))
	}
	var scr []string
	for _, at := range scrapeAt {
		scr = append(scr, fmt.Sprintf("+%v", at.Round(100*time.Millisecond)))
	}
	fmt.Fprintf(out, "slowest 1%% sent at   %s; scrapes began at %s", strings.Join(slow, " "), strings.Join(scr, " "))
	if o.join {
		fmt.Fprintf(out, "; the join at +%v", o.duration/2)
	}
	fmt.Fprintln(out)
	if o.join {
		if joinErr != nil {
			fmt.Fprintf(out, "joining proxy         failed: %v\n", joinErr)
		} else {
			fmt.Fprintf(out, "joining proxy         Watch snapshot of %d groups in %v\n", joinGroups, joinTook.Round(time.Millisecond))
		}
	}
	return res, nil
}

// proxy drives one stream until end, counting what is answered after
// measureFrom. With every > 0 it sends at most one message per every;
// otherwise the next as soon as the last is answered.
func proxy(ctx context.Context, conn *grpc.ClientConn, p int, names []string, perMsg int, every time.Duration, measureFrom, end time.Time, st *proxyStats, atMeasure func()) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := pb.NewTokenServiceClient(conn).AcquireTokens(ctx)
	if err != nil {
		return err
	}
	id := fmt.Sprintf("bench-proxy-%03d", p)
	next := (p * perMsg) % len(names)
	req := &pb.TokenRequest{ProxyId: id, Groups: make([]*pb.GroupTokenRequest, perMsg)}
	for i := range req.Groups {
		req.Groups[i] = &pb.GroupTokenRequest{TokensWanted: 100, DemandRuPerSec: 20, Consumption: &pb.Consumption{Rru: 50, Wru: 40, Statements: 10}}
	}
	// Stagger paced proxies so they do not all send at once.
	due := time.Now()
	if every > 0 {
		due = due.Add(time.Duration(p) * every / 200)
	}
	for n := uint64(1); ; n++ {
		if every > 0 {
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
			due = due.Add(every)
		}
		t := time.Now()
		if t.After(end) {
			return s.CloseSend()
		}
		req.RequestId = n
		for i := range req.Groups {
			req.Groups[i].Group = names[next]
			next = (next + 1) % len(names)
		}
		if err := s.Send(req); err != nil {
			return err
		}
		resp, err := s.Recv()
		if err != nil {
			return err
		}
		if resp.NotLeader != nil {
			return fmt.Errorf("not the leader; leader is %q", resp.NotLeader.LeaderAddr)
		}
		if !t.Before(measureFrom) {
			atMeasure()
			st.latencies = append(st.latencies, time.Since(t))
			st.sentAt = append(st.sentAt, t.Sub(measureFrom))
			for _, g := range resp.Grants {
				if g.Error == "" {
					st.grants++
				}
			}
		}
	}
}
