package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// isolationReport is what `bench-isolation --json` prints for one kind.
type isolationReport struct {
	CPUSource string    `json:"cpu_source"`
	SleepCPU  float64   `json:"sleep_1s_cpu_ru"`
	SleepRuns []float64 `json:"sleep_1s_cpu_ru_runs"`
	Results   []struct {
		DirectAlone    float64   `json:"direct_alone_p99_ms"`
		DirectBeside   float64   `json:"direct_beside_p99_ms"`
		ProxyAlone     float64   `json:"proxy_alone_p99_ms"`
		ProxyBeside    float64   `json:"proxy_beside_p99_ms"`
		Throttled      float64   `json:"throttled_p99_ms"`
		ProxyWindow    float64   `json:"proxy_beside_window_p99_ms"`
		VictimErrors   int64     `json:"victim_errors"`
		AggressorRU    float64   `json:"aggressor_ru"`
		AggressorLimit float64   `json:"aggressor_limit"`
		AggressorOver  float64   `json:"aggressor_over"`
		AggressorWait  float64   `json:"aggressor_waited_s"`
		OneAlone       float64   `json:"one_alone_ru"`
		OneBeside      float64   `json:"one_beside_ru"`
		OneRatio       float64   `json:"one_ratio"`
		OneRatioRounds []float64 `json:"one_ratio_rounds"`
		OneAloneWall   float64   `json:"one_alone_wall_ms"`
		OneBesideWall  float64   `json:"one_beside_wall_ms"`
		OneWallRatio   float64   `json:"one_wall_ratio"`
	} `json:"results"`
}

// TestNoisyNeighbourIsolation runs the noisy-neighbour experiment of `make
// bench-isolation` (cmd/bench-isolation) briefly: 8 sessions repeating a
// CPU-bound full scan in a group of 100 RU/s beside a victim's paced point
// selects. Through rgproxy the aggressor's group stays within ±10% of
// RU_PER_SEC × T + capacity over 30 s; the victim's p99 stays within 2× of
// its p99 alone (a loose bound for a noisy CI; the benchmark carries the
// tight target) and keeps at most a quarter of the slowdown the unthrottled
// aggressor causes it; rgproxy runs in CPU-true mode beside this MariaDB,
// where SELECT SLEEP(1) costs almost no CPU (under 1% of its wall time's
// RU) and a scan costs about the same beside 8 copies of itself as alone,
// although its wall time (what wall-time metering would charge) grows
// several times: time queued behind other sessions is not charged (the
// RU's ratio stays under half the wall time's, see below). The scan's own
// CPU time spreads over ±30% from one run to the next on a shared 2-vCPU
// VM, busy or not (one run read 1.42× comparing one batch of 5 alone with
// the next batch of 5 beside), so that ratio is the median of 5 short
// rounds that each measure alone, then beside.
//
// The latency bounds compare p99s of 0.3–0.7 ms on a shared 2-core
// machine, where one CI run read 2.05× while the share of the unthrottled
// slowdown was 17%: when only they fail, the experiment runs once more and
// the second run must hold them. On a machine less than half idle before
// the experiment (both cores busy with other work) they are logged, not
// checked: see the bounds below. Metering and CPU checks get one run.
func TestNoisyNeighbourIsolation(t *testing.T) {
	for attempt := 1; ; attempt++ {
		latency := isolationOnce(t)
		if t.Failed() || len(latency) == 0 {
			return
		}
		if attempt == 2 {
			for _, msg := range latency {
				t.Error(msg)
			}
			return
		}
		t.Logf("latency bound missed, running the experiment once more: %s", strings.Join(latency, "; "))
	}
}

// throttledPhase is how long bench-isolation runs the victim beside the
// aggressor in one continuous phase.
const throttledPhase = 30 * time.Second

// isolationOnce runs bench-isolation once, fails t on what one run must
// show, and returns the latency bounds it missed.
func isolationOnce(t *testing.T) (latency []string) {
	t.Helper()
	idle := machineIdle(t, time.Second)
	busy := idle < 0.5
	out, err := exec.Command(filepath.Join(binDir, "bench-isolation"), "--bin-dir", binDir, "--backend", backendAddr,
		"--phase", "8s", "--rounds", "1", "--one-rounds", "5", "--throttled", throttledPhase.String(), "--kinds", "scan", "--json").Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("bench-isolation: %v\n%s", err, stderr)
	}
	var rep isolationReport
	if err := json.Unmarshal(out, &rep); err != nil || len(rep.Results) != 1 {
		t.Fatalf("bench-isolation output %q: %v", out, err)
	}
	r := rep.Results[0]
	t.Logf("cpu source %s; SLEEP(1) %.3f RU of CPU (runs %.3f); victim p99 direct %.2f → %.2f ms, through rgproxy %.2f → %.2f ms "+
		"(continuous 30 s phase %.2f ms, median of its 8 s windows %.2f ms); "+
		"aggressor %.0f RU for %.0f (%+.1f%%); one scan %.1f RU alone, %.1f beside 8 copies (%.2f×, by round %.2f), "+
		"its wall time %.0f → %.0f ms (%.1f×)",
		rep.CPUSource, rep.SleepCPU, rep.SleepRuns, r.DirectAlone, r.DirectBeside, r.ProxyAlone, r.ProxyBeside, r.Throttled, r.ProxyWindow,
		r.AggressorRU, r.AggressorLimit, 100*r.AggressorOver, r.OneAlone, r.OneBeside, r.OneRatio, r.OneRatioRounds,
		r.OneAloneWall, r.OneBesideWall, r.OneWallRatio)
	if rep.CPUSource != "proc" {
		t.Errorf("rgproxy beside its backend uses %q, want CPU-true (proc)", rep.CPUSource)
	}
	// Wall time would charge SLEEP(1) its second: 333 RU at 1 RU per 3
	// ms. Its CPU is its parsing and answering, 0.05–0.3 RU here, but a
	// thread's CPU time on a VM also holds what ran in its stead while it
	// was on the CPU (this kernel does not account interrupt time apart:
	// CONFIG_IRQ_TIME_ACCOUNTING is unset), and a CI run read 1.075 RU
	// (3.2 ms) once. So the bound is 1% of the wall-time charge: it tells
	// CPU-true from wall time a hundred times over, not a quiet VM from a
	// noisy one.
	if wallRU := 1000.0 / 3; rep.SleepCPU >= wallRU/100 {
		t.Errorf("SELECT SLEEP(1) charged %.3f RU of CPU (runs %.3f), want under 1%% of the %.0f RU its wall time costs",
			rep.SleepCPU, rep.SleepRuns, wallRU)
	}
	// Over its limit never (+10%: the first statements' estimates). Under
	// it by little when it was held back by the limit: on an idle machine
	// it reads within a few percent; with both cores busy beside the test
	// its heavy statements take seconds each and come in bursts, and a
	// bucket that holds one second of RU_PER_SEC loses what fills while
	// all 8 sessions run (-12.6% with its statements waiting 94 s in
	// all), so the bound below is a quarter under the limit, which still
	// catches a limiter that hands out half. When its statements hardly
	// waited (2,652 RU of 3,638 once), the machine could not run it as
	// fast as its limit lets it, and the figure says nothing of the limit.
	limited := r.AggressorWait >= 0.25*throttledPhase.Seconds()
	if r.AggressorOver > 0.10 || (limited && r.AggressorOver < -0.25) {
		t.Errorf("the heavy group consumed %.0f RU for a limit of %.0f (%+.1f%%), its statements waiting %.1f s in all, want -25%% to +10%%",
			r.AggressorRU, r.AggressorLimit, 100*r.AggressorOver, r.AggressorWait)
	} else if !limited {
		t.Logf("the aggressor's statements waited %.1f s in all over the %v phase: it ran below its limit (%+.1f%%), which says nothing of the limit",
			r.AggressorWait, throttledPhase, 100*r.AggressorOver)
	}
	if r.VictimErrors != 0 {
		t.Errorf("victim errors: %d", r.VictimErrors)
	}
	if r.OneWallRatio < 2 {
		t.Errorf("one scan's wall time beside 8 copies %.1f× alone: the copies did not load the backend, the RU check measures nothing", r.OneWallRatio)
	}
	// What CPU-true RU must not do is charge the time a statement queued
	// behind the backend's load: that reads the wall time's ratio (4-6.5×
	// here). Its own CPU time is noisy on this VM whatever runs beside it:
	// alone, one scan read 47-62 RU from one batch to the next, and beside
	// 8 sessions that only SLEEP (no load at all) 0.80-1.29× alone; the
	// VM has steal time (about 1% on average, in bursts), and a vCPU the
	// host takes away while the scan runs counts as the scan's CPU time in
	// the guest. One CI run read rounds of 0.92 0.89 1.64 1.57 1.47 (median
	// 1.47) with the wall time 6.5×. So the bound is half the wall time's
	// ratio, and 2× at most.
	if r.OneRatio > 2 || r.OneRatio > r.OneWallRatio/2 {
		t.Errorf("one scan cost %.2f× its RU alone beside 8 copies (median of rounds %.2f; %.1f RU beside, %.1f alone) while its wall time went %.1f×: "+
			"CPU-true RU must not charge time queued behind the backend's load (want at most 2× and half the wall time's ratio)",
			r.OneRatio, r.OneRatioRounds, r.OneBeside, r.OneAlone, r.OneWallRatio)
	}
	unprotected := r.DirectBeside - r.DirectAlone
	if unprotected <= 0 {
		t.Errorf("the unthrottled aggressor did not slow the victim (direct p99 %.2f → %.2f ms): the experiment measures nothing", r.DirectAlone, r.DirectBeside)
		return nil
	}
	// The victim's 8 s alone and its 8 s beside the aggressor (after the
	// aggressor's 2 s warm-up, in which its group spends the capacity it
	// saved while idle) follow each other, so the machine's drift between
	// phases stays out of the ratio.
	//
	// Beside the throttled aggressor the victim ran twice: in that paired
	// 8 s phase and in the continuous 30 s phase. The bounds take the lower
	// of the two p99s. One second's p99 on this 2-core machine spreads over
	// 0.9–3.2 ms beside a throttled aggressor, and over 1.5–4.2 ms beside
	// the same statement paced by hand at the group's rate, one at a time
	// (the control: what a perfect limiter gives); an 8 s phase's p99 is
	// its worst second or two, so one phase read 2.07 ms beside 0.54 alone
	// on an idle CI machine while the 30 s phase of the same run read 0.79.
	// A limiter that let the aggressor's sessions run together would raise
	// both phases alike.
	//
	// The absolute bound (2× alone) holds where the backend has CPU to
	// spare beyond the aggressor's limit. With both cores taken by other
	// work the same RU_PER_SEC takes a larger share of what is left, and
	// only the bound against the unthrottled aggressor, measured in the
	// same conditions, means anything (23 ms against 3 ms alone, with
	// stress-ng --cpu 2 beside the test, while the direct aggressor added
	// 144 ms).
	beside, which := r.ProxyBeside, "paired 8 s phase"
	if r.Throttled > 0 && r.Throttled < beside {
		beside, which = r.Throttled, "continuous 30 s phase"
	}
	if beside > 2*r.ProxyAlone {
		msg := fmt.Sprintf("victim p99 through rgproxy %.2f ms beside the aggressor (%s; the other phase %.2f, %.2f), %.2f ms alone: more than 2×",
			beside, which, r.ProxyBeside, r.Throttled, r.ProxyAlone)
		if busy {
			t.Logf("%s (the machine was %.0f%% idle before the experiment: not checked)", msg, 100*idle)
		} else {
			latency = append(latency, msg)
		}
	}
	// The quarter bound holds on a machine with CPU to spare. RU_PER_SEC
	// in CPU-true mode is a fixed amount of the backend's CPU time a
	// second; with both cores taken by other work the backend gets less
	// of them, so the aggressor's fixed share of it is a larger part of
	// what is left, while the unthrottled aggressor can take no more than
	// the backend gets: with stress-ng --cpu 2 beside make test one run
	// read +27 ms against +38 ms, its rerun +40 against +65 (another day
	// +23 against +144). Neither bound means anything then: logged, not
	// checked, as the 2× above.
	if protected := beside - r.ProxyAlone; protected > unprotected/4 {
		msg := fmt.Sprintf("victim p99 through rgproxy +%.2f ms beside the throttled aggressor (%s), more than a quarter of the +%.2f ms the unthrottled one causes directly",
			protected, which, unprotected)
		if busy {
			t.Logf("%s (the machine was %.0f%% idle before the experiment: not checked)", msg, 100*idle)
		} else {
			latency = append(latency, msg)
		}
	}
	return latency
}

// TestStatementsSummary: information_schema.statements_summary lists the
// shapes the proxy saw, literals replaced; ordered by MAX_REQUEST_UNIT_READ
// the heavy one comes first; a user without SUPER sees only its own group's.
func TestStatementsSummary(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts)
	appUser(t, "sumuser")
	adminExec(t, px.Addr, "DROP RESOURCE GROUP IF EXISTS rg_sum", "CREATE RESOURCE GROUP rg_sum RU_PER_SEC = 100000",
		"ALTER USER 'sumuser'@'%' RESOURCE GROUP rg_sum")
	rootExec(t, "DROP TABLE IF EXISTS rgproxy_e2e.sum_t",
		"CREATE TABLE rgproxy_e2e.sum_t (id INT PRIMARY KEY, c CHAR(100))",
		"INSERT INTO rgproxy_e2e.sum_t SELECT seq, MD5(seq) FROM rgproxy_e2e.seq_1_to_50000")
	root := openDB(t, px.Addr)
	for i := 0; i < 20; i++ {
		var c string
		if err := root.QueryRow("SELECT c FROM sum_t WHERE id = ?", i+1).Scan(&c); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		var n int
		if err := root.QueryRow("SELECT COUNT(*) FROM sum_t WHERE c LIKE '%ab%cd%'").Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	app := openDB(t, px.Addr, "user=sumuser", "password=apppw")
	app.Exec("SELECT 1")

	var group, digest, text string
	var count int
	var maxRRU float64
	err := root.QueryRow("SELECT RESOURCE_GROUP, DIGEST, DIGEST_TEXT, EXEC_COUNT, MAX_REQUEST_UNIT_READ FROM information_schema.statements_summary "+
		"ORDER BY MAX_REQUEST_UNIT_READ DESC LIMIT 1").Scan(&group, &digest, &text, &count, &maxRRU)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("heaviest shape: %s %s %q ×%d, max %.2f RRU", group, digest, text, count, maxRRU)
	if group != "default" || !strings.Contains(text, "LIKE ?") || strings.Contains(text, "ab%cd") || count != 3 {
		t.Fatalf("heaviest shape %s %q ×%d, want the LIKE scan, literals replaced, 3 executions", group, text, count)
	}
	// The point select: one shape for 20 statements with different literals.
	var points int
	if err := root.QueryRow("SELECT EXEC_COUNT FROM information_schema.statements_summary WHERE DIGEST_TEXT LIKE 'SELECT c FROM sum_t WHERE id = ?'").Scan(&points); err != nil || points != 20 {
		t.Fatalf("point select shape: %d executions, %v", points, err)
	}
	// Without SUPER: only its own group's shapes.
	var groups string
	if err := app.QueryRow("SELECT GROUP_CONCAT(DISTINCT RESOURCE_GROUP) FROM information_schema.statements_summary").Scan(&groups); err != nil || groups != "rg_sum" {
		t.Fatalf("a user without SUPER sees groups %q (%v), want only rg_sum", groups, err)
	}
}

// machineIdle is the share of the machine's CPU time that was idle over
// the next d, from /proc/stat.
func machineIdle(t *testing.T, d time.Duration) float64 {
	t.Helper()
	read := func() (idle, total float64) {
		b, err := os.ReadFile("/proc/stat")
		if err != nil {
			t.Fatal(err)
		}
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
		for i, v := range f[1:] {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("/proc/stat: %q", line)
			}
			total += n
			if i == 3 || i == 4 { // idle, iowait
				idle += n
			}
		}
		return idle, total
	}
	i0, t0 := read()
	time.Sleep(d)
	i1, t1 := read()
	if t1 <= t0 {
		return 1
	}
	return (i1 - i0) / (t1 - t0)
}
