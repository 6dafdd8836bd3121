package binlog

import (
	"strconv"
	"strings"
	"sync"
	"time"
)

// Result is what a claim learned.
type Result struct {
	// Found: the binary log showed the transaction(s) claimed.
	Found bool
	// Bytes is what they wrote to tables.
	Bytes int64
	// Txns is how many transactions the claim took: 1 for a GTID; on
	// MySQL, every transaction of the thread completed and not yet
	// claimed.
	Txns int
}

// resolution is a claim's callback and its result, run by the caller once
// the store's lock is released.
type resolution struct {
	fn  func(Result)
	res Result
}

func run(rs []resolution) {
	for _, r := range rs {
		r.fn(r.res)
	}
}

// store matches claims with completed transactions, whichever comes first:
// a statement's OK usually reaches rgproxy before its events reach the
// reader, so a claim waits (up to wait) for its transaction, and a
// transaction nobody has claimed yet waits (up to keep) for its claim.
// Times are passed in, so that tests drive it without a clock. Safe for
// concurrent use.
type store struct {
	mu         sync.Mutex
	wait, keep time.Duration
	maxDone    int // completed transactions kept unclaimed, at most
	maxPending int // claims waiting, at most
	done       map[string]*doneTxn
	doneQ      []queued // by completion time
	pending    map[string]*claim
	pendQ      []queued // by deadline
	// high is, per MariaDB GTID domain, the highest sequence number
	// completed: a claim at or below it whose transaction is not kept was
	// passed (before the reader started, or aged out) and fails at once.
	high map[uint32]uint64
}

type doneTxn struct {
	bytes int64
	txns  int
}

type claim struct{ fn func(Result) }

type queued struct {
	key   string
	at    time.Time
	done  *doneTxn
	claim *claim
}

func newStore(wait, keep time.Duration, maxDone, maxPending int) *store {
	return &store{wait: wait, keep: keep, maxDone: maxDone, maxPending: maxPending,
		done: map[string]*doneTxn{}, pending: map[string]*claim{}, high: map[uint32]uint64{}}
}

// claim asks for the transaction(s) named key; fn gets the result, at once
// (from the returned resolutions) or when they complete or the wait ends.
// A claim for a key already waiting replaces it: the earlier one fails.
func (s *store) claim(key string, now time.Time, fn func(Result)) []resolution {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.done[key]; d != nil {
		delete(s.done, key)
		return []resolution{{fn, Result{Found: true, Bytes: d.bytes, Txns: d.txns}}}
	}
	if dom, seq, ok := parseGTID(key); ok {
		if h, seen := s.high[dom]; seen && seq <= h {
			return []resolution{{fn, Result{}}}
		}
	}
	var out []resolution
	if old := s.pending[key]; old != nil {
		out = append(out, resolution{old.fn, Result{}})
		delete(s.pending, key)
	}
	if len(s.pending) >= s.maxPending {
		return append(out, resolution{fn, Result{}})
	}
	c := &claim{fn: fn}
	s.pending[key] = c
	s.pendQ = append(s.pendQ, queued{key: key, at: now.Add(s.wait), claim: c})
	return out
}

// complete records a transaction the log showed; a claim waiting for it
// gets it.
func (s *store) complete(key string, bytes int64, now time.Time) []resolution {
	s.mu.Lock()
	defer s.mu.Unlock()
	if dom, seq, ok := parseGTID(key); ok && seq > s.high[dom] {
		s.high[dom] = seq
	}
	if c := s.pending[key]; c != nil {
		delete(s.pending, key)
		return []resolution{{c.fn, Result{Found: true, Bytes: bytes, Txns: 1}}}
	}
	d := s.done[key]
	if d == nil {
		for len(s.done) >= s.maxDone && len(s.doneQ) > 0 {
			s.dropOldest()
		}
		d = &doneTxn{}
		s.done[key] = d
		s.doneQ = append(s.doneQ, queued{key: key, at: now, done: d})
	}
	d.bytes += bytes
	d.txns++
	return nil
}

// expire fails the claims whose wait is over and forgets the transactions
// kept unclaimed for keep.
func (s *store) expire(now time.Time) []resolution {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []resolution
	for len(s.pendQ) > 0 && !s.pendQ[0].at.After(now) {
		q := s.pendQ[0]
		s.pendQ = s.pendQ[1:]
		if s.pending[q.key] == q.claim {
			delete(s.pending, q.key)
			out = append(out, resolution{q.claim.fn, Result{}})
		}
	}
	for len(s.doneQ) > 0 && now.Sub(s.doneQ[0].at) >= s.keep {
		s.dropOldest()
	}
	return out
}

func (s *store) dropOldest() {
	q := s.doneQ[0]
	s.doneQ = s.doneQ[1:]
	if s.done[q.key] == q.done {
		delete(s.done, q.key)
	}
}

// sizes reports how many transactions are kept and claims wait.
func (s *store) sizes() (done, pending int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.done), len(s.pending)
}

// parseGTID reads a MariaDB GTID, domain-server-sequence.
func parseGTID(key string) (domain uint32, seq uint64, ok bool) {
	d, rest, ok1 := strings.Cut(key, "-")
	_, n, ok2 := strings.Cut(rest, "-")
	if !ok1 || !ok2 {
		return 0, 0, false
	}
	dv, err1 := strconv.ParseUint(d, 10, 32)
	nv, err2 := strconv.ParseUint(n, 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return uint32(dv), nv, true
}
