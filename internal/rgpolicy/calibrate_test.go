package rgpolicy

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/ru"
)

func TestTiDBRule(t *testing.T) {
	tests := []struct {
		est  []float64
		want float64
		err  bool
	}{
		{nil, 0, true},
		{[]float64{100}, 0, true},
		{[]float64{100, 200}, 150, false},
		// Ten points: the lowest and the highest dropped.
		{[]float64{1, 100, 100, 100, 100, 100, 100, 100, 100, 10000}, 100, false},
		// Twenty: two dropped at each end.
		{[]float64{0, 0, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 99, 99}, 10, false},
	}
	for _, tt := range tests {
		got, err := tidbRule(append([]float64(nil), tt.est...))
		if (err != nil) != tt.err || math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("tidbRule(%v) = %v, %v; want %v (error %v)", tt.est, got, err, tt.want, tt.err)
		}
		if tt.err && !errors.Is(err, errCalibrateLow) {
			t.Errorf("tidbRule(%v) error %v, want errCalibrateLow", tt.est, err)
		}
	}
}

// calibProc is a proc (and cgroup) tree for the sampler: the host's
// /proc/stat and a backend process 42's stat, status and cgroup.
type calibProc struct {
	t                *testing.T
	proc, cgroup     string
	busy, idle, back float64 // ticks
}

func newCalibProc(t *testing.T, affinity, cpuMax string) *calibProc {
	f := &calibProc{t: t, proc: t.TempDir(), cgroup: t.TempDir(), idle: 1000}
	f.write(filepath.Join(f.proc, "42", "status"), "Name:\tmariadbd\nCpus_allowed_list:\t"+affinity+"\n")
	f.write(filepath.Join(f.proc, "42", "cgroup"), "0::/db.slice\n")
	f.write(filepath.Join(f.cgroup, "db.slice", "cpu.max"), cpuMax+"\n")
	f.flush()
	return f
}

func (f *calibProc) write(path, text string) {
	f.t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// flush writes the counters: user carries busy, idle idle; the backend's
// utime its ticks.
func (f *calibProc) flush() {
	f.write(filepath.Join(f.proc, "stat"), fmt.Sprintf("cpu  %.0f 0 0 %.0f 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\nintr 1\n", f.busy, f.idle))
	f.write(filepath.Join(f.proc, "42", "stat"), fmt.Sprintf("42 (mariadbd (x)) S 1 1 1 0 -1 0 0 0 0 0 %.0f 0 0 0 20 0 1 0\n", f.back))
}

func TestCalibrateLive(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	run := func(c *calibrator, f *calibProc, seconds int, ruPerSec, hostUtil, backendShare float64, pid int64) time.Time {
		now := t0
		for i := range seconds + 1 {
			now = t0.Add(time.Duration(i) * time.Second)
			if f != nil {
				f.flush()
			}
			c.sample(now, pid)
			c.totals.add(ru.Consumption{RRU: ruPerSec, CPUSeconds: ruPerSec / 1000})
			if f != nil {
				// 2 CPUs: 200 ticks a second.
				f.busy += 200 * hostUtil
				f.idle += 200 * (1 - hostUtil)
				f.back += 200 * hostUtil * backendShare
			}
		}
		return now
	}
	t.Run("co-located", func(t *testing.T) {
		f := newCalibProc(t, "0-1", "max 100000")
		c, _ := newCalibrator(f.proc, 0, nil)
		c.cgroupRoot = f.cgroup
		now := run(c, f, 30, 500, 0.5, 0.4, 42)
		got, err := c.live(now)
		if err != nil {
			t.Fatal(err)
		}
		// 500 RU/s at half the host: 1,000 RU/s when it is full.
		if math.Abs(got.quota-1000) > 1 || got.points != 30 || got.cpus != 2 {
			t.Errorf("live = %+v, want 1000 RU/s over 30 points and 2 CPUs", got)
		}
		// The backend took 40% of 1 busy CPU-second: 500 / 0.4.
		if math.Abs(got.ruPerCPU-1250) > 1 {
			t.Errorf("RU per backend CPU-second = %v, want 1250", got.ruPerCPU)
		}
	})
	t.Run("cgroup quota", func(t *testing.T) {
		f := newCalibProc(t, "0-1", "50000 100000")
		c, _ := newCalibrator(f.proc, 0, nil)
		c.cgroupRoot = f.cgroup
		now := run(c, f, 30, 500, 0.5, 0.4, 42)
		got, err := c.live(now)
		if err != nil || math.Abs(got.quota-250) > 1 || got.cpus != 0.5 {
			t.Errorf("live = %+v, %v; want 250 RU/s at 0.5 CPUs (cpu.max)", got, err)
		}
	})
	t.Run("affinity", func(t *testing.T) {
		f := newCalibProc(t, "1", "max 100000")
		c, _ := newCalibrator(f.proc, 0, nil)
		c.cgroupRoot = f.cgroup
		now := run(c, f, 30, 500, 0.5, 0.4, 42)
		if got, err := c.live(now); err != nil || math.Abs(got.quota-500) > 1 || got.cpus != 1 {
			t.Errorf("live = %+v, %v; want 500 RU/s at 1 CPU (affinity)", got, err)
		}
	})
	t.Run("too quiet", func(t *testing.T) {
		f := newCalibProc(t, "0-1", "max 100000")
		c, _ := newCalibrator(f.proc, 0, nil)
		now := run(c, f, 30, 500, 0.15, 0.4, 42)
		if _, err := c.live(now); !errors.Is(err, errCalibrateLow) {
			t.Errorf("live at 15%% = %v, want errCalibrateLow", err)
		}
	})
	t.Run("remote without flag", func(t *testing.T) {
		c, _ := newCalibrator(t.TempDir(), 0, nil)
		now := run(c, nil, 30, 500, 0, 0, 0)
		if _, err := c.live(now); !errors.Is(err, errCalibrateCPUs) {
			t.Errorf("live = %v, want errCalibrateCPUs (--backend-cpus)", err)
		}
	})
	t.Run("remote with flag", func(t *testing.T) {
		c, _ := newCalibrator(t.TempDir(), 1, nil)
		// 500 RU/s with 0.5 CPU-seconds a second: 1,000 RU per CPU-second
		// on 1 CPU.
		now := run(c, nil, 30, 500, 0, 0, 0)
		if got, err := c.live(now); err != nil || math.Abs(got.quota-1000) > 1 {
			t.Errorf("live = %+v, %v; want 1000 RU/s", got, err)
		}
	})
	t.Run("old samples left out", func(t *testing.T) {
		c, _ := newCalibrator(t.TempDir(), 1, nil)
		now := run(c, nil, 30, 500, 0, 0, 0)
		if _, err := c.live(now.Add(calibLive + time.Minute)); !errors.Is(err, errCalibrateLow) {
			t.Errorf("live 11 min later = %v, want errCalibrateLow", err)
		}
	})
}

func TestCountCPUList(t *testing.T) {
	for in, want := range map[string]int{"0": 1, "0-3": 4, "0-3,8,10-11": 7} {
		if got, err := countCPUList(in); err != nil || got != want {
			t.Errorf("countCPUList(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "3-1", "1-"} {
		if _, err := countCPUList(bad); err == nil {
			t.Errorf("countCPUList(%q) accepted", bad)
		}
	}
}

func TestCalibTotalsCountOnce(t *testing.T) {
	var tt calibTotals
	tt.add(ru.Consumption{RRU: 1.5, WRU: 2, CPUSeconds: 0.003})
	tt.add(ru.Consumption{WRU: -0.5})
	if got := float64(tt.microRU.Load()) / 1e6; got != 3 {
		t.Errorf("RU = %v, want 3", got)
	}
	if got := tt.cpuNs.Load(); got != 3_000_000 {
		t.Errorf("CPU = %d ns, want 3 ms", got)
	}
}
