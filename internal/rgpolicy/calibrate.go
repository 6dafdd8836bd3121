package rgpolicy

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rgproxy/rgproxy/ru"
)

// CALIBRATE RESOURCE: the backend's capacity in RU/s.
//
// The capacity is RU per backend CPU-second times the CPUs the backend
// has. Both halves are measured where they can be:
//
//   - RU comes from the statement ledger only: settle and late add each
//     statement's RU once (ledger.go → calibTotals) beside the backend
//     CPU-seconds its CPU part was charged for in CPU-true mode
//     (ru.Consumption.CPUSeconds). The same figures ride with the
//     consumption reports into rgserver's usage history (figCPU), which
//     the window mode reads.
//   - Live (no START_TIME), with the backend on this host and its thread
//     read (CPU-true): a sampler reads, every second, the ledger's totals,
//     the host's busy and total CPU time (/proc/stat) and the backend
//     process's CPU time (/proc/<pid>/stat). On a host the backend shares
//     with rgproxy and the clients (as CPU-true mode's co-location
//     implies), the RU/s the backend reaches when the host is full is
//     RU/s ÷ the host's utilisation: the others keep their share per RU
//     as the load grows. Its CPUs are the host's (or fewer: its affinity,
//     its cgroup's quota), or --backend-cpus.
//   - Live elsewhere: utilisation is the ledger's backend CPU-seconds over
//     --backend-cpus.
//   - Window (START_TIME ...): the usage history's points; utilisation is
//     the points' backend CPU-seconds over the backend's CPUs.
//
// Each point with utilisation above 20% estimates RU/s ÷ utilisation; the
// top and bottom 10% are dropped and the rest averaged (TiDB's rule);
// fewer than two points is errCalibrateLow.

const (
	// calibRing is how many one-second samples the sampler keeps (an
	// hour: a window in it gets the host's utilisation at its seconds);
	// calibLive is the live answer's window.
	calibRing = 3600
	calibLive = 10 * time.Minute
	// calibEvery is the sampler's period; calibMetricsEvery how often the
	// capacity gauges are recomputed.
	calibEvery        = time.Second
	calibMetricsEvery = 10 * time.Second
	// calibMinUtil: points at or below this utilisation are too quiet to
	// tell (TiDB's 20%).
	calibMinUtil = 0.2
	// calibTrim is the share dropped at each end (TiDB's 10%).
	calibTrim = 0.1
	// clockTicks is the kernel's USER_HZ, the unit of /proc/stat and
	// /proc/<pid>/stat (100 on every Linux build rgproxy runs on).
	clockTicks = 100
)

var (
	// errCalibrateLow is TiDB's answer for a window too quiet to tell.
	errCalibrateLow = rgproxyError("rgproxy: CALIBRATE RESOURCE: the workload in the selected time window is too low to estimate the backend's capacity (fewer than 2 points with the backend's CPU above 20%); choose a window with more load, or run a heavier load and ask again")
	// errCalibrateCPUs: nothing says how many CPUs the backend has.
	errCalibrateCPUs = rgproxyError("rgproxy: CALIBRATE RESOURCE: the backend's CPUs cannot be read here (it is not on this host, or no session's backend thread was readable): set rgproxy's --backend-cpus to the backend host's CPUs")
	// errCalibrateFuture: a window that starts after now.
	errCalibrateFuture = rgproxyError("rgproxy: CALIBRATE RESOURCE: START_TIME is in the future")
)

// calibTotals are the ledger's running totals: RU (micro-RU) and the
// backend CPU-seconds charged (ns). Safe for concurrent use; no lock.
type calibTotals struct {
	microRU atomic.Int64
	cpuNs   atomic.Int64
}

// add counts one statement's cost (or a late part of it) once.
func (t *calibTotals) add(c ru.Consumption) {
	if r := c.RU(); r != 0 {
		t.microRU.Add(int64(math.Round(r * 1e6)))
	}
	if c.CPUSeconds != 0 {
		t.cpuNs.Add(int64(math.Round(c.CPUSeconds * 1e9)))
	}
}

// calibSample is one sampler reading; cumulative figures.
type calibSample struct {
	at        time.Time
	ru, cpu   float64 // the ledger's RU and backend CPU-seconds
	host      bool    // the host's and the backend's figures were read
	busy, all float64 // host CPU-seconds: busy, and busy + idle, over all CPUs
	hostCPUs  int
	backend   float64 // the backend process's CPU-seconds
	pid       int64
}

// calibrator keeps the samples and answers the live capacity.
type calibrator struct {
	procRoot, cgroupRoot string
	// flagCPUs is --backend-cpus (0: read them).
	flagCPUs float64
	totals   calibTotals

	mu    sync.Mutex
	ring  [calibRing]calibSample
	n     int // samples held
	next  int // where the next goes
	gauge struct{ capacity, limits, over prometheus.Gauge }
	// last is the last capacity check (refreshCapacity).
	last atomic.Pointer[capacityStatus]
}

func newCalibrator(procRoot string, backendCPUs float64, reg prometheus.Registerer) (*calibrator, error) {
	c := &calibrator{procRoot: procRoot, cgroupRoot: "/sys/fs/cgroup", flagCPUs: backendCPUs}
	c.gauge.capacity = prometheus.NewGauge(prometheus.GaugeOpts{Name: "rgproxy_backend_capacity_ru_per_second",
		Help: "The backend's capacity in RU/s as CALIBRATE RESOURCE answers it live (the last 10 minutes, TiDB's rule); 0 while the load is too low to tell."})
	c.gauge.limits = prometheus.NewGauge(prometheus.GaugeOpts{Name: "rgproxy_resource_groups_ru_per_second",
		Help: "The sum of the resource groups' RU_PER_SEC (UNLIMITED groups left out)."})
	c.gauge.over = prometheus.NewGauge(prometheus.GaugeOpts{Name: "rgproxy_resource_groups_over_capacity",
		Help: "1 when the groups' RU_PER_SEC add up to more than the backend's capacity (rgproxy_backend_capacity_ru_per_second, when known), else 0."})
	if reg != nil {
		for _, g := range []prometheus.Gauge{c.gauge.capacity, c.gauge.limits, c.gauge.over} {
			if err := reg.Register(g); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// sample takes one reading at now; pid is the backend's process (0:
// unknown). Called by the sampler's goroutine only.
func (c *calibrator) sample(now time.Time, pid int64) {
	s := calibSample{at: now, ru: float64(c.totals.microRU.Load()) / 1e6, cpu: float64(c.totals.cpuNs.Load()) / 1e9, pid: pid}
	if pid > 0 {
		busy, all, n, err1 := readHostCPU(c.procRoot)
		be, err2 := readProcessCPU(c.procRoot, pid)
		if err1 == nil && err2 == nil {
			s.host, s.busy, s.all, s.hostCPUs, s.backend = true, busy, all, n, be
		}
	}
	c.mu.Lock()
	c.ring[c.next] = s
	c.next = (c.next + 1) % calibRing
	c.n = min(c.n+1, calibRing)
	c.mu.Unlock()
}

// samples returns the samples held, oldest first.
func (c *calibrator) samples() []calibSample {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]calibSample, 0, c.n)
	for i := range c.n {
		out = append(out, c.ring[(c.next-c.n+i+calibRing)%calibRing])
	}
	return out
}

// capacity is an answer and its basis.
type capacity struct {
	quota  float64
	points int
	// ruPerCPU is RU per backend CPU-second; cpus the CPUs the answer
	// gives the backend.
	ruPerCPU, cpus float64
	basis          string
}

// tidbRule: sorted estimates, the top and bottom 10% dropped, the rest
// averaged; fewer than two is errCalibrateLow.
func tidbRule(est []float64) (float64, error) {
	if len(est) < 2 {
		return 0, errCalibrateLow
	}
	slices.Sort(est)
	cut := int(float64(len(est)) * calibTrim)
	kept := est[cut : len(est)-cut]
	sum := 0.0
	for _, v := range kept {
		sum += v
	}
	return sum / float64(len(kept)), nil
}

// live answers the capacity from the samples.
func (c *calibrator) live(now time.Time) (capacity, error) {
	ss := c.samples()
	for len(ss) > 0 && ss[0].at.Before(now.Add(-calibLive)) {
		ss = ss[1:]
	}
	var est []float64
	var sRU, sBackend, sBusy, sCPU, sAll float64
	hostCPUs, pid := 0, int64(0)
	cpus, cpusWhy, cpusErr := 0.0, "", error(nil)
	for i := 1; i < len(ss); i++ {
		a, b := &ss[i-1], &ss[i]
		dt := b.at.Sub(a.at).Seconds()
		dRU := b.ru - a.ru
		if dt <= 0 || dRU <= 0 {
			continue
		}
		if a.host && b.host && a.pid == b.pid {
			busy, all, be := b.busy-a.busy, b.all-a.all, b.backend-a.backend
			if all <= 0 || busy <= 0 || be < 0 {
				continue
			}
			if pid != b.pid {
				pid, hostCPUs = b.pid, b.hostCPUs
				cpus, cpusWhy, cpusErr = c.backendCPUs(b.pid, b.hostCPUs)
			}
			util := busy / all
			if cpusErr != nil || util <= calibMinUtil {
				continue
			}
			// The host full in the same mix, then scaled to the CPUs
			// the backend may use.
			est = append(est, dRU/dt/util*cpus/float64(b.hostCPUs))
			sRU, sBackend, sBusy, sAll = sRU+dRU, sBackend+be, sBusy+busy, sAll+all
			continue
		}
		// Not co-located: the ledger's CPU-true seconds over the CPUs
		// the flag names.
		dCPU := b.cpu - a.cpu
		if c.flagCPUs <= 0 {
			cpusErr = errCalibrateCPUs
			continue
		}
		cpus, cpusWhy = c.flagCPUs, "--backend-cpus"
		if dCPU <= 0 {
			continue
		}
		util := dCPU / dt / cpus
		if util <= calibMinUtil {
			continue
		}
		est = append(est, dRU/dCPU*cpus)
		sRU, sCPU = sRU+dRU, sCPU+dCPU
	}
	quota, err := tidbRule(est)
	if err != nil {
		if len(est) == 0 && cpusErr != nil {
			return capacity{}, cpusErr
		}
		return capacity{}, err
	}
	out := capacity{quota: quota, points: len(est), cpus: cpus}
	if sBusy > 0 {
		share := sBackend / sBusy
		ruPerCPU := 0.0
		if sBackend > 0 {
			ruPerCPU = sRU / sBackend
		}
		out.ruPerCPU = ruPerCPU
		out.basis = fmt.Sprintf("live, %d one-second points of the last 10 min with the host's CPU above 20%%, top and bottom 10%% dropped; "+
			"the backend (pid %d) is on this host of %d CPUs and may use %s (%s) and took %.0f%% of the host's busy CPU: "+
			"RU/s over the host's utilisation (its CPUs shared with rgproxy and the clients in the measured mix, the host's utilisation %.0f%%); "+
			"%.1f RU per backend CPU-second; with its CPUs to itself it would reach about %.0f RU/s",
			len(est), pid, hostCPUs, trimFloat(cpus), cpusWhy, 100*share, 100*sBusy/sAll, ruPerCPU, ruPerCPU*cpus)
		return out, nil
	}
	if sCPU > 0 {
		out.ruPerCPU = sRU / sCPU
	}
	out.basis = fmt.Sprintf("live, %d one-second points of the last 10 min with the backend's CPU above 20%% of %s CPUs (--backend-cpus), top and bottom 10%% dropped; "+
		"%.1f RU per backend CPU-second of CPU-true statements (the ledger's)", len(est), trimFloat(cpus), out.ruPerCPU)
	return out, nil
}

// hostUtil is the host's utilisation per interval of gran (by its start,
// unix seconds) over the samples, where the samples cover at least half
// of the interval and the backend was read; the host's CPUs; and the
// first interval the samples reach (intervals from it on that have no
// utilisation are left out rather than estimated otherwise).
func (c *calibrator) hostUtil(gran time.Duration) (map[int64]float64, int, int64) {
	ss := c.samples()
	first := int64(math.MaxInt64)
	type acc struct{ busy, all, dt float64 }
	by := map[int64]*acc{}
	cpus := 0
	for i := 1; i < len(ss); i++ {
		a, b := &ss[i-1], &ss[i]
		dt := b.at.Sub(a.at).Seconds()
		if !a.host || !b.host || a.pid != b.pid || dt <= 0 || b.all <= a.all {
			continue
		}
		k := b.at.Add(-time.Nanosecond).Truncate(gran).Unix()
		x := by[k]
		if x == nil {
			x = &acc{}
			by[k] = x
		}
		x.busy, x.all, x.dt = x.busy+b.busy-a.busy, x.all+b.all-a.all, x.dt+dt
		cpus, first = b.hostCPUs, min(first, k)
	}
	out := make(map[int64]float64, len(by))
	for k, x := range by {
		if x.dt >= gran.Seconds()/2 {
			out[k] = x.busy / x.all
		}
	}
	return out, cpus, first
}

// backendCPUs are the CPUs the backend process may use: --backend-cpus,
// else the fewest of the host's, its affinity and its cgroup's quota.
func (c *calibrator) backendCPUs(pid int64, hostCPUs int) (float64, string, error) {
	if c.flagCPUs > 0 {
		return c.flagCPUs, "--backend-cpus", nil
	}
	if hostCPUs <= 0 {
		return 0, "", errCalibrateCPUs
	}
	cpus, why := float64(hostCPUs), "the host's"
	if n, err := readAffinity(c.procRoot, pid); err == nil && n > 0 && float64(n) < cpus {
		cpus, why = float64(n), "its CPU affinity"
	}
	if q, err := readCgroupQuota(c.procRoot, c.cgroupRoot, pid); err == nil && q > 0 && q < cpus {
		cpus, why = q, "its cgroup's cpu.max"
	}
	return cpus, why, nil
}

// readHostCPU reads /proc/stat's first line: busy and all CPU-seconds
// over every CPU, and how many CPUs it lists.
func readHostCPU(root string) (busy, all float64, cpus int, err error) {
	b, err := os.ReadFile(filepath.Join(root, "stat"))
	if err != nil {
		return 0, 0, 0, err
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		if f[0] != "cpu" {
			cpus++
			continue
		}
		// user nice system idle iowait irq softirq steal (guest is in user).
		if len(f) < 9 {
			return 0, 0, 0, errors.New("rgpolicy: /proc/stat: short cpu line")
		}
		var v [8]float64
		for i := range v {
			x, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return 0, 0, 0, fmt.Errorf("rgpolicy: /proc/stat: %w", err)
			}
			v[i] = float64(x) / clockTicks
		}
		busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
		all = busy + v[3] + v[4]
	}
	if all <= 0 || cpus == 0 {
		return 0, 0, 0, errors.New("rgpolicy: /proc/stat: no cpu lines")
	}
	return busy, all, cpus, nil
}

// readProcessCPU reads a process's user + system CPU-seconds
// (/proc/<pid>/stat's 14th and 15th fields).
func readProcessCPU(root string, pid int64) (float64, error) {
	b, err := os.ReadFile(filepath.Join(root, strconv.FormatInt(pid, 10), "stat"))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')') // comm may hold spaces and parentheses
	if i < 0 {
		return 0, errors.New("rgpolicy: process stat: no comm")
	}
	f := strings.Fields(string(b[i+1:]))
	// After comm: state is field 3, utime 14, stime 15.
	if len(f) < 13 {
		return 0, errors.New("rgpolicy: process stat: short")
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("rgpolicy: process stat: bad times")
	}
	return float64(u+s) / clockTicks, nil
}

// readAffinity counts the CPUs in /proc/<pid>/status's Cpus_allowed_list.
func readAffinity(root string, pid int64) (int, error) {
	b, err := os.ReadFile(filepath.Join(root, strconv.FormatInt(pid, 10), "status"))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		v, ok := strings.CutPrefix(line, "Cpus_allowed_list:")
		if !ok {
			continue
		}
		return countCPUList(strings.TrimSpace(v))
	}
	return 0, errors.New("rgpolicy: no Cpus_allowed_list")
}

// countCPUList counts a list such as "0-3,8,10-11".
func countCPUList(s string) (int, error) {
	n := 0
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0, fmt.Errorf("rgpolicy: CPU list %q: %w", s, err)
		}
		z := a
		if isRange {
			if z, err = strconv.Atoi(hi); err != nil || z < a {
				return 0, fmt.Errorf("rgpolicy: CPU list %q", s)
			}
		}
		n += z - a + 1
	}
	return n, nil
}

// readCgroupQuota reads the CPUs the process's cgroup (v2) allows:
// cpu.max's quota over its period; 0 with no quota.
func readCgroupQuota(procRoot, cgroupRoot string, pid int64) (float64, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.FormatInt(pid, 10), "cgroup"))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		path, ok := strings.CutPrefix(strings.TrimSpace(line), "0::")
		if !ok {
			continue
		}
		if strings.Contains(path, "..") {
			return 0, errors.New("rgpolicy: cgroup path")
		}
		// The cgroup and its parents: the tightest quota holds.
		best := 0.0
		for p := path; ; p = filepath.Dir(p) {
			if q := cpuMax(filepath.Join(cgroupRoot, p, "cpu.max")); q > 0 && (best == 0 || q < best) {
				best = q
			}
			if p == "/" || p == "." || p == "" {
				break
			}
		}
		return best, nil
	}
	return 0, nil
}

// cpuMax reads a cgroup's cpu.max ("quota period" or "max period").
func cpuMax(file string) float64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] == "max" {
		return 0
	}
	q, err1 := strconv.ParseFloat(f[0], 64)
	p, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || p <= 0 || q <= 0 {
		return 0
	}
	return q / p
}

// trimFloat prints a CPU count without needless decimals.
func trimFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
