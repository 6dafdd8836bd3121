package rgpolicy

import (
	"cmp"
	"fmt"
	"sync"
	"time"

	"github.com/rgproxy/rgproxy/internal/topn"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/sqlscan"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// shapeKey names a statement shape: the hash of its digest (literals
// replaced) within a group.
type shapeKey struct {
	group string
	hash  uint64
}

// digestText is a statement's digest as the scan wrote it, in its
// session's character set, and whether its text had a "..." string that
// ANSI_QUOTES would read otherwise (sqlscan.Scan.EscapedDoubleQuote).
type digestText struct {
	b         []byte
	cs        sqlscan.Charset
	escapedDQ bool
}

// estimateWeight is the weight of the newest execution in a shape's
// decaying average: about the last five executions count.
const estimateWeight = 0.3

// shape is what the proxy learned of one statement shape: a decaying
// average of its cost, the estimate charged before its next execution,
// and the cumulative figures statements_summary shows.
type shape struct {
	key shapeKey
	// digest is the shape's digest text as statements_summary shows it
	// (sqlscan.ShownDigest).
	digest string
	// The estimate: decaying averages per execution.
	estRRU, estWRU float64
	estBackend     float64 // seconds
	// fast is a decaying average of "its backend latency was under
	// cpuMinEstimate": 1 for a shape that always answers at once.
	fast float64
	// short: fast rose to fastShare and has not fallen below slowShare
	// since (shapeEstimate.Short).
	short bool

	execCount            uint64
	sumLatency, maxLat   time.Duration
	sumRRU, maxRRU       float64
	sumWRU, maxWRU       float64
	sumQueued, maxQueued time.Duration
	sumErrors            uint64
	firstSeen, lastSeen  time.Time
	// win is the shape's part of the statements summary's current window
	// (statements_summary_history).
	win shapeWindow

	prev, next *shape // the shard's LRU list, most recent first
}

// shapeWindow is a shape's cumulative figures as they stood when the
// current summary window began (a window's figures are the difference),
// with the window's own maxima and its first execution in it.
type shapeWindow struct {
	execCount             uint64
	sumLatency, sumQueued time.Duration
	sumRRU, sumWRU        float64
	sumErrors             uint64
	maxLat, maxQueued     time.Duration
	maxRRU, maxWRU        float64
	first                 time.Time
}

// shapeShards splits the table so that sessions seldom wait on one lock.
const shapeShards = 16

// shapes is the bounded table of statement shapes: least recently used
// shapes are evicted, but never a group's last shapeGroupFloor ones, so
// that one group's traffic (10,000 distinct statements a second, say)
// cannot evict every other group's cost knowledge. Estimating and
// observing a known shape allocate nothing. Safe for concurrent use.
type shapes struct {
	shards [shapeShards]shapeShard
	// perGroup counts each group's shapes, across shards; guarded by
	// countMu, taken (after a shard's lock) only to add or evict.
	countMu  sync.Mutex
	perGroup map[string]int
	// windows are statements_summary_history's closed windows; winMu is
	// taken before any shard's lock, by a roll and by a reading of the
	// windows, so that no reading sees a window half rolled.
	winMu   sync.Mutex
	windows summaryWindows
}

// shapeGroupFloor is how many shapes of each group the table keeps
// whatever other groups do: while a group holds no more than this, its
// shapes are passed over when another group's new shape needs room.
const shapeGroupFloor = 64

type shapeShard struct {
	mu   sync.Mutex
	m    map[shapeKey]*shape
	head shape // sentinel: head.next is the most recent, head.prev the least
	max  int
}

func newShapes(capacity int) *shapes {
	t := &shapes{perGroup: map[string]int{}}
	per := max((capacity+shapeShards-1)/shapeShards, 1)
	for i := range t.shards {
		sh := &t.shards[i]
		sh.m = make(map[shapeKey]*shape)
		sh.head.next, sh.head.prev = &sh.head, &sh.head
		sh.max = per
	}
	return t
}

func (t *shapes) shard(k shapeKey) *shapeShard {
	return &t.shards[(k.hash^k.hash>>32)%shapeShards]
}

// shapeEstimate is what a shape is expected to cost.
type shapeEstimate struct {
	// The decaying averages of RRU, WRU and backend time charged.
	ru.Consumption
	// Short: nearly all of its recent executions answered within
	// cpuMinEstimate of wall time (see fastShare and slowShare).
	Short bool
}

// fastShare is the share of a shape's recent executions that must have
// answered within cpuMinEstimate for it to become short; it stays short
// until that share falls below slowShare. A latency spike of the machine
// (tens of ms for a point select on a busy VM, now and then under every
// session at once) then costs a short shape no CPU reading at all, while
// a shape that turns slow for good (or waits: SLEEP, locks) is read
// again from its third slow execution; one that was never short is read
// until four in five of its recent executions were fast.
const (
	fastShare = 0.8
	slowShare = 0.5
)

// shapeRef is a session's memo of a shape it used lately, so that a
// session repeating a statement finds its shape without hashing the key.
// The memo is trusted only while the shape still has the key: the table
// reuses an evicted shape's memory, always in the same shard (the new key
// falls in the shard that evicted it), so checking under the shard's lock
// is race-free. The zero value remembers nothing; nil: no memo.
//
// The memo also keeps the shape's estimate as the session's last
// execution of it left it. A short shape is estimated from that copy,
// without the shard's lock: the shape's entry, which every session running
// it writes, is then touched once per statement (observe) instead of
// twice, and a short shape's estimate is a fraction of an RU that one
// execution more or less hardly moves. Other shapes are always read from
// the table, so that a heavy shape's estimate includes every session's
// last execution.
type shapeRef struct {
	key shapeKey
	s   *shape
	// est is the shape's estimate after the session's last execution of
	// it; set says it is.
	est shapeEstimate
	set bool
}

// shapeMemoSize is how many shapes a session's memo remembers: a session
// often cycles through a few (sysbench's point select runs one per table).
const shapeMemoSize = 8

// shapeMemo is a session's memo of the shapes it used last.
type shapeMemo struct {
	refs [shapeMemoSize]shapeRef
	next int // the entry that a new shape replaces next
}

// ref returns the memo's entry for k or, when it has none, the oldest
// entry made, emptied and claimed for k, so that the observe after a new
// shape's estimate fills the same entry. A nil memo has no entries. (A
// shape's group is never "", so an unused entry matches no key.)
func (m *shapeMemo) ref(k shapeKey) *shapeRef {
	if m == nil {
		return nil
	}
	for i := range m.refs {
		if r := &m.refs[i]; r.key.hash == k.hash && r.key.group == k.group {
			return r
		}
	}
	r := &m.refs[m.next]
	m.next = (m.next + 1) % len(m.refs)
	*r = shapeRef{key: k}
	return r
}

// lookup returns k's shape, through ref when it can and setting it. The
// shard's lock is held.
func (sh *shapeShard) lookup(k shapeKey, ref *shapeRef) (*shape, bool) {
	if ref != nil && ref.s != nil && ref.key == k && ref.s.key == k {
		return ref.s, true
	}
	s, ok := sh.m[k]
	if ok && ref != nil {
		ref.key, ref.s, ref.est, ref.set = k, s, s.estimate(), true
	}
	return s, ok
}

// estimate returns what a shape is expected to cost. ok is false for a
// shape never seen. memo, when not nil, is the caller's.
func (t *shapes) estimate(k shapeKey, memo *shapeMemo) (shapeEstimate, bool) {
	ref := memo.ref(k)
	if ref != nil && ref.set && ref.est.Short && ref.key == k {
		return ref.est, true
	}
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s, ok := sh.lookup(k, ref)
	if !ok {
		return shapeEstimate{}, false
	}
	sh.touch(s)
	return s.estimate(), true
}

// estimate is the shape's estimate; its shard's lock is held.
func (s *shape) estimate() shapeEstimate {
	return shapeEstimate{
		Consumption: ru.Consumption{RRU: s.estRRU, WRU: s.estWRU, BackendSeconds: s.estBackend},
		Short:       s.short,
	}
}

// observe records one execution of a shape: its measured cost, backend
// time (latency), the time it waited for tokens and admission (queued),
// and whether it failed. digest is the shape's text, made the text shown
// only when the shape is new. memo, when not nil, is the caller's.
func (t *shapes) observe(k shapeKey, memo *shapeMemo, digest digestText, cost ru.Consumption, latency, queued time.Duration, failed bool, now time.Time) {
	ref := memo.ref(k)
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	fast := 0.0
	if latency < cpuMinEstimate {
		fast = 1
	}
	s, ok := sh.lookup(k, ref)
	if ok {
		sh.touch(s)
		s.estRRU += estimateWeight * (cost.RRU - s.estRRU)
		s.estWRU += estimateWeight * (cost.WRU - s.estWRU)
		s.estBackend += estimateWeight * (cost.BackendSeconds - s.estBackend)
		s.fast += estimateWeight * (fast - s.fast)
	} else {
		s = sh.add(t, k, sqlscan.ShownDigest(digest.b, digest.cs, digest.escapedDQ), now)
		s.estRRU, s.estWRU, s.estBackend, s.fast = cost.RRU, cost.WRU, cost.BackendSeconds, fast
	}
	if s.short {
		s.short = s.fast >= slowShare
	} else {
		s.short = s.fast >= fastShare
	}
	s.execCount++
	s.lastSeen = now
	w := &s.win
	if s.execCount == w.execCount+1 {
		w.first = now
	}
	w.maxLat = max(w.maxLat, latency)
	w.maxRRU = max(w.maxRRU, cost.RRU)
	w.maxWRU = max(w.maxWRU, cost.WRU)
	w.maxQueued = max(w.maxQueued, queued)
	s.sumLatency += latency
	s.maxLat = max(s.maxLat, latency)
	s.sumRRU += cost.RRU
	s.maxRRU = max(s.maxRRU, cost.RRU)
	s.sumWRU += cost.WRU
	s.maxWRU = max(s.maxWRU, cost.WRU)
	s.sumQueued += queued
	s.maxQueued = max(s.maxQueued, queued)
	if failed {
		s.sumErrors++
	}
	if ref != nil {
		ref.key, ref.s, ref.est, ref.set = k, s, s.estimate(), true
	}
}

// add makes a new shape, evicting one when the shard is full (and
// reusing its memory): the least recently used shape of a group that
// holds more than shapeGroupFloor shapes; a shape of a group at its floor
// is moved to the front and passed over. When every shape of the shard is
// at its group's floor, the least recently used goes all the same.
func (sh *shapeShard) add(t *shapes, k shapeKey, digest string, now time.Time) *shape {
	var s *shape
	t.countMu.Lock()
	if len(sh.m) >= sh.max {
		s = sh.head.prev
		for range len(sh.m) {
			if t.perGroup[s.key.group] > shapeGroupFloor {
				break
			}
			sh.touch(s)
			s = sh.head.prev
		}
		sh.unlink(s)
		delete(sh.m, s.key)
		if t.perGroup[s.key.group]--; t.perGroup[s.key.group] <= 0 {
			delete(t.perGroup, s.key.group)
		}
		*s = shape{}
	} else {
		s = &shape{}
	}
	t.perGroup[k.group]++
	t.countMu.Unlock()
	s.key, s.digest, s.firstSeen = k, digest, now
	sh.m[k] = s
	sh.pushFront(s)
	return s
}

func (sh *shapeShard) touch(s *shape) {
	if sh.head.next != s {
		sh.unlink(s)
		sh.pushFront(s)
	}
}

func (sh *shapeShard) unlink(s *shape) {
	s.prev.next, s.next.prev = s.next, s.prev
}

func (sh *shapeShard) pushFront(s *shape) {
	s.prev, s.next = &sh.head, sh.head.next
	sh.head.next.prev = s
	sh.head.next = s
}

// len returns how many shapes the table holds.
func (t *shapes) len() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// ShapeSummary is one row of statements_summary: a shape's figures since
// this proxy first saw it (or since it was last evicted). It is the type the Inspect stream carries
// (tokenclient.StatementSummary), so a proxy's rows and the cluster's are
// one struct.
type ShapeSummary = tokenclient.StatementSummary

// summary returns the shapes whose group passes keep (every group when
// keep is nil), ordered by group and digest.
func (t *shapes) summary(keep func(group string) bool) []ShapeSummary {
	var out []ShapeSummary
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for s := sh.head.next; s != &sh.head; s = s.next {
			if keep != nil && !keep(s.key.group) {
				continue
			}
			out = append(out, s.summary())
		}
		sh.mu.Unlock()
	}
	sortSummary(out)
	return out
}

// summary is the shape's row; its shard's lock is held.
func (s *shape) summary() ShapeSummary {
	n := float64(max(s.execCount, 1))
	return ShapeSummary{
		Group:      s.key.group,
		Digest:     digestHex(s.key.hash),
		DigestText: s.digest,
		ExecCount:  s.execCount,
		SumLatency: s.sumLatency, MaxLatency: s.maxLat,
		AvgRRU: s.sumRRU / n, MaxRRU: s.maxRRU,
		AvgWRU: s.sumWRU / n, MaxWRU: s.maxWRU,
		AvgQueued: s.sumQueued / time.Duration(max(s.execCount, 1)), MaxQueued: s.maxQueued,
		SumErrors: s.sumErrors,
		FirstSeen: s.firstSeen, LastSeen: s.lastSeen,
		EstimateRU: s.estRRU + s.estWRU,
	}
}

// digestHex is a digest hash as statements_summary shows it.
func digestHex(h uint64) string { return fmt.Sprintf("%016x", h) }

// heaviest returns the n shapes with the most RU in all (TotalRU), the
// heaviest first, and how many shapes the table holds. It holds one
// shard's lock at a time and builds rows only for each shard's n
// heaviest shapes.
func (t *shapes) heaviest(n int) ([]ShapeSummary, int) {
	all := topn.New(n, func(a, b ShapeSummary) bool {
		return heavier(a.TotalRU(), b.TotalRU(), a.Group, b.Group, a.Digest, b.Digest)
	})
	held := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		held += len(sh.m)
		// Shapes are reused once evicted: rows are made under the lock.
		local := topn.New(n, func(a, b *shape) bool {
			return heavier(a.sumRRU+a.sumWRU, b.sumRRU+b.sumWRU, a.key.group, b.key.group, a.key.hash, b.key.hash)
		})
		for s := sh.head.next; s != &sh.head; s = s.next {
			local.Offer(s)
		}
		for _, s := range local.Sorted() {
			all.Offer(s.summary())
		}
		sh.mu.Unlock()
	}
	return all.Sorted(), held
}

// heavier orders shapes for heaviest: more RU in all first, then by group
// and digest (its hash, or the hash in fixed-width hex: the same order).
func heavier[D cmp.Ordered](ta, tb float64, ga, gb string, da, db D) bool {
	if ta != tb {
		return ta > tb
	}
	if ga != gb {
		return ga < gb
	}
	return da < db
}

// String shows a shape's estimate on one line, for tests and logs.
func (t *shapes) String(k shapeKey) string {
	est, ok := t.estimate(k, nil)
	if !ok {
		return "unknown"
	}
	return fmt.Sprintf("rru=%.3f wru=%.3f backend=%.4fs", est.RRU, est.WRU, est.BackendSeconds)
}
