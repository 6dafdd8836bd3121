package binlog

import (
	"testing"
	"time"
)

// step is one operation on a store at a time offset from t0.
type step struct {
	at    time.Duration
	op    string // "claim", "complete", "expire"
	key   string
	bytes int64
}

func TestStoreMatching(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	const wait, keep = 2 * time.Second, 10 * time.Second
	tests := []struct {
		name  string
		max   int // maxDone and maxPending; 0 = 100
		steps []step
		// want maps each claim (by its index among the claims) to its
		// result; a claim missing here must still be waiting.
		want map[int]Result
	}{
		{name: "claim waits for its transaction",
			steps: []step{{0, "claim", "0-1-5", 0}, {time.Second, "expire", "", 0}, {1500 * time.Millisecond, "complete", "0-1-5", 1000}},
			want:  map[int]Result{0: {Found: true, Bytes: 1000, Txns: 1}}},
		{name: "transaction waits for its claim",
			steps: []step{{0, "complete", "0-1-5", 1000}, {9 * time.Second, "expire", "", 0}, {9 * time.Second, "claim", "0-1-5", 0}},
			want:  map[int]Result{0: {Found: true, Bytes: 1000, Txns: 1}}},
		{name: "a claim fails when its wait is over, not before",
			steps: []step{{0, "claim", "0-1-5", 0}, {wait - time.Millisecond, "expire", "", 0}, {wait, "expire", "", 0}, {wait + time.Second, "complete", "0-1-5", 1000}},
			want:  map[int]Result{0: {}}},
		{name: "a claim still waiting is not failed",
			steps: []step{{0, "claim", "0-1-5", 0}, {wait - time.Millisecond, "expire", "", 0}},
			want:  map[int]Result{}},
		{name: "an unclaimed transaction is forgotten after keep",
			steps: []step{{0, "complete", "t7", 1000}, {keep, "expire", "", 0}, {keep, "claim", "t7", 0}, {keep + wait, "expire", "", 0}},
			want:  map[int]Result{0: {}}},
		{name: "a thread's transactions add up until claimed",
			steps: []step{{0, "complete", "t7", 1000}, {0, "complete", "t7", 500}, {time.Second, "claim", "t7", 0}, {time.Second, "claim", "t7", 0}, {2 * time.Second, "complete", "t7", 10}},
			want:  map[int]Result{0: {Found: true, Bytes: 1500, Txns: 2}, 1: {Found: true, Bytes: 10, Txns: 1}}},
		{name: "a transaction is claimed once",
			steps: []step{{0, "complete", "0-1-5", 1000}, {0, "claim", "0-1-5", 0}, {0, "claim", "0-1-5", 0}},
			want:  map[int]Result{0: {Found: true, Bytes: 1000, Txns: 1}, 1: {}}},
		{name: "a GTID the log has passed fails at once",
			steps: []step{{0, "complete", "0-1-9", 1}, {0, "claim", "0-1-8", 0}, {0, "claim", "1-1-3", 0}},
			want:  map[int]Result{0: {}}}, // domain 1 was never seen: its claim waits
		{name: "a second claim of a key replaces the first",
			steps: []step{{0, "claim", "t7", 0}, {0, "claim", "t7", 0}, {time.Second, "complete", "t7", 5}},
			want:  map[int]Result{0: {}, 1: {Found: true, Bytes: 5, Txns: 1}}},
		{name: "claims beyond the bound fail at once", max: 2,
			steps: []step{{0, "claim", "0-1-1", 0}, {0, "claim", "0-1-2", 0}, {0, "claim", "0-1-3", 0}},
			want:  map[int]Result{2: {}}},
		{name: "kept transactions beyond the bound drop the oldest", max: 2,
			steps: []step{{0, "complete", "t1", 1}, {0, "complete", "t2", 2}, {0, "complete", "t3", 3},
				{0, "claim", "t1", 0}, {0, "claim", "t3", 0}, {wait, "expire", "", 0}},
			want: map[int]Result{0: {}, 1: {Found: true, Bytes: 3, Txns: 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			max := tc.max
			if max == 0 {
				max = 100
			}
			s := newStore(wait, keep, max, max)
			got := map[int]Result{}
			claims := 0
			for _, st := range tc.steps {
				now := t0.Add(st.at)
				switch st.op {
				case "claim":
					i := claims
					claims++
					run(s.claim(st.key, now, func(r Result) {
						if _, dup := got[i]; dup {
							t.Errorf("claim %d resolved twice", i)
						}
						got[i] = r
					}))
				case "complete":
					run(s.complete(st.key, st.bytes, now))
				case "expire":
					run(s.expire(now))
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("resolved %+v, want %+v", got, tc.want)
			}
			for i, w := range tc.want {
				if g, ok := got[i]; !ok || g != w {
					t.Errorf("claim %d: %+v (resolved %v), want %+v", i, g, ok, w)
				}
			}
		})
	}
}

// TestStoreBounded: under a steady stream of transactions nobody claims
// and claims nobody answers, the store's maps stay within their bounds.
func TestStoreBounded(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s := newStore(2*time.Second, 10*time.Second, 1000, 500)
	failed := 0
	for i := range 100000 {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		run(s.complete(threadKey(uint32(i)), 10, now))
		run(s.claim("9-9-"+itoa(i), now, func(r Result) {
			if !r.Found {
				failed++
			}
		}))
		if i%100 == 0 {
			run(s.expire(now))
		}
		if d, p := s.sizes(); d > 1000 || p > 500 {
			t.Fatalf("step %d: %d kept, %d waiting", i, d, p)
		}
	}
	if len(s.doneQ) > 11000 || len(s.pendQ) > 3000 {
		t.Errorf("queues %d and %d: not bounded by their age", len(s.doneQ), len(s.pendQ))
	}
	if failed < 99000 {
		t.Errorf("%d claims failed, want all but those still waiting", failed)
	}
}

func itoa(i int) string { return threadKey(uint32(i))[1:] }
