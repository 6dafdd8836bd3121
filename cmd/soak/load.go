package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MySQL error codes the soak expects (see docs/operating.md).
const (
	codeThrottled   = 8252 // refused under throttling: expected at any time
	codeBudget      = 8255 // refused by a budget's REFUSE: expected of a group with a budget
	codeBackendLost = 1927 // in flight when the backend died
	codeBackendDown = 9001 // a new session while the backend is down
)

// window is a span of time in which some errors are expected.
type window struct{ from, to time.Time }

// tally counts statements and errors by kind. Safe for concurrent use.
type tally struct {
	mu      sync.Mutex
	start   time.Time
	windows []window // the backend's outages, extended by a grace
	kinds   map[string]*errKind
	ok      map[string]int64 // successful statements by group
	refused map[string]int64 // 8252 by group
	// budgetRefused counts 8255 by group.
	budgetRefused map[string]int64
	// longestRefusal is, by group, the longest time one session's
	// statements were all refused.
	longestRefusal map[string]time.Duration
	// perSession counts successes by group and worker.
	perSession map[string]map[int]int64
}

func (t *tally) refusalRun(group string, d time.Duration) {
	t.mu.Lock()
	t.longestRefusal[group] = max(t.longestRefusal[group], d)
	t.mu.Unlock()
}

// errKind is one kind of error: a MySQL code, or a driver error.
type errKind struct {
	Kind     string
	Code     uint16
	Count    int64
	Outside  int64 // occurrences outside every backend outage window
	First    string
	FirstAt  time.Duration
	Expected bool
}

func newTally(start time.Time) *tally {
	return &tally{start: start, kinds: map[string]*errKind{}, ok: map[string]int64{}, refused: map[string]int64{}, budgetRefused: map[string]int64{},
		longestRefusal: map[string]time.Duration{}, perSession: map[string]map[int]int64{}}
}

func (t *tally) addWindow(w window) {
	t.mu.Lock()
	t.windows = append(t.windows, w)
	t.mu.Unlock()
}

func (t *tally) success(group string, worker int) {
	t.mu.Lock()
	t.ok[group]++
	if t.perSession[group] == nil {
		t.perSession[group] = map[int]int64{}
	}
	t.perSession[group][worker]++
	t.mu.Unlock()
}

// sessions returns the successes of each of group's sessions, by worker id.
func (t *tally) sessions(group string) map[int]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[int]int64{}
	for id, n := range t.perSession[group] {
		out[id] = n
	}
	return out
}

// sessionSpread is the fewest and most statements one session of group
// ran: how evenly throttling treated its sessions.
func (t *tally) sessionSpread(group string) (lo, hi int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	first := true
	for _, n := range t.perSession[group] {
		if first || n < lo {
			lo = n
		}
		hi = max(hi, n)
		first = false
	}
	return lo, hi
}

// failure records err, seen at now by a statement of what ("load",
// "idle", "ddl") in group.
func (t *tally) failure(what, group string, now time.Time, err error, note string) {
	kind, code := classify(err)
	kind = what + ": " + kind + note
	if code == codeBudget {
		kind += " in " + group // expected only of a group with a budget
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch code {
	case codeThrottled:
		t.refused[group]++
	case codeBudget:
		t.budgetRefused[group]++
	}
	k := t.kinds[kind]
	if k == nil {
		first := err.Error()
		if group != "" {
			first = "(" + group + ") " + first
		}
		k = &errKind{Kind: kind, Code: code, First: first, FirstAt: now.Sub(t.start)}
		t.kinds[kind] = k
	}
	k.Count++
	if !t.inWindowLocked(now) {
		k.Outside++
	}
}

// inWindowLocked: now lies in a backend outage window (an open one has a
// zero end).
func (t *tally) inWindowLocked(now time.Time) bool {
	for _, w := range t.windows {
		if !now.Before(w.from) && (w.to.IsZero() || !now.After(w.to)) {
			return true
		}
	}
	return false
}

// closeWindow sets the end of the last window.
func (t *tally) closeWindow(to time.Time) {
	t.mu.Lock()
	if n := len(t.windows); n > 0 {
		t.windows[n-1].to = to
	}
	t.mu.Unlock()
}

// classify names an error's kind: "mysql <code>" or the driver's error.
func classify(err error) (string, uint16) {
	if err == nil {
		return "", 0
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return fmt.Sprintf("mysql %d", me.Number), me.Number
	}
	switch {
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, mysql.ErrInvalidConn):
		return "driver: invalid connection", 0
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout", 0
	}
	msg := err.Error()
	if i := strings.IndexAny(msg, "0123456789"); i > 20 {
		msg = msg[:i]
	}
	return "other: " + msg, 0
}

// kindsSorted returns the error kinds, judged: 8252 is expected at any
// time, 1927 and 9001 only inside a backend outage; anything else is not.
func (t *tally) kindsSorted() []errKind {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []errKind
	for _, k := range t.kinds {
		e := *k
		switch {
		case e.Code == codeThrottled && strings.HasPrefix(e.Kind, "load: "):
			e.Expected = true
		case e.Code == codeBudget && strings.HasPrefix(e.Kind, "load: "):
			for _, g := range soakGroups {
				e.Expected = e.Expected || g.budgetDays > 0 && strings.HasSuffix(e.Kind, " in "+g.name)
			}
		case strings.HasSuffix(e.Kind, "wait_timeout"):
			// rgproxy's own doing: unexpected wherever it happens.
		case e.Code == codeBackendLost || e.Code == codeBackendDown,
			strings.HasSuffix(e.Kind, "driver: invalid connection"):
			// A statement racing the backend's stop with the close of
			// its idle connection sees the close as a direct client
			// would: expected only during the outage.
			e.Expected = e.Outside == 0
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kind < out[j].Kind })
	return out
}

// groupLoad is the load of one resource group: its users' workers.
type groupLoad struct {
	group    string // the group the user is bound to ("default": none)
	user     string
	sessions int // × --workers; 0 = 1
}

// worker runs a paced mix of statements as one user through one proxy
// until ctx ends: point selects, range aggregates, inserts, updates,
// deletes and transactions, on rows of its own (no lock waits between
// workers). Half the workers use server-side prepared statements, half
// interpolate parameters (COM_QUERY).
//
// It also tracks how long its statements were refused (8252) in a row:
// meanwhile its backend connection is idle, and a run longer than the
// backend's wait_timeout lets the backend close it; an error for that
// is told apart ("after refusals outlasting wait_timeout").
func worker(ctx context.Context, id int, gl groupLoad, addr string, rate float64, waitTimeout time.Duration, t *tally) {
	params := []string{}
	if id%2 == 0 {
		params = append(params, "interpolateParams")
	}
	db, err := sql.Open("mysql", dsn(addr, gl.user, "soakpw", "soak", params...))
	if err != nil {
		t.failure("load", gl.group, time.Now(), err, "")
		return
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	// Sessions are renewed now and then: a new session picks up a new
	// binding (the rotating group).
	db.SetConnMaxLifetime(20 * time.Second)
	rng := rand.New(rand.NewPCG(uint64(id), 42))
	tag := fmt.Sprintf("w%d", id)
	var mine []int64 // ids this worker inserted
	interval := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	reached := time.Now() // the last statement that reached the backend
	refusedSince := time.Time{}
	for ctx.Err() == nil {
		next = next.Add(interval)
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		} else {
			next = time.Now() // behind: no catch-up burst
		}
		err := op(ctx, db, rng, gl.group, tag, &mine)
		now := time.Now()
		_, code := classify(err)
		switch {
		case ctx.Err() != nil:
			return
		case code == codeThrottled || code == codeBudget:
			t.failure("load", gl.group, now, err, "")
			if refusedSince.IsZero() {
				refusedSince = now
			}
			t.refusalRun(gl.group, now.Sub(refusedSince))
			continue
		case err != nil:
			note := ""
			if now.Sub(reached) > waitTimeout && (code == codeBackendLost || errors.Is(err, mysql.ErrInvalidConn)) {
				note = " after refusals outlasting wait_timeout"
			}
			t.failure("load", gl.group, now, err, note)
			time.Sleep(50 * time.Millisecond) // the backend may be down: no hot loop
		default:
			t.success(gl.group, id)
		}
		reached, refusedSince = now, time.Time{}
	}
}

// op runs one operation of the mix.
func op(ctx context.Context, db *sql.DB, rng *rand.Rand, group, tag string, mine *[]int64) error {
	switch p := rng.IntN(100); {
	case p < 45: // point select
		var v sql.NullInt64
		err := db.QueryRowContext(ctx, "SELECT v FROM kv WHERE id = ?", 1+rng.IntN(seedRows)).Scan(&v)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		return err
	case p < 60: // range aggregate over a few thousand rows
		var n, sum sql.NullInt64
		return db.QueryRowContext(ctx, "SELECT COUNT(*), SUM(v) FROM kv WHERE grp = ?", rng.IntN(seedGroups)).Scan(&n, &sum)
	case p < 70: // insert
		res, err := db.ExecContext(ctx, "INSERT INTO kv (grp, v, pad) VALUES (?, ?, ?)", seedGroups+rng.IntN(4), rng.IntN(1000), tag+strings.Repeat("x", rng.IntN(150)))
		if err == nil {
			if id, ierr := res.LastInsertId(); ierr == nil {
				*mine = append(*mine, id)
			}
		}
		return err
	case p < 78: // update a row of its own (any row before it has one)
		id := int64(1 + rng.IntN(seedRows))
		if len(*mine) > 0 {
			id = (*mine)[rng.IntN(len(*mine))]
		}
		_, err := db.ExecContext(ctx, "UPDATE kv SET v = v + 1 WHERE id = ? AND pad LIKE ?", id, tag+"%")
		return err
	case p < 85: // delete its oldest row: the table stays bounded
		if len(*mine) < 50 {
			_, err := db.ExecContext(ctx, "DELETE FROM kv WHERE id = 0")
			return err
		}
		_, err := db.ExecContext(ctx, "DELETE FROM kv WHERE id = ?", (*mine)[0])
		if err == nil {
			*mine = (*mine)[1:]
		}
		return err
	default: // a transaction
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, "INSERT INTO kv (grp, v, pad) VALUES (?, ?, ?)", seedGroups+rng.IntN(4), 1, tag+"-tx")
		if err == nil && len(*mine) > 0 {
			_, err = tx.ExecContext(ctx, "UPDATE kv SET v = v + 1 WHERE id = ?", (*mine)[len(*mine)-1])
		}
		if err == nil {
			var v sql.NullInt64
			err = tx.QueryRowContext(ctx, "SELECT v FROM kv WHERE id = ?", 1+rng.IntN(seedRows)).Scan(&v)
			if errors.Is(err, sql.ErrNoRows) {
				err = nil
			}
		}
		if err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		if id, ierr := res.LastInsertId(); ierr == nil {
			*mine = append(*mine, id)
		}
		return nil
	}
}

// idleStats counts what the idle sessions saw.
type idleStats struct {
	resumed, failed atomic.Int64
}

// idler keeps one pooled session through addr, lets it idle past the
// backend's wait_timeout, then uses it again (alternately a SELECT and,
// as go-sql-driver's TestStaleConnectionChecks does, a BEGIN): the
// backend has closed it, so rgproxy must have closed the client, and the
// pool replaces the connection without an error.
func idler(ctx context.Context, id int, addr string, idle time.Duration, t *tally, st *idleStats) {
	db, err := sql.Open("mysql", dsn(addr, "soak_idle", "soakpw", "soak"))
	if err != nil {
		t.failure("idle", "default", time.Now(), err, "")
		return
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	first := true
	for i := 0; ctx.Err() == nil; i++ {
		var err error
		if i%2 == 0 {
			var one int
			err = db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
		} else {
			var tx *sql.Tx
			if tx, err = db.BeginTx(ctx, nil); err == nil {
				err = tx.Commit()
			}
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			st.failed.Add(1)
			t.failure("idle", "default", time.Now(), err, "")
		case !first:
			st.resumed.Add(1)
		}
		first = false
		select {
		case <-ctx.Done():
			return
		case <-time.After(idle + time.Duration(id)*300*time.Millisecond):
		}
	}
}
