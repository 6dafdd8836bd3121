package tokenserver

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rgproxy/rgproxy/internal/topn"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// The usage history (UsageService, docs/design.md §7.10): what every group
// spent — RRU, WRU, statements, throttled, refused, the RU that waited and
// the RU denied — per second for the last hour, per minute for the last
// two days and per hour for the last 400 days, from the proxies'
// consumption reports after the credential book bounded them
// (Server.report). Each report is spread uniformly over the time it covers
// (at most the open seconds, below), so one-second rows are smooth although
// proxies report every few seconds; every tier is fed at once.
//
// Only intervals in which a group moved are kept. A group's newest
// intervals (the ones reports may still add to) are hot: plain points in
// small fixed-capacity slices, so a busy group's report allocates nothing.
// Once closed they are frozen into chunks in a compact encoding
// (appendUsagePoint, about 10 bytes a point). The whole is bounded in
// bytes (usageMaxBytes): over it, the oldest chunks of groups that no
// longer exist go first, then the oldest of any group.
//
// A second is closed usageSettle after it ended, or when the term began
// or handed over (horizon): a report never adds to a closed interval — the
// part of its interval before the open seconds is squeezed into them, so
// totals are kept. Closed intervals are what the leader writes to etcd
// (usage_store.go), once.

// Tiers of the history, and why these sizes.
const (
	usageSec  = iota // 1 s × 3,600: the last hour, for what just happened
	usageMin         // 60 s × 2,880: two days, yesterday against today
	usageHour        // 3,600 s × 9,600: 400 days, a year against the last
	numUsageTiers
)

// Bounds of the history.
const (
	// usageSettle is how long after its end a second stays open to
	// reports: tokenclient reports a consuming group at least every 5 s
	// (reportPeriod), so a report rarely covers more; its interval's
	// older part is squeezed into the open seconds.
	usageSettle = 5
	// usageMaxInterval caps the time one report is taken to cover.
	usageMaxInterval = 60 * time.Second
	// usageMaxBytes bounds the history's memory (its estimate, the
	// rgserver_usage_history_bytes gauge): 1,000 groups busy every second
	// for 400 days take about 190 MiB.
	usageMaxBytes = 256 << 20
	// usageChunkBytes is the size a chunk of frozen points grows to.
	usageChunkBytes = 512
	// Memory estimates per structure, for the bytes gauge.
	usageSeriesBytes = 160
	usageChunkHeader = 48
	usagePointBytes  = 64
	// usageFigureMax bounds a stored figure (in its scaled unit): sums of
	// hostile reports stay finite and fit the encoding.
	usageFigureMax = 1e18
)

// usageTierSeconds, usageTierKeep and usageTierHot are a tier's interval,
// its retention in intervals and its hot points' capacity.
func usageTierSeconds(k int) int64 { return [...]int64{1, 60, 3600}[k] }
func usageTierKeep(k int) int64    { return [...]int64{3600, 2880, 9600}[k] }

// usageTierHot: the open seconds (usageSettle + 1) and those awaiting the
// persist tick's freeze (5 s), with room; a minute or an hour is hot
// while open and until the next freeze.
func usageTierHot(k int) int { return [...]int{12, 2, 2}[k] }

// usageTierName names a tier in keys and metric labels.
func usageTierName(k int) string { return [...]string{"1s", "1m", "1h"}[k] }

// The figures of a point.
const (
	figRRU = iota
	figWRU
	figStatements
	figThrottled
	figRefused
	figWaited
	figDenied
	// figCPU is the backend CPU-seconds of the CPU-true statements
	// (Consumption.backend_cpu_seconds), kept in microseconds. It is the
	// eighth figure: a point's mask byte has room for no more.
	figCPU
	numFigs
)

// figScale is what a figure is multiplied by to be stored as an integer:
// RU figures in thousandths of an RU, counts as counts.
func figScale(i int) float64 {
	switch i {
	case figStatements, figThrottled, figRefused:
		return 1
	case figCPU:
		return 1e6
	}
	return 1000
}

// usageFigures are one report's figures (or a point's).
type usageFigures [numFigs]float64

// usagePoint is what a group spent in interval idx (unix seconds /
// the tier's interval).
type usagePoint struct {
	idx int64
	v   usageFigures
}

// usageChunk holds frozen points, oldest first, encoded.
type usageChunk struct {
	first, last int64
	data        []byte
}

// usageTier is one tier of one group: frozen chunks, then hot points.
type usageTier struct {
	chunks []usageChunk
	hot    []usagePoint // sorted by idx; capacity usageTierHot
	// frozen is the newest frozen idx (-1: none): later adds go after it.
	frozen int64
	points int
}

// usageSeries is one group's history.
type usageSeries struct {
	group string
	tiers [numUsageTiers]usageTier
}

// usageHistory is the leader's history. Its lock may be taken with s.mu
// held (Server.report), never the other way round.
type usageHistory struct {
	mu       sync.Mutex
	maxBytes int64
	series   map[string]*usageSeries
	// active are the series with hot points.
	active map[*usageSeries]struct{}
	bytes  int64
	points [numUsageTiers]int64
	// horizon (unix seconds): seconds before it are closed in this term
	// (its start, or a hand-over).
	horizon int64
	// wm are the write watermarks, per tier: intervals before wm[k] are
	// in etcd (or were never this term's to write); -1 until the load
	// says (minutes and hours).
	wm [numUsageTiers]int64
	// stored are the segments known in etcd per tier, oldest first, and
	// storedBytes their bytes: expired ones, and the oldest beyond the
	// tier's bytes, are deleted when there are some, so that an idle
	// history writes nothing.
	stored      [numUsageTiers][]usageStored
	storedBytes [numUsageTiers]int64
	// storeMax is usageStoreBytes (tests make it smaller).
	storeMax [numUsageTiers]int64
	// loaded: the term's load from etcd finished; read and total its
	// progress, in keys.
	loaded      bool
	read, total int
	// term counts terms, so that a load of an earlier one changes nothing.
	term uint64
	// evicted counts points dropped by the bytes bound; written the bytes
	// of segments written to etcd.
	evicted, written prometheus.Counter
	// persistErrors counts persistence rounds that failed.
	persistErrors prometheus.Counter
}

func newUsageHistory() *usageHistory {
	h := &usageHistory{maxBytes: usageMaxBytes,
		evicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rgserver_usage_history_evicted_points_total",
			Help: "Points of the usage history dropped before their retention because the history reached its memory bound (256 MiB): the oldest of groups that no longer exist first, then the oldest of any group.",
		}),
		written: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rgserver_usage_history_written_bytes_total",
			Help: "Bytes of usage history segments the leader wrote to etcd under /rg-usage/.",
		}),
		persistErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rgserver_usage_history_persist_errors_total",
			Help: "Rounds writing the usage history to etcd that failed (etcd refused or did not answer); what they did not write is written at the next round.",
		}),
	}
	for k := range h.storeMax {
		h.storeMax[k] = usageStoreBytes(k)
	}
	h.newTerm(time.Unix(0, 0))
	h.loaded = true
	return h
}

// newTerm empties the history for a term that began at now: the term
// writes only seconds from its start on; minutes and hours wait for the
// load to say where the earlier terms stopped.
func (h *usageHistory) newTerm(now time.Time) {
	h.series = map[string]*usageSeries{}
	h.active = map[*usageSeries]struct{}{}
	h.bytes = 0
	h.points = [numUsageTiers]int64{}
	h.horizon = ceilSec(now)
	h.wm = [numUsageTiers]int64{h.horizon, -1, -1}
	h.stored = [numUsageTiers][]usageStored{}
	h.storedBytes = [numUsageTiers]int64{}
	h.loaded, h.read, h.total = false, 0, 0
	h.term++
}

func ceilSec(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// closedBefore is the first open second at now.
func (h *usageHistory) closedBefore(now time.Time) int64 {
	return max(now.Unix()-usageSettle, h.horizon)
}

// add spreads one report of group, covering interval up to now,
// uniformly over its open seconds (and their minutes and hours). Counts
// are split so that the seconds' parts are whole and sum to the count.
// O(seconds spread); no allocation for a group already hot.
func (h *usageHistory) add(group string, f usageFigures, interval time.Duration, now time.Time) {
	h.addUntil(group, f, interval, now, now)
}

// addUntil is add for a report whose interval ends at endAt, before now
// when the group fell idle before the report.
func (h *usageHistory) addUntil(group string, f usageFigures, interval time.Duration, endAt, now time.Time) {
	moved := false
	for i := range f {
		if !(f[i] > 0) || math.IsInf(f[i], 0) {
			f[i] = 0 // validated upstream; never store NaN or ±Inf
			continue
		}
		moved = true
	}
	if !moved {
		return // an idle group costs nothing
	}
	interval = min(max(interval, 0), usageMaxInterval)
	end := min(endAt.UnixMilli(), now.UnixMilli())
	start := end - interval.Milliseconds()
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.series[group]
	if s == nil {
		s = &usageSeries{group: group}
		for k := range s.tiers {
			s.tiers[k].frozen = -1
		}
		h.series[group] = s
		h.bytes += usageSeriesBytes + int64(len(group))
	}
	if _, ok := h.active[s]; !ok {
		h.active[s] = struct{}{}
	}
	open := h.closedBefore(now) * 1000
	start = max(start, open)
	if start >= end {
		// All of it in the first open second (or the one now is in).
		h.addSecond(s, max(open, end-1)/1000, f)
		return
	}
	span := float64(end - start)
	var done usageFigures // counts given out so far, for whole parts
	for sec := start / 1000; sec*1000 < end; sec++ {
		a, b := max(start, sec*1000), min(end, (sec+1)*1000)
		w := float64(b-a) / span
		last := b == end
		var part usageFigures
		for i := range f {
			switch i {
			case figStatements, figThrottled, figRefused:
				// Cumulative rounding: the parts are whole and add up.
				to := f[i]
				if !last {
					to = math.Round(f[i] * float64(b-start) / span)
				}
				part[i], done[i] = to-done[i], to
			default:
				part[i] = f[i] * w
			}
		}
		h.addSecond(s, sec, part)
	}
}

// addSecond adds f to second sec of s and to its minute and hour.
func (h *usageHistory) addSecond(s *usageSeries, sec int64, f usageFigures) {
	zero := true
	for _, v := range f {
		if v != 0 {
			zero = false
			break
		}
	}
	if zero {
		return
	}
	for k := range s.tiers {
		h.addHot(s, k, sec/usageTierSeconds(k), &f)
	}
}

// addHot adds f to the hot point idx of tier k of s, making it when
// needed; a full hot slice freezes its oldest point first.
func (h *usageHistory) addHot(s *usageSeries, k int, idx int64, f *usageFigures) {
	t := &s.tiers[k]
	idx = max(idx, t.frozen+1)
	i, found := hotIndex(t.hot, idx)
	if !found {
		if t.hot == nil {
			t.hot = make([]usagePoint, 0, usageTierHot(k))
			h.bytes += int64(usageTierHot(k)) * usagePointBytes
		}
		if len(t.hot) == cap(t.hot) {
			// Hot for longer than it should be (the persist tick is late):
			// freeze the oldest point now.
			h.freezePoint(t, k, t.hot[0])
			t.hot = append(t.hot[:0], t.hot[1:]...)
			if i > 0 {
				i--
			}
			if idx <= t.frozen {
				idx = t.frozen + 1
				i, found = hotIndex(t.hot, idx)
			}
		}
		if !found {
			t.hot = slices.Insert(t.hot, i, usagePoint{idx: idx})
			t.points++
			h.points[k]++
		}
	}
	v := &t.hot[i].v
	for j := range v {
		v[j] = min(v[j]+f[j], usageFigureMax/figScale(j))
	}
}

// hotIndex is where idx is (found) or goes in hot; from the newest, where
// reports land.
func hotIndex(hot []usagePoint, idx int64) (int, bool) {
	i := len(hot)
	for i > 0 && hot[i-1].idx > idx {
		i--
	}
	if i > 0 && hot[i-1].idx == idx {
		return i - 1, true
	}
	return i, false
}

// maxUsagePointBytes is the most one encoded point takes.
const maxUsagePointBytes = 1 + binary.MaxVarintLen64*(numFigs+1)

// fullChunk: the next point may not fit c without growing it past
// usageChunkBytes.
func fullChunk(c *usageChunk) bool {
	return cap(c.data) >= usageChunkBytes && cap(c.data)-len(c.data) < maxUsagePointBytes
}

// freezePoint appends p to t's chunks.
func (h *usageHistory) freezePoint(t *usageTier, k int, p usagePoint) {
	n := len(t.chunks)
	if n == 0 || fullChunk(&t.chunks[n-1]) {
		// Small at first: a group that moved once costs a few bytes.
		t.chunks = append(t.chunks, usageChunk{first: p.idx, last: p.idx, data: make([]byte, 0, 16)})
		h.bytes += usageChunkHeader + 16
		n++
	}
	c := &t.chunks[n-1]
	before := cap(c.data)
	c.data = appendUsagePoint(c.data, c.last, &p)
	c.last = p.idx
	h.bytes += int64(cap(c.data) - before)
	t.frozen = p.idx
}

// freeze moves every closed hot point at now into the chunks, and frees
// the hot slices of series that went quiet. Called with mu held (tests;
// persistence walks in chunks: pending).
func (h *usageHistory) freeze(now time.Time) {
	sec := h.closedBefore(now)
	for s := range h.active {
		h.freezeSeries(s, sec)
	}
}

// freezeSeries freezes the seconds of s before sec and the minutes and
// hours that end by it. Called with mu held.
func (h *usageHistory) freezeSeries(s *usageSeries, sec int64) {
	quiet := true
	for k := range s.tiers {
		t := &s.tiers[k]
		closed := sec / usageTierSeconds(k)
		n := 0
		for n < len(t.hot) && t.hot[n].idx < closed {
			h.freezePoint(t, k, t.hot[n])
			n++
		}
		if n > 0 {
			t.hot = append(t.hot[:0], t.hot[n:]...)
		}
		if len(t.hot) == 0 && t.hot != nil {
			t.hot = nil
			h.bytes -= int64(usageTierHot(k)) * usagePointBytes
		}
		if len(t.hot) > 0 {
			quiet = false
		}
	}
	if quiet {
		delete(h.active, s)
	}
}

// expire drops the chunks whose every point is older than its tier's
// retention, and series left empty. Called with mu held (tests).
func (h *usageHistory) expire(now time.Time) {
	for _, s := range h.series {
		h.expireSeries(s, now.Unix())
	}
}

// expireSeries is expire for one series. Called with mu held.
func (h *usageHistory) expireSeries(s *usageSeries, nowSec int64) {
	for k := range s.tiers {
		t := &s.tiers[k]
		cutoff := nowSec/usageTierSeconds(k) - usageTierKeep(k)
		n := 0
		for n < len(t.chunks) && t.chunks[n].last < cutoff {
			n++
		}
		if n > 0 {
			h.dropChunks(t, k, n)
		}
	}
	h.dropIfEmpty(s)
}

// dropIfEmpty forgets s when it holds no point. Called with mu held.
func (h *usageHistory) dropIfEmpty(s *usageSeries) {
	if s.empty() && h.series[s.group] == s {
		delete(h.series, s.group)
		delete(h.active, s)
		h.bytes -= usageSeriesBytes + int64(len(s.group))
	}
}

// seriesList is every series (active: those with hot points), read
// under mu.
func (h *usageHistory) seriesList(active bool) []*usageSeries {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*usageSeries
	if active {
		out = make([]*usageSeries, 0, len(h.active))
		for s := range h.active {
			out = append(out, s)
		}
		return out
	}
	out = make([]*usageSeries, 0, len(h.series))
	for _, s := range h.series {
		out = append(out, s)
	}
	return out
}

// walk calls fn for each series of list with mu held, releasing it every
// walkChunk series, so that reports (which wait for mu holding the
// grant lock) never wait for a walk over every group.
func (h *usageHistory) walk(list []*usageSeries, fn func(*usageSeries)) {
	h.mu.Lock()
	for i, s := range list {
		fn(s)
		if (i+1)%walkChunk == 0 {
			h.mu.Unlock()
			runtime.Gosched()
			h.mu.Lock()
		}
	}
	h.mu.Unlock()
}

// empty: s holds no point.
func (s *usageSeries) empty() bool {
	for k := range s.tiers {
		if len(s.tiers[k].chunks) > 0 || len(s.tiers[k].hot) > 0 {
			return false
		}
	}
	return true
}

// dropChunks drops the n oldest chunks of t.
func (h *usageHistory) dropChunks(t *usageTier, k, n int) {
	for _, c := range t.chunks[:n] {
		pts := countUsagePoints(c.data)
		t.points -= pts
		h.points[k] -= int64(pts)
		h.bytes -= usageChunkHeader + int64(cap(c.data))
	}
	t.chunks = append(t.chunks[:0], t.chunks[n:]...)
	if len(t.chunks) == 0 {
		t.chunks = nil
	}
}

// evict drops the oldest chunks until the history is within its bytes:
// first of groups exists says no longer exist, then of any group, the
// oldest (by its first interval's time) first. It returns the points
// dropped. Called without mu: it walks and drops in chunks.
func (h *usageHistory) evict(exists func(string) bool) int {
	h.mu.Lock()
	over := h.bytes > h.maxBytes
	h.mu.Unlock()
	if !over {
		return 0
	}
	type cand struct {
		s       *usageSeries
		k       int
		gone    bool
		startAt int64
		first   int64
	}
	var cands []cand
	h.walk(h.seriesList(false), func(s *usageSeries) {
		gone := !exists(s.group)
		for k := range s.tiers {
			for _, c := range s.tiers[k].chunks {
				cands = append(cands, cand{s: s, k: k, gone: gone, startAt: c.first * usageTierSeconds(k), first: c.first})
			}
		}
	})
	slices.SortFunc(cands, func(a, b cand) int {
		if a.gone != b.gone {
			if a.gone {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.startAt, b.startAt)
	})
	target := h.maxBytes - h.maxBytes/16
	dropped := 0
	h.mu.Lock()
	for i, c := range cands {
		if h.bytes <= target {
			break
		}
		if (i+1)%walkChunk == 0 {
			h.mu.Unlock()
			runtime.Gosched() // let waiting reports in
			h.mu.Lock()
		}
		t := &c.s.tiers[c.k]
		if len(t.chunks) == 0 || t.chunks[0].first > c.first {
			continue // expired meanwhile
		}
		// The candidates of one tier come oldest first: drop its oldest.
		before := t.points
		h.dropChunks(t, c.k, 1)
		dropped += before - t.points
		h.dropIfEmpty(c.s)
	}
	h.mu.Unlock()
	h.evicted.Add(float64(dropped))
	return dropped
}

// appendUsagePoint encodes p after a point at prev: the uvarint distance,
// a byte of the figures that are not 0, those figures as uvarints in
// their scaled units.
func appendUsagePoint(b []byte, prev int64, p *usagePoint) []byte {
	b = binary.AppendUvarint(b, uint64(p.idx-prev))
	var mask byte
	var vals [numFigs]uint64
	for i, v := range p.v {
		x := math.Round(v * figScale(i))
		if !(x >= 1) {
			continue
		}
		vals[i] = uint64(min(x, usageFigureMax))
		mask |= 1 << i
	}
	b = append(b, mask)
	for i := range vals {
		if mask&(1<<i) != 0 {
			b = binary.AppendUvarint(b, vals[i])
		}
	}
	return b
}

// errUsageEncoding: a stored segment that does not decode.
var errUsageEncoding = errors.New("tokenserver: bad usage history encoding")

// readUsagePoint decodes one point after prev.
func readUsagePoint(b []byte, prev int64) (usagePoint, []byte, error) {
	d, n := binary.Uvarint(b)
	if n <= 0 || d > 1<<40 || len(b) <= n {
		return usagePoint{}, nil, errUsageEncoding
	}
	p := usagePoint{idx: prev + int64(d)}
	mask := b[n]
	b = b[n+1:]
	if int(mask) >= 1<<numFigs {
		return usagePoint{}, nil, errUsageEncoding
	}
	for i := range p.v {
		if mask&(1<<i) == 0 {
			continue
		}
		x, n := binary.Uvarint(b)
		if n <= 0 || x > usageFigureMax {
			return usagePoint{}, nil, errUsageEncoding
		}
		p.v[i] = float64(x) / figScale(i)
		b = b[n:]
	}
	return p, b, nil
}

// eachUsagePoint calls fn for every point of data (prev before the
// first); it stops at fn's false or a bad encoding.
func eachUsagePoint(data []byte, prev int64, fn func(usagePoint) bool) error {
	for len(data) > 0 {
		p, rest, err := readUsagePoint(data, prev)
		if err != nil {
			return err
		}
		if !fn(p) {
			return nil
		}
		data, prev = rest, p.idx
	}
	return nil
}

func countUsagePoints(data []byte) int {
	n := 0
	_ = eachUsagePoint(data, 0, func(usagePoint) bool { n++; return true })
	return n
}

// rounded is p as stored: each figure in its scaled unit.
func (p usagePoint) rounded() usagePoint {
	for i, v := range p.v {
		p.v[i] = math.Round(v*figScale(i)) / figScale(i)
	}
	return p
}

// eachPoint calls fn for the points of tier k of s in [from, to), oldest
// first, hot ones rounded as stored. Called with mu held.
func (t *usageTier) eachPoint(from, to int64, fn func(usagePoint)) {
	first, _ := slices.BinarySearchFunc(t.chunks, from, func(c usageChunk, from int64) int { return cmp.Compare(c.last, from) })
	for _, c := range t.chunks[first:] {
		if c.first >= to {
			break
		}
		_ = eachUsagePoint(c.data, c.first, func(p usagePoint) bool {
			if p.idx >= to {
				return false
			}
			if p.idx >= from {
				fn(p)
			}
			return true
		})
	}
	for _, p := range t.hot {
		if p.idx >= from && p.idx < to {
			fn(p.rounded())
		}
	}
}

// usageRow is one answer row before it is a message.
type usageRow struct {
	group string
	p     usagePoint
}

// query returns the points of tier k in [from, to) (interval numbers) of
// the groups keep accepts (nil: all), newest first, then by group, at
// most limit, and whether more matched.
func (h *usageHistory) query(keep map[string]bool, k int, from, to int64, limit int) ([]usageRow, bool) {
	newer := func(a, b usageRow) bool {
		if a.p.idx != b.p.idx {
			return a.p.idx > b.p.idx
		}
		return a.group < b.group
	}
	keeper := topn.New(limit, newer)
	matched := 0
	var list []*usageSeries
	if keep == nil {
		list = h.seriesList(false)
	} else {
		h.mu.Lock()
		for g := range keep {
			if s := h.series[g]; s != nil {
				list = append(list, s)
			}
		}
		h.mu.Unlock()
	}
	h.walk(list, func(s *usageSeries) {
		if keep == nil && strings.IndexByte(s.group, 0) >= 0 {
			return // a chargeback series (chargeback.go)
		}
		s.tiers[k].eachPoint(from, to, func(p usagePoint) {
			matched++
			keeper.Offer(usageRow{group: s.group, p: p})
		})
	})
	return keeper.Sorted(), matched > limit
}

// rowToPB is a row as sent.
func rowToPB(r usageRow, k int) *pb.UsageHistoryRow {
	g := usageTierSeconds(k)
	return &pb.UsageHistoryRow{ResourceGroup: r.group, StartUnixMs: r.p.idx * g * 1000, GranularityS: uint32(g),
		Rru: r.p.v[figRRU], Wru: r.p.v[figWRU], Statements: uint64(r.p.v[figStatements]),
		Throttled: uint64(r.p.v[figThrottled]), Refused: uint64(r.p.v[figRefused]),
		WaitedRu: r.p.v[figWaited], DeniedRu: r.p.v[figDenied], BackendCpuSeconds: r.p.v[figCPU]}
}

// String is the history's state at now in one line, for tests: per tier
// the points kept, then each group's points per tier (hot ones after a
// '+').
func (h *usageHistory) String(now time.Time) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	names := make([]string, 0, len(h.series))
	for g := range h.series {
		names = append(names, g)
	}
	slices.Sort(names)
	out := fmt.Sprintf("open@%+d points %d/%d/%d", h.closedBefore(now)-now.Unix(), h.points[usageSec], h.points[usageMin], h.points[usageHour])
	for _, g := range names {
		s := h.series[g]
		out += " " + g + ":"
		for k := range s.tiers {
			t := &s.tiers[k]
			if k > 0 {
				out += "/"
			}
			out += fmt.Sprintf("%d+%d", t.points-len(t.hot), len(t.hot))
		}
	}
	return out
}

// spentRU is what group spent (RRU + WRU) in [from, to): whole hours from
// the hours, the parts of hours at either end from the minutes (as far as
// they are kept), for a budget's window (a new term's seed). ok is false
// while the term's load has not finished: the sum would lack the earlier
// terms'.
func (h *usageHistory) spentRU(group string, from, to time.Time) (ru float64, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.loaded {
		return 0, false
	}
	s := h.series[group]
	if s == nil || !from.Before(to) {
		return 0, true
	}
	a, b := from.Unix(), to.Unix()
	ha, hb := (a+3599)/3600, b/3600 // whole hours: [ha, hb)
	add := func(p usagePoint) { ru += p.v[figRRU] + p.v[figWRU] }
	if to.Sub(from) <= time.Hour && from.Nanosecond() == 0 {
		// A window within the seconds' hour (a compressed calendar's,
		// or an HOUR's): its seconds.
		s.tiers[usageSec].eachPoint(a, b, add)
		return ru, true
	}
	if ha >= hb {
		s.tiers[usageMin].eachPoint((a+59)/60, b/60, add)
		return ru, true
	}
	s.tiers[usageHour].eachPoint(ha, hb, add)
	s.tiers[usageMin].eachPoint((a+59)/60, ha*60, add)
	s.tiers[usageMin].eachPoint(hb*60, b/60, add)
	return ru, true
}
