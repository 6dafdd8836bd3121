package main

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

func TestCounterAccAcrossRestarts(t *testing.T) {
	a := newCounterAcc()
	a.observe("rgs1:10", "g", 100, true) // baseline
	a.observe("rgs1:10", "g", 130, false)
	a.observe("rgs2:11", "g", 0, false)  // a follower, born at 0
	a.observe("rgs1:10", "g", 20, false) // went down: restarted, counted from 0
	a.observe("rgs2:11", "g", 7, false)
	a.observe("rgs1:10", "h", 5, false) // a group born after the baseline
	if a.total["g"] != 30+20+7 || a.total["h"] != 5 {
		t.Fatalf("totals %v", a.total)
	}
}

func TestAltLimit(t *testing.T) {
	t0 := time.Unix(1000, 0)
	d := newDDL(nil)
	d.alt = []altChange{{at: t0.Add(10 * time.Second), rate: altHigh}, {at: t0.Add(30 * time.Second), rate: altLow}}
	// 10 s at 25, 20 s at 75, 10 s at 25, plus 1 s of the highest rate.
	want := 10.0*altLow + 20*altHigh + 10*altLow + altHigh
	if got := d.altLimit(t0, t0.Add(40*time.Second)); math.Abs(got-want) > 1e-9 {
		t.Fatalf("altLimit = %v, want %v", got, want)
	}
	// A change after the window does not count.
	if got, want := d.altLimit(t0, t0.Add(5*time.Second)), 5.0*altLow+altLow; math.Abs(got-want) > 1e-9 {
		t.Fatalf("altLimit of the first 5 s = %v, want %v", got, want)
	}
}

func TestTallyJudgesKinds(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tl := newTally(t0)
	tl.addWindow(window{from: t0.Add(100 * time.Second)})
	tl.closeWindow(t0.Add(110 * time.Second))
	my := func(code uint16) error { return &mysql.MySQLError{Number: code, Message: "x"} }
	tl.failure("load", "g", t0.Add(5*time.Second), my(codeThrottled), "")
	tl.failure("load", "g", t0.Add(105*time.Second), my(codeBackendLost), "")
	tl.failure("load", "g", t0.Add(105*time.Second), my(codeBackendDown), "")
	tl.failure("load", "g", t0.Add(200*time.Second), my(codeBackendDown), "") // outside the outage
	tl.failure("load", "g", t0.Add(106*time.Second), fmt.Errorf("exec: %w", mysql.ErrInvalidConn), "")
	tl.failure("load", "g", t0.Add(50*time.Second), my(codeBackendLost), " after refusals outlasting wait_timeout")
	tl.failure("load", "g", t0.Add(105*time.Second), my(1213), "")
	tl.failure("idle", "default", t0.Add(5*time.Second), errors.New("something else"), "")
	tl.failure("load", "soak_budget", t0.Add(7*time.Second), my(codeBudget), "")
	tl.failure("load", "g", t0.Add(7*time.Second), my(codeBudget), "") // a group without a budget
	want := map[string]bool{
		"load: mysql 8255 in soak_budget": true, "load: mysql 8255 in g": false,
		"load: mysql 8252": true, "load: mysql 1927": true, "load: mysql 9001": false,
		"load: driver: invalid connection": true, "load: mysql 1927 after refusals outlasting wait_timeout": false,
		"load: mysql 1213": false, "idle: other: something else": false,
	}
	got := map[string]bool{}
	for _, k := range tl.kindsSorted() {
		got[k.Kind] = k.Expected
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("judged\n%v\nwant\n%v", got, want)
	}
	if tl.refused["g"] != 1 || tl.budgetRefused["soak_budget"] != 1 || tl.budgetRefused["g"] != 1 {
		t.Fatalf("refused %v, by budgets %v", tl.refused, tl.budgetRefused)
	}
}

// TestBudgetLimit: the budget's group may spend its DAY budget in every
// compressed day the load touches, with slack for the crossing's
// reaction (2 s a day) and the leader kill (10 s).
func TestBudgetLimit(t *testing.T) {
	g := limited{name: "b", ruPerSec: 40, budgetDays: 0.75}
	if got := g.budgetRU(time.Minute); got != 1800 {
		t.Fatalf("budgetRU = %v, want 1800", got)
	}
	day := time.Minute
	from := time.Unix(6000, 0).Add(30 * time.Second) // mid-day
	for _, c := range []struct {
		to   time.Duration
		days float64
	}{{10 * time.Second, 1}, {30 * time.Second, 2}, {10 * time.Minute, 11}} {
		want := c.days*(1800+80) + 400
		if got := budgetLimit(g, day, from, from.Add(c.to)); got != want {
			t.Errorf("%v of load: %v, want %v", c.to, got, want)
		}
	}
}
