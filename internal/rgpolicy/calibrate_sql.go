package rgpolicy

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenclient"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// calibrateColumns are CALIBRATE RESOURCE's columns: TiDB's QUOTA, then
// the basis.
var calibrateColumns = []string{"QUOTA", "MODE", "WINDOW_START", "WINDOW_END", "POINTS", "RU_PER_BACKEND_CPU_SECOND", "BACKEND_CPUS", "BASIS"}

// calibrateGroupColumns are CALIBRATE RESOURCE FOR GROUPS' columns.
var calibrateGroupColumns = []string{"NAME", "RU_PER_SEC", "SUGGESTED_RU_PER_SEC", "P95_RU_PER_SEC", "PEAK_RU_PER_SEC", "AVG_RU_PER_SEC",
	"CAPACITY", "FITS", "BASIS"}

const (
	// calibrateRows bounds the usage history one CALIBRATE reads (all
	// groups' rows of the window).
	calibrateRows = 100_000
	// calibrateAllGroups names FOR GROUPS' summary row (no group can be
	// named so).
	calibrateAllGroups = "(all groups)"
	// calibrateDemandWindow is FOR GROUPS' window without START_TIME.
	calibrateDemandWindow = time.Hour
)

// calibrate answers CALIBRATE RESOURCE.
func (s *session) calibrate(ctx context.Context, a *resourcegroup.CalibrateResource, be mysqlproto.Backend) mysqlproto.Verdict {
	now := s.p.clk.Now()
	if a.ForGroups {
		return s.calibrateGroups(ctx, a, be, now)
	}
	c, from, to, mode, err := s.capacity(ctx, a, now)
	if err != nil {
		return errReply(err)
	}
	return resultReply(calibrateColumns, [][]string{{strconv.FormatInt(int64(math.Round(c.quota)), 10), mode,
		summaryTime(from), summaryTime(to), strconv.Itoa(c.points), formatFloat(c.ruPerCPU), trimFloat(c.cpus), c.basis}})
}

// capacity is the live answer or the window's, with the window and the
// mode's name.
func (s *session) capacity(ctx context.Context, a *resourcegroup.CalibrateResource, now time.Time) (capacity, time.Time, time.Time, string, error) {
	if !a.Window {
		c, err := s.p.calib.live(now)
		return c, now.Add(-calibLive), now, "live", err
	}
	from, to, err := calibrateSpan(a, now)
	if err != nil {
		return capacity{}, from, to, "", err
	}
	c, err := s.windowCapacity(ctx, from, to, now)
	return c, from, to, "window", err
}

// calibrateSpan is a window's bounds, its end cut to now.
func calibrateSpan(a *resourcegroup.CalibrateResource, now time.Time) (time.Time, time.Time, error) {
	from, to := a.Start, a.End
	if !from.Before(now) {
		return from, to, errCalibrateFuture
	}
	if to.IsZero() || to.After(now) {
		to = now
	}
	if to.Sub(from) < resourcegroup.CalibrateMinWindow {
		return from, to, rgproxyError(fmt.Sprintf("rgproxy: CALIBRATE RESOURCE: the window up to now is %s, shorter than a minute: too short to tell", to.Sub(from).Truncate(time.Second)))
	}
	return from, to, nil
}

// calibrateGranularity is the finest granularity the usage history still
// keeps at from (seconds for the last hour, minutes for two days, hours).
func calibrateGranularity(from, now time.Time) time.Duration {
	return whatIfGranularity(now.Sub(from))
}

// history reads the rows of groups (nil: all) over [from, to) at the
// finest granularity kept, and whether they were cut.
func (s *session) history(ctx context.Context, groups []string, from, to, now time.Time) ([]tokenclient.UsageRowHistory, time.Duration, bool, error) {
	if s.p.usage == nil {
		return nil, 0, false, errUsageOff
	}
	gran := calibrateGranularity(from, now)
	from = from.Truncate(gran)
	rows, truncated, err := s.p.usage.UsageHistory(ctx, &tokenpb.UsageHistoryRequest{
		Groups: groups, AllGroups: groups == nil, FromUnixMs: from.UnixMilli(), ToUnixMs: to.UnixMilli(),
		GranularityS: uint32(gran / time.Second), Limit: calibrateRows,
	})
	if err != nil {
		return nil, gran, false, usageError(err)
	}
	return rows, gran, truncated, nil
}

// windowCapacity applies TiDB's rule to the usage history's points of
// [from, to): all groups' RU and backend CPU-seconds summed per interval,
// utilisation the CPU-seconds over the interval times the backend's CPUs.
func (s *session) windowCapacity(ctx context.Context, from, to, now time.Time) (capacity, error) {
	cpus, why, err := s.p.calib.windowCPUs(s.p.cpu.backendPID.Load())
	if err != nil {
		return capacity{}, err
	}
	rows, gran, truncated, err := s.history(ctx, nil, from, to, now)
	if err != nil {
		return capacity{}, err
	}
	type point struct{ ru, cpu float64 }
	byStart := map[int64]*point{}
	for i := range rows {
		r := &rows[i]
		if r.Granularity != gran {
			continue
		}
		p := byStart[r.Start.Unix()]
		if p == nil {
			p = &point{}
			byStart[r.Start.Unix()] = p
		}
		p.ru += r.RRU + r.WRU
		p.cpu += r.CPUSeconds
	}
	// The host's utilisation at the window's intervals, where the sampler
	// holds them.
	hostUtil, hostCPUs, sampled := s.p.calib.hostUtil(gran)
	var est []float64
	var sRU, sCPU float64
	nHost := 0
	secs := gran.Seconds()
	for start, p := range byStart {
		if p.ru <= 0 {
			continue
		}
		if u, ok := hostUtil[start]; ok && hostCPUs > 0 {
			if u > calibMinUtil {
				est = append(est, p.ru/secs/u*cpus/float64(hostCPUs))
				nHost++
			}
			continue
		}
		if hostCPUs > 0 && start >= sampled {
			continue // sampled, but too little of it: no estimate
		}
		if p.cpu <= 0 || p.cpu/secs/cpus <= calibMinUtil {
			continue
		}
		est = append(est, p.ru/p.cpu*cpus)
		sRU, sCPU = sRU+p.ru, sCPU+p.cpu
	}
	quota, err := tidbRule(est)
	if err != nil {
		return capacity{}, err
	}
	c := capacity{quota: quota, points: len(est), cpus: cpus}
	var all float64
	for _, p := range byStart {
		all += p.cpu
		c.ruPerCPU += p.ru
	}
	if all > 0 {
		c.ruPerCPU /= all
	} else {
		c.ruPerCPU = 0
	}
	c.basis = fmt.Sprintf("the usage history at %d s, all groups: %d points, top and bottom 10%% dropped; the backend's CPUs %s (%s); %.1f RU per backend CPU-second of its CPU-true statements",
		int(secs), len(est), trimFloat(cpus), why, c.ruPerCPU)
	if nHost > 0 {
		c.basis += fmt.Sprintf("; %d points at seconds this proxy sampled (the last hour): RU/s over the host's utilisation above 20%% (the backend shares this host of %d CPUs with rgproxy and the clients)", nHost, hostCPUs)
	}
	if n := len(est) - nHost; n > 0 {
		c.basis += fmt.Sprintf("; %d points beyond them: RU per backend CPU-second times the backend's CPUs where its statements' CPU was above 20%% of them, the backend assumed to have them to itself", n)
	}
	if truncated {
		c.basis += "; the history was cut to its newest rows"
	}
	return c, nil
}

// windowCPUs are the backend's CPUs for a window: --backend-cpus, else
// those read of the backend process (co-located).
func (c *calibrator) windowCPUs(pid int64) (float64, string, error) {
	if c.flagCPUs > 0 {
		return c.flagCPUs, "--backend-cpus", nil
	}
	if pid <= 0 {
		return 0, "", errCalibrateCPUs
	}
	_, _, n, err := readHostCPU(c.procRoot)
	if err != nil {
		return 0, "", errCalibrateCPUs
	}
	return c.backendCPUs(pid, n)
}

// calibrateGroups answers CALIBRATE RESOURCE FOR GROUPS: each group's
// suggested RU_PER_SEC is the 95th percentile of its demand per second
// (RRU + WRU + the RU denied) over the window's intervals, rounded up;
// the summary row adds them up and compares them with the capacity.
func (s *session) calibrateGroups(ctx context.Context, a *resourcegroup.CalibrateResource, be mysqlproto.Backend, now time.Time) mysqlproto.Verdict {
	readable, err := s.readableGroups(ctx, be)
	if err != nil {
		return errReply(err)
	}
	var names []string
	if len(a.Groups) > 0 {
		for _, n := range a.Groups {
			if readable != nil && !readable(n) {
				return errReply(s.deniedRead(n))
			}
			if _, ok := s.p.tokens.Group(n); !ok {
				return errReply(resourcegroup.NewNotFound(n))
			}
		}
		names = a.Groups
	} else {
		all, err := s.p.tokens.Store().ListGroups(ctx)
		if err != nil {
			return errReply(err)
		}
		for _, g := range all {
			if readable == nil || readable(g.Name) {
				names = append(names, g.Name)
			}
		}
	}
	from, to := now.Add(-calibrateDemandWindow), now
	if a.Window {
		if from, to, err = calibrateSpan(a, now); err != nil {
			return errReply(err)
		}
	}
	rows, gran, truncated, err := s.history(ctx, names, from, to, now)
	if err != nil {
		return errReply(err)
	}
	intervals := max(int(to.Sub(from.Truncate(gran))/gran), 1)
	demand := map[string][]float64{}
	for i := range rows {
		r := &rows[i]
		if r.Granularity != gran {
			continue
		}
		demand[r.Group] = append(demand[r.Group], (r.RRU+r.WRU+r.DeniedRU)/gran.Seconds())
	}
	// The capacity: the window's, else live.
	capText, fits, capBasis := "NULL", "UNKNOWN", ""
	capWhat := a
	if !a.Window {
		capWhat = &resourcegroup.CalibrateResource{}
	}
	c, _, _, _, capErr := s.capacity(ctx, capWhat, now)
	if capErr == nil {
		capText, capBasis = strconv.FormatInt(int64(math.Round(c.quota)), 10), "capacity: "+c.basis
	} else {
		capBasis = "capacity unknown: " + mysqlError(capErr).Message
	}
	basis := fmt.Sprintf("suggested = the 95th percentile of the group's demand (RRU + WRU + RU denied) per second over %d intervals of %d s from %s to %s (idle intervals count as 0)",
		intervals, int(gran/time.Second), summaryTime(from), summaryTime(to))
	if truncated {
		basis += "; the history was cut to its newest rows"
	}
	out := make([][]string, 0, len(names)+1)
	var sumCur, sumSug float64
	unlimited := false
	for _, n := range names {
		d := demand[n]
		for len(d) < intervals {
			d = append(d, 0)
		}
		slices.Sort(d)
		p95, peak, avg := percentile(d, 0.95), d[len(d)-1], mean(d)
		sug := max(math.Ceil(p95), 1)
		sumSug += sug
		cur := "UNLIMITED"
		if g, ok := s.p.tokens.Group(n); ok && g.RUPerSec != resourcegroup.Unlimited {
			cur = strconv.FormatUint(g.RUPerSec, 10)
			sumCur += float64(g.RUPerSec)
		} else {
			unlimited = true
		}
		out = append(out, []string{n, cur, formatFloat(sug), formatFloat(p95), formatFloat(peak), formatFloat(avg), capText, "", basis})
	}
	if capErr == nil {
		fits = yesNo(sumSug <= c.quota)
	}
	for _, r := range out {
		r[7] = fits
	}
	sumText := formatFloat(sumCur)
	if unlimited {
		sumText += " (UNLIMITED groups left out)"
	}
	out = append(out, []string{calibrateAllGroups, sumText, formatFloat(sumSug), "", "", "", capText, fits,
		fmt.Sprintf("the suggestions add up to %.0f RU/s against a capacity of %s; %s", sumSug, capText, capBasis)})
	return resultReply(calibrateGroupColumns, out)
}

// percentile of sorted d (nearest rank).
func percentile(d []float64, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	i := max(int(math.Ceil(q*float64(len(d))))-1, 0)
	return d[min(i, len(d)-1)]
}

func mean(d []float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := 0.0
	for _, v := range d {
		s += v
	}
	return s / float64(len(d))
}

// runCalibrator samples every second and refreshes the capacity gauges
// every calibMetricsEvery, until ctx ends (Run owns it).
func (p *Policy) runCalibrator(ctx context.Context) {
	n := 0
	for {
		t := p.clk.NewTimer(calibEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		p.calib.sample(p.clk.Now(), p.cpu.backendPID.Load())
		if n++; n%int(calibMetricsEvery/calibEvery) == 0 {
			p.refreshCapacity(ctx)
		}
	}
}

// refreshCapacity sets the capacity gauges: the live capacity (0 when it
// cannot be told), the groups' RU_PER_SEC summed, and whether they exceed
// it. It returns them for the console.
func (p *Policy) refreshCapacity(ctx context.Context) (capacityRU, limits float64, over bool) {
	if c, err := p.calib.live(p.clk.Now()); err == nil {
		capacityRU = c.quota
	}
	if groups, err := p.tokens.Store().ListGroups(ctx); err == nil {
		for _, g := range groups {
			if g.RUPerSec != resourcegroup.Unlimited {
				limits += float64(g.RUPerSec)
			}
		}
	}
	over = capacityRU > 0 && limits > capacityRU
	p.calib.gauge.capacity.Set(capacityRU)
	p.calib.gauge.limits.Set(limits)
	v := 0.0
	if over {
		v = 1
	}
	p.calib.gauge.over.Set(v)
	p.calib.last.Store(&capacityStatus{Capacity: capacityRU, Limits: limits, Over: over})
	return capacityRU, limits, over
}

// capacityStatus is the last capacity check, for the console.
type capacityStatus struct {
	Capacity, Limits float64
	Over             bool
}

// CapacityStatus is the last check of the groups' RU_PER_SEC against the
// backend's capacity (every 10 s): the capacity (0: not known), their sum
// and whether it exceeds the capacity.
func (p *Policy) CapacityStatus() (capacityRU, limits float64, over bool) {
	if st := p.calib.last.Load(); st != nil {
		return st.Capacity, st.Limits, st.Over
	}
	return 0, 0, false
}
