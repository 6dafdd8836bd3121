package tokenserver

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// The usage history in etcd: write-once segments under /rg-usage/
// (outside /rg/, which proxies follow). At every persist tick the leader
// writes, per tier, one segment of the intervals that closed since its
// last write (all groups that moved in them), split in parts of at most
// usagePartBytes, keyed by tier and zero-padded start and end
// (/rg-usage/<1s|1m|1h>/<start>-<end>/<part>, unix seconds), so that one
// range delete drops the expired ones. Each write is fenced on the
// election key. A term writes only what it recorded: seconds from its
// start on (earlier ones were the earlier term's), minutes and hours from
// where the stored ones end, once its load has read them; the load
// rebuilds the minutes and the hour still open from the finer tier.

const (
	// keyUsage holds the segments.
	keyUsage = "/rg-usage/"
	// usagePartBytes bounds one stored value (etcd's request limit is
	// 1.5 MiB).
	usagePartBytes = 512 << 10
	// usagePersistParts bounds the parts written in one round; the rest
	// wait for the next (memory is the queue).
	usagePersistParts = 32
	// usageLoadPage is how many parts a load reads per request (≤ 4 MiB).
	usageLoadPage = 8
	// usageLoadRetry is the pause before a failed load tries again,
	// doubling up to usageLoadRetryMax.
	usageLoadRetry    = time.Second
	usageLoadRetryMax = 30 * time.Second
)

// usageStoreBytes bounds the values of a tier in etcd: beyond it the
// oldest segments are deleted before their retention (1,000 groups busy
// every second keep about 42, 37 and 125 MB), so that however many groups
// move, /rg-usage/ stays within 512 MiB.
func usageStoreBytes(k int) int64 { return [...]int64{128 << 20, 128 << 20, 256 << 20}[k] }

// usageStored is one segment in etcd: its start (unix seconds) and bytes.
type usageStored struct {
	start, bytes int64
}

// usageSegmentSpan caps the intervals of one segment per tier, so that a
// round after a long etcd outage writes bounded segments.
func usageSegmentSpan(k int) int64 { return [...]int64{60, 60, 24}[k] }

// usageKey is the key of part of the segment [start, end) of tier k
// (interval numbers).
func usageKey(k int, start, end int64, part int) string {
	g := usageTierSeconds(k)
	return fmt.Sprintf("%s%s/%013d-%013d/%03d", keyUsage, usageTierName(k), start*g, end*g, part)
}

// parseUsageKey reads a key back: tier, start and end interval numbers.
func parseUsageKey(key string) (k int, start, end int64, ok bool) {
	rest, found := strings.CutPrefix(key, keyUsage)
	if !found {
		return 0, 0, 0, false
	}
	name, rest, _ := strings.Cut(rest, "/")
	k = slices.Index([]string{"1s", "1m", "1h"}, name)
	span, _, _ := strings.Cut(rest, "/")
	a, b, _ := strings.Cut(span, "-")
	sa, err1 := strconv.ParseInt(a, 10, 64)
	sb, err2 := strconv.ParseInt(b, 10, 64)
	if k < 0 || err1 != nil || err2 != nil || sa > sb {
		return 0, 0, 0, false
	}
	g := usageTierSeconds(k)
	return k, sa / g, sb / g, true
}

// usageSegment is one segment to write: its parts, encoded.
type usageSegment struct {
	k          int
	start, end int64
	parts      [][]byte
}

// segment encodes the points of tier k in [from, to) of the series of
// list, by group name, in parts.
func (h *usageHistory) segment(list []*usageSeries, k int, from, to int64) (usageSegment, error) {
	seg := usageSegment{k: k, start: from, end: to}
	var series []*pb.UsageSeriesPoints
	h.walk(list, func(s *usageSeries) {
		var b []byte
		prev := from
		s.tiers[k].eachPoint(from, to, func(p usagePoint) {
			b = appendUsagePoint(b, prev, &p)
			prev = p.idx
		})
		if len(b) > 0 {
			series = append(series, &pb.UsageSeriesPoints{ResourceGroup: s.group, Points: b})
		}
	})
	slices.SortFunc(series, func(a, b *pb.UsageSeriesPoints) int { return strings.Compare(a.ResourceGroup, b.ResourceGroup) })
	part := &pb.UsageSegmentPart{GranularityS: uint32(usageTierSeconds(k)), StartIdx: from, EndIdx: to}
	size := 0
	flush := func() error {
		val, err := proto.Marshal(part)
		if err != nil {
			return fmt.Errorf("tokenserver: encode usage segment: %w", err)
		}
		seg.parts = append(seg.parts, val)
		part = &pb.UsageSegmentPart{GranularityS: part.GranularityS, StartIdx: from, EndIdx: to}
		size = 0
		return nil
	}
	for _, sp := range series {
		n := len(sp.ResourceGroup) + len(sp.Points) + 16
		if size > 0 && size+n > usagePartBytes-64 {
			if err := flush(); err != nil {
				return seg, err
			}
		}
		part.Series = append(part.Series, sp)
		size += n
	}
	if size > 0 {
		if err := flush(); err != nil {
			return seg, err
		}
	}
	return seg, nil
}

// tidy freezes what closed at now (or everything, at a hand-over) and
// drops what expired, walking the groups in chunks; it returns the first
// open second. Persistence does it, and the expiry tick while etcd is
// away, so that memory follows the retention either way.
func (h *usageHistory) tidy(now time.Time, handOver bool) int64 {
	h.mu.Lock()
	if handOver {
		h.horizon = max(h.horizon, ceilSec(now))
	}
	closed := h.closedBefore(now)
	if handOver {
		closed = h.horizon
	}
	h.mu.Unlock()
	h.walk(h.seriesList(true), func(s *usageSeries) { h.freezeSeries(s, closed) })
	h.walk(h.seriesList(false), func(s *usageSeries) { h.expireSeries(s, now.Unix()) })
	return closed
}

// pending freezes what closed at now (or everything, at a hand-over),
// drops what expired and returns the segments to write, at most
// usagePersistParts parts. It walks the groups in chunks.
func (h *usageHistory) pending(now time.Time, handOver bool) ([]usageSegment, error) {
	closed := h.tidy(now, handOver)
	all := h.seriesList(false)
	var segs []usageSegment
	parts := 0
	for k := range numUsageTiers {
		h.mu.Lock()
		g := usageTierSeconds(k)
		if h.wm[k] >= 0 {
			h.wm[k] = max(h.wm[k], now.Unix()/g-usageTierKeep(k))
		}
		from := h.wm[k]
		h.mu.Unlock()
		if from < 0 {
			continue // the load has not said where the stored ones end
		}
		for end := closed / g; from < end && parts < usagePersistParts; {
			to := min(end, from+usageSegmentSpan(k))
			seg, err := h.segment(all, k, from, to)
			if err != nil {
				return segs, err
			}
			segs = append(segs, seg)
			parts += len(seg.parts)
			from = to
		}
	}
	return segs, nil
}

// persistUsage writes the segments closed since the last round, fenced
// on the leader's election key, and deletes the expired ones. At a
// hand-over it first closes every second up to now.
func (s *Server) persistUsage(ctx context.Context, handOver bool) error {
	s.mu.Lock()
	key, rev := s.leaderKey, s.leaderRev
	s.mu.Unlock()
	if key == "" {
		return ErrNotLeader
	}
	h := s.usage
	now := s.now()
	s.evictUsage()
	segs, err := h.pending(now, handOver)
	if err != nil {
		return err
	}
	fence := clientv3.Compare(clientv3.CreateRevision(key), "=", rev)
	for _, seg := range segs {
		if len(seg.parts) == 0 {
			h.wrote(seg, false)
			continue
		}
		for i, val := range seg.parts {
			resp, err := s.cli.Txn(ctx).If(fence).Then(clientv3.OpPut(usageKey(seg.k, seg.start, seg.end, i), string(val))).Commit()
			if err != nil {
				return fmt.Errorf("%w: persist usage history: %w", ErrEtcd, err)
			}
			if !resp.Succeeded {
				return ErrNotLeader
			}
			h.written.Add(float64(len(val)))
		}
		h.wrote(seg, true)
	}
	// Expired segments, and the oldest beyond the tier's bytes: one
	// range delete per tier that has some.
	for k := range numUsageTiers {
		g := usageTierSeconds(k)
		cutoff := (now.Unix()/g - usageTierKeep(k)) * g
		h.mu.Lock()
		st, left := h.stored[k], h.storedBytes[k]
		n := 0
		for n < len(st) && (st[n].start < cutoff || left > h.storeMax[k]) {
			left -= st[n].bytes
			n++
		}
		var end int64
		if n > 0 {
			end = st[n-1].start + 1
			if n < len(st) {
				end = st[n].start
			}
		}
		h.mu.Unlock()
		if n == 0 {
			continue
		}
		from := keyUsage + usageTierName(k) + "/"
		to := fmt.Sprintf("%s%013d", from, end)
		resp, err := s.cli.Txn(ctx).If(fence).Then(clientv3.OpDelete(from, clientv3.WithRange(to))).Commit()
		if err != nil {
			return fmt.Errorf("%w: delete expired usage history: %w", ErrEtcd, err)
		}
		if !resp.Succeeded {
			return ErrNotLeader
		}
		h.mu.Lock()
		for len(h.stored[k]) > 0 && h.stored[k][0].start < end {
			h.storedBytes[k] -= h.stored[k][0].bytes
			h.stored[k] = h.stored[k][1:]
		}
		h.mu.Unlock()
	}
	return nil
}

// wrote advances tier seg.k's watermark past a segment written (or empty).
func (h *usageHistory) wrote(seg usageSegment, stored bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.wm[seg.k] >= 0 {
		h.wm[seg.k] = max(h.wm[seg.k], seg.end)
	}
	if !stored {
		return
	}
	var n int64
	for _, p := range seg.parts {
		n += int64(len(p))
	}
	h.stored[seg.k] = append(h.stored[seg.k], usageStored{start: seg.start * usageTierSeconds(seg.k), bytes: n})
	h.storedBytes[seg.k] += n
}

// evictUsage keeps the history within its bytes, dropping first what
// belongs to groups that no longer exist. Which groups exist is read
// under s.mu apart from the history's lock (whose order is s.mu first).
func (s *Server) evictUsage() {
	h := s.usage
	h.mu.Lock()
	if h.bytes <= h.maxBytes {
		h.mu.Unlock()
		return
	}
	names := make([]string, 0, len(h.series))
	for g := range h.series {
		names = append(names, g)
	}
	h.mu.Unlock()
	exists := make(map[string]bool, len(names))
	for i := 0; i < len(names); i += walkChunk {
		s.mu.Lock()
		for _, g := range names[i:min(i+walkChunk, len(names))] {
			exists[g] = s.holdsLocked(seriesGroup(g)) // a chargeback series goes with its group
		}
		s.mu.Unlock()
	}
	n := h.evict(func(g string) bool { return exists[g] })
	if n > 0 {
		s.log.Warn("usage history over its memory bound: oldest points dropped", "points", n, "bound_bytes", h.maxBytes)
	}
}

// usageLoad is what a term's load read from etcd, before it joins the
// history: per group, per tier, chunks oldest first.
type usageLoad struct {
	series map[string]*usageSeries
	// ends are the newest segment end per tier (-1: none); stored the
	// segments read, oldest first (as the keys).
	ends   [numUsageTiers]int64
	stored [numUsageTiers][]usageStored
	// extra are points that came out of order (segments of two terms
	// overlapping): added one by one.
	extra map[string][]usageLoadPoint
}

type usageLoadPoint struct {
	k int
	p usagePoint
}

// appendLoaded appends p to tier k of s if it comes after what s holds.
func appendLoaded(t *usageTier, p usagePoint) bool {
	if p.idx <= t.frozen {
		return false
	}
	n := len(t.chunks)
	if n == 0 || fullChunk(&t.chunks[n-1]) {
		t.chunks = append(t.chunks, usageChunk{first: p.idx, last: p.idx, data: make([]byte, 0, 16)})
		n++
	}
	c := &t.chunks[n-1]
	c.data = appendUsagePoint(c.data, c.last, &p)
	c.last, t.frozen = p.idx, p.idx
	t.points++
	return true
}

// startUsageLoad starts the term's load of the history from etcd; the
// returned stop cancels it and waits for it. Grants never wait for it.
func (s *Server) startUsageLoad(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		wait := usageLoadRetry
		for {
			err := s.loadUsage(clientv3.WithRequireLeader(ctx))
			if err == nil || ctx.Err() != nil {
				return
			}
			s.log.Warn("loading the usage history; trying again", "err", err, "in", wait)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			wait = min(2*wait, usageLoadRetryMax)
		}
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}

// loadUsage reads /rg-usage/ in pages, rebuilds the open minutes and
// hours from the finer tiers and adds it all to the history, whose
// reports since the term began it keeps.
func (s *Server) loadUsage(ctx context.Context) error {
	h := s.usage
	h.mu.Lock()
	horizon, term := h.horizon, h.term
	h.mu.Unlock()
	now := s.now()
	cnt, err := s.cli.Get(ctx, keyUsage, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("%w: count usage history: %w", ErrEtcd, err)
	}
	h.progress(term, 0, int(cnt.Count))
	ld := &usageLoad{series: map[string]*usageSeries{}, extra: map[string][]usageLoadPoint{},
		ends: [numUsageTiers]int64{-1, -1, -1}}
	from, end := keyUsage, clientv3.GetPrefixRangeEnd(keyUsage)
	read := 0
	for {
		resp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(usageLoadPage),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend), clientv3.WithRev(cnt.Header.Revision))
		if err != nil {
			return fmt.Errorf("%w: load usage history: %w", ErrEtcd, err)
		}
		for _, kv := range resp.Kvs {
			if err := ld.add(string(kv.Key), kv.Value, horizon, now); err != nil {
				s.log.Warn("bad usage history segment; skipped", "key", string(kv.Key), "err", err)
			}
		}
		read += len(resp.Kvs)
		h.progress(term, read, int(cnt.Count))
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	wm := ld.rebuild(horizon)
	return h.merge(term, ld, wm)
}

// progress records a load's progress, if its term is still current.
func (h *usageHistory) progress(term uint64, read, total int) {
	h.mu.Lock()
	if h.term == term {
		h.read, h.total = read, total
	}
	h.mu.Unlock()
}

// add takes one stored part: points older than their tier's retention
// and seconds from the term's horizon on (a clock skewed against the
// earlier leader's) are left out.
func (ld *usageLoad) add(key string, val []byte, horizon int64, now time.Time) error {
	k, start, end, ok := parseUsageKey(key)
	if !ok {
		return fmt.Errorf("%w: key %q", errUsageEncoding, key)
	}
	var part pb.UsageSegmentPart
	if err := proto.Unmarshal(val, &part); err != nil {
		return fmt.Errorf("%w: %w", errUsageEncoding, err)
	}
	if int64(part.GetGranularityS()) != usageTierSeconds(k) || part.GetStartIdx() != start || part.GetEndIdx() != end {
		return fmt.Errorf("%w: the part does not match its key", errUsageEncoding)
	}
	ld.ends[k] = max(ld.ends[k], end)
	if st, l := start*usageTierSeconds(k), len(ld.stored[k]); l > 0 && ld.stored[k][l-1].start == st {
		ld.stored[k][l-1].bytes += int64(len(val))
	} else {
		ld.stored[k] = append(ld.stored[k], usageStored{start: st, bytes: int64(len(val))})
	}
	cutoff := now.Unix()/usageTierSeconds(k) - usageTierKeep(k)
	for _, sp := range part.GetSeries() {
		g := sp.GetResourceGroup()
		if g == "" {
			continue
		}
		var pts []usagePoint
		if err := eachUsagePoint(sp.GetPoints(), start, func(p usagePoint) bool {
			if p.idx >= end {
				return false
			}
			if p.idx >= cutoff && (k != usageSec || p.idx < horizon) {
				pts = append(pts, p)
			}
			return true
		}); err != nil {
			return fmt.Errorf("group %q: %w", g, err)
		}
		if len(pts) == 0 {
			continue
		}
		s := ld.series[g]
		if s == nil {
			s = &usageSeries{group: g}
			for i := range s.tiers {
				s.tiers[i].frozen = -1
			}
			ld.series[g] = s
		}
		for _, p := range pts {
			if !appendLoaded(&s.tiers[k], p) {
				ld.extra[g] = append(ld.extra[g], usageLoadPoint{k: k, p: p})
			}
		}
	}
	return nil
}

// rebuild rolls the seconds not yet in a stored minute up into minutes,
// and the minutes not yet in a stored hour into hours; it returns where
// the term's writes of each tier start.
func (ld *usageLoad) rebuild(horizon int64) [numUsageTiers]int64 {
	wm := [numUsageTiers]int64{-1, ld.ends[usageMin], ld.ends[usageHour]}
	for k := usageMin; k < numUsageTiers; k++ {
		if wm[k] >= 0 {
			continue
		}
		// Nothing stored of this tier yet: it starts at the oldest of the
		// finer tier, or at the term.
		g, fg := usageTierSeconds(k), usageTierSeconds(k-1)
		wm[k] = horizon / g
		for _, s := range ld.series {
			if t := &s.tiers[k-1]; len(t.chunks) > 0 {
				wm[k] = min(wm[k], t.chunks[0].first*fg/g)
			}
		}
	}
	for _, s := range ld.series {
		for k := usageMin; k < numUsageTiers; k++ {
			g, fg := usageTierSeconds(k), usageTierSeconds(k-1)
			var acc usagePoint
			have := false
			s.tiers[k-1].eachPoint(wm[k]*g/fg, 1<<62, func(p usagePoint) {
				idx := p.idx * fg / g
				if have && idx != acc.idx {
					ld.appendRebuilt(s, k, acc)
					have = false
				}
				if !have {
					acc, have = usagePoint{idx: idx}, true
				}
				for i := range acc.v {
					acc.v[i] += p.v[i]
				}
			})
			if have {
				ld.appendRebuilt(s, k, acc)
			}
		}
	}
	return wm
}

// appendRebuilt appends a rebuilt point, or keeps it for later when it
// overlaps a stored one.
func (ld *usageLoad) appendRebuilt(s *usageSeries, k int, p usagePoint) {
	if !appendLoaded(&s.tiers[k], p) {
		ld.extra[s.group] = append(ld.extra[s.group], usageLoadPoint{k: k, p: p})
	}
}

// merge adds a load to the history of term (nothing if the term ended)
// and sets where the term's writes start.
func (h *usageHistory) merge(term uint64, ld *usageLoad, wm [numUsageTiers]int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.term != term {
		return nil
	}
	for g, l := range ld.series {
		s := h.series[g]
		if s == nil {
			s = &usageSeries{group: g}
			for i := range s.tiers {
				s.tiers[i].frozen = -1
			}
			h.series[g] = s
			h.bytes += usageSeriesBytes + int64(len(g))
		}
		for k := range s.tiers {
			h.mergeTier(s, k, &l.tiers[k])
		}
	}
	for g, pts := range ld.extra {
		s := h.series[g]
		for _, lp := range pts {
			h.addPoint(s, lp.k, lp.p)
		}
	}
	for k := usageMin; k < numUsageTiers; k++ {
		h.wm[k] = wm[k]
	}
	for k := range numUsageTiers {
		h.stored[k] = append(ld.stored[k], h.stored[k]...)
		slices.SortStableFunc(h.stored[k], func(a, b usageStored) int { return cmp.Compare(a.start, b.start) })
		for _, st := range ld.stored[k] {
			h.storedBytes[k] += st.bytes
		}
	}
	h.loaded = true
	return nil
}

// mergeTier puts the loaded tier l before tier k of s when it is all
// older than what s holds; else point by point.
func (h *usageHistory) mergeTier(s *usageSeries, k int, l *usageTier) {
	if len(l.chunks) == 0 {
		return
	}
	t := &s.tiers[k]
	first := int64(1 << 62)
	if len(t.chunks) > 0 {
		first = t.chunks[0].first
	} else if len(t.hot) > 0 {
		first = t.hot[0].idx
	}
	if l.frozen >= first {
		// Overlapping what the term recorded meanwhile: the older part
		// is encoded again as chunks of its own, the rest added point by
		// point (a few: the overlap is the load's duration).
		older := usageTier{frozen: -1}
		var rest []usagePoint
		l.eachPoint(0, 1<<62, func(p usagePoint) {
			if p.idx < first {
				appendLoaded(&older, p)
			} else {
				rest = append(rest, p)
			}
		})
		for _, p := range rest {
			h.addPoint(s, k, p)
		}
		l = &older
		if len(l.chunks) == 0 {
			return
		}
	}
	for _, c := range l.chunks {
		h.bytes += usageChunkHeader + int64(cap(c.data))
	}
	t.chunks = append(l.chunks, t.chunks...)
	t.frozen = max(t.frozen, l.frozen)
	t.points += l.points
	h.points[k] += int64(l.points)
}

// addPoint adds a loaded point to tier k of s wherever it falls: hot, new
// or frozen (then the tier is decoded and encoded again; rare).
func (h *usageHistory) addPoint(s *usageSeries, k int, p usagePoint) {
	t := &s.tiers[k]
	if p.idx > t.frozen {
		h.addHot(s, k, p.idx, &p.v)
		if _, ok := h.active[s]; !ok {
			h.active[s] = struct{}{}
		}
		return
	}
	var pts []usagePoint
	t.eachPoint(0, t.frozen+1, func(q usagePoint) { pts = append(pts, q) })
	i, found := slices.BinarySearchFunc(pts, p.idx, func(q usagePoint, idx int64) int { return cmp.Compare(q.idx, idx) })
	if found {
		for j := range p.v {
			pts[i].v[j] += p.v[j]
		}
	} else {
		pts = slices.Insert(pts, i, p)
	}
	h.dropChunks(t, k, len(t.chunks))
	t.frozen = -1
	for _, q := range pts {
		h.freezePoint(t, k, q)
		t.points++
		h.points[k]++
	}
}
