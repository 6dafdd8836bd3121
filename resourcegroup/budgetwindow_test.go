package resourcegroup

import (
	"math/rand/v2"
	"testing"
	"time"
	_ "time/tzdata" // the zones below, wherever the tests run
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// utc parses an instant written in UTC.
func utc(s string) time.Time {
	t, err := time.Parse("2006-01-02 15:04:05.999999999", s)
	if err != nil {
		panic(err)
	}
	return t
}

// BudgetWindow's windows across month ends, leap years, weeks from
// Monday, daylight-saving changes both ways (on the hour and at midnight)
// and zones whose offset is not whole hours.
func TestBudgetWindow(t *testing.T) {
	tests := []struct {
		name       string
		zone       string
		p          BudgetPeriod
		t          string // UTC
		start, end string // UTC
	}{
		{"hour", "UTC", PeriodHour, "2026-11-28 06:31:57", "2026-11-28 06:00:00", "2026-11-28 07:00:00"},
		{"hour at its start", "UTC", PeriodHour, "2026-11-28 06:00:00", "2026-11-28 06:00:00", "2026-11-28 07:00:00"},
		{"hour's last nanosecond", "UTC", PeriodHour, "2026-11-28 06:59:59.999999999", "2026-11-28 06:00:00", "2026-11-28 07:00:00"},
		{"day", "UTC", PeriodDay, "2026-11-28 06:31:57", "2026-11-28 00:00:00", "2026-11-29 00:00:00"},
		{"day of Feb 29", "UTC", PeriodDay, "2028-02-29 12:00:00", "2028-02-29 00:00:00", "2028-03-01 00:00:00"},
		{"week from Monday (Saturday)", "UTC", PeriodWeek, "2026-11-28 06:31:57", "2026-11-23 00:00:00", "2026-11-30 00:00:00"},
		{"week: Sunday is its last day", "UTC", PeriodWeek, "2026-11-29 23:59:59", "2026-11-23 00:00:00", "2026-11-30 00:00:00"},
		{"week: Monday midnight begins one", "UTC", PeriodWeek, "2026-11-30 00:00:00", "2026-11-30 00:00:00", "2026-12-07 00:00:00"},
		{"week across the new year", "UTC", PeriodWeek, "2027-01-01 10:00:00", "2026-12-28 00:00:00", "2027-01-04 00:00:00"},
		{"month of 31 days, last instant", "UTC", PeriodMonth, "2026-01-31 23:59:59.999999999", "2026-01-01 00:00:00", "2026-02-01 00:00:00"},
		{"month across the new year", "UTC", PeriodMonth, "2026-12-31 23:00:00", "2026-12-01 00:00:00", "2027-01-01 00:00:00"},
		{"February of a leap year", "UTC", PeriodMonth, "2028-02-29 23:00:00", "2028-02-01 00:00:00", "2028-03-01 00:00:00"},
		{"February of 2026", "UTC", PeriodMonth, "2026-02-28 23:00:00", "2026-02-01 00:00:00", "2026-03-01 00:00:00"},
		{"February of 2100 (not leap)", "UTC", PeriodMonth, "2100-02-28 23:00:00", "2100-02-01 00:00:00", "2100-03-01 00:00:00"},
		{"February of 2000 (leap)", "UTC", PeriodMonth, "2000-02-29 23:00:00", "2000-02-01 00:00:00", "2000-03-01 00:00:00"},
		{"month of 30 days", "UTC", PeriodMonth, "2026-04-30 12:00:00", "2026-04-01 00:00:00", "2026-05-01 00:00:00"},

		// New York springs forward on 2026-03-08 at 02:00 EST (07:00 UTC) to 03:00 EDT.
		{"NY day of 23 hours", "America/New_York", PeriodDay, "2026-03-08 12:00:00", "2026-03-08 05:00:00", "2026-03-09 04:00:00"},
		{"NY hour before the jump ends at it", "America/New_York", PeriodHour, "2026-03-08 06:30:00", "2026-03-08 06:00:00", "2026-03-08 07:00:00"},
		{"NY hour after the jump (03:00 EDT)", "America/New_York", PeriodHour, "2026-03-08 07:30:00", "2026-03-08 07:00:00", "2026-03-08 08:00:00"},
		{"NY week of 167 hours", "America/New_York", PeriodWeek, "2026-03-08 12:00:00", "2026-03-02 05:00:00", "2026-03-09 04:00:00"},
		{"NY month of March", "America/New_York", PeriodMonth, "2026-03-15 12:00:00", "2026-03-01 05:00:00", "2026-04-01 04:00:00"},
		{"NY day: UTC's next day, local evening", "America/New_York", PeriodDay, "2026-11-29 03:00:00", "2026-11-28 05:00:00", "2026-11-29 05:00:00"},
		// ... and falls back on 2026-11-01 at 02:00 EDT (06:00 UTC) to 01:00 EST.
		{"NY day of 25 hours", "America/New_York", PeriodDay, "2026-11-01 12:00:00", "2026-11-01 04:00:00", "2026-11-02 05:00:00"},
		{"NY repeated hour, first time (01:30 EDT)", "America/New_York", PeriodHour, "2026-11-01 05:30:00", "2026-11-01 05:00:00", "2026-11-01 07:00:00"},
		{"NY repeated hour, second time (01:30 EST)", "America/New_York", PeriodHour, "2026-11-01 06:30:00", "2026-11-01 05:00:00", "2026-11-01 07:00:00"},
		{"NY hour after the repeated one", "America/New_York", PeriodHour, "2026-11-01 07:00:00", "2026-11-01 07:00:00", "2026-11-01 08:00:00"},

		// Berlin: CEST from 2026-03-29 01:00 UTC.
		{"Berlin day of 23 hours", "Europe/Berlin", PeriodDay, "2026-03-29 10:00:00", "2026-03-28 23:00:00", "2026-03-29 22:00:00"},
		{"Berlin month: UTC's October is local November", "Europe/Berlin", PeriodMonth, "2026-10-31 23:30:00", "2026-10-31 23:00:00", "2026-11-30 23:00:00"},

		// São Paulo sprang forward at midnight on 2018-11-04 (00:00 -03 →
		// 01:00 -02): that day begins at the jump; it fell back at midnight
		// on 2019-02-17 (00:00 -02 → 23:00 -03): the 16th has 25 hours.
		{"São Paulo day begins at the jump", "America/Sao_Paulo", PeriodDay, "2018-11-04 12:00:00", "2018-11-04 03:00:00", "2018-11-05 02:00:00"},
		{"São Paulo day before it", "America/Sao_Paulo", PeriodDay, "2018-11-04 02:59:59", "2018-11-03 03:00:00", "2018-11-04 03:00:00"},
		{"São Paulo week (Monday 2018-10-29)", "America/Sao_Paulo", PeriodWeek, "2018-11-04 12:00:00", "2018-10-29 03:00:00", "2018-11-05 02:00:00"},
		{"São Paulo repeated 23:30", "America/Sao_Paulo", PeriodDay, "2019-02-17 02:30:00", "2019-02-16 02:00:00", "2019-02-17 03:00:00"},

		// Kolkata is +05:30: hours begin at :30 UTC.
		{"Kolkata hour", "Asia/Kolkata", PeriodHour, "2026-11-28 06:31:57", "2026-11-28 06:30:00", "2026-11-28 07:30:00"},
		{"Kolkata day", "Asia/Kolkata", PeriodDay, "2026-11-28 20:00:00", "2026-11-28 18:30:00", "2026-11-29 18:30:00"},
		// Kathmandu is +05:45.
		{"Kathmandu hour", "Asia/Kathmandu", PeriodHour, "2026-11-28 06:31:57", "2026-11-28 06:15:00", "2026-11-28 07:15:00"},
		// Samoa skipped 2011-12-30: the 29th (-10) ends where the 31st (+14) begins.
		{"Apia day before the skipped one", "Pacific/Apia", PeriodDay, "2011-12-30 09:00:00", "2011-12-29 10:00:00", "2011-12-30 10:00:00"},
		{"Apia day after it", "Pacific/Apia", PeriodDay, "2011-12-30 10:00:00", "2011-12-30 10:00:00", "2011-12-31 10:00:00"},
	}
	for _, tt := range tests {
		loc := mustZone(t, tt.zone)
		start, end := BudgetWindow(tt.p, utc(tt.t), loc)
		if !start.Equal(utc(tt.start)) || !end.Equal(utc(tt.end)) {
			t.Errorf("%s: BudgetWindow(%s, %s, %s) = [%s, %s), want [%s, %s)", tt.name, tt.p, tt.t, tt.zone,
				start.UTC().Format(time.DateTime), end.UTC().Format(time.DateTime), tt.start, tt.end)
		}
		if start.Location() != loc || end.Location() != loc {
			t.Errorf("%s: the window is not in %s: %v %v", tt.name, tt.zone, start.Location(), end.Location())
		}
	}
	// nil is UTC.
	if s, e := BudgetWindow(PeriodDay, utc("2026-11-28 06:31:57"), nil); !s.Equal(utc("2026-11-28 00:00:00")) || !e.Equal(utc("2026-11-29 00:00:00")) {
		t.Errorf("nil location: [%v, %v)", s, e)
	}
}

// Windows tile time in every zone: t is in its window, a window's end
// begins the next one, and its start is its own window's start — at
// random instants and around every change of offset from 2010 to 2028.
func TestBudgetWindowTiles(t *testing.T) {
	zones := []string{"UTC", "America/New_York", "Europe/Berlin", "Asia/Kolkata", "Asia/Kathmandu", "Australia/Lord_Howe",
		"America/Sao_Paulo", "Pacific/Chatham", "America/Havana", "Pacific/Apia", "America/St_Johns", "Asia/Tehran"}
	rng := rand.New(rand.NewPCG(30, 2))
	from, to := utc("2010-01-01 00:00:00"), utc("2028-01-01 00:00:00")
	for _, z := range zones {
		loc := mustZone(t, z)
		var instants []time.Time
		for range 300 {
			instants = append(instants, from.Add(time.Duration(rng.Int64N(int64(to.Sub(from))))))
		}
		for c := from; c.Before(to); {
			_, next := c.In(loc).ZoneBounds()
			if next.IsZero() {
				break
			}
			for _, d := range []time.Duration{-time.Hour, -30 * time.Minute, -time.Nanosecond, 0, time.Nanosecond, 30 * time.Minute, time.Hour} {
				instants = append(instants, next.Add(d))
			}
			c = next
		}
		for _, at := range instants {
			for p := PeriodHour; p <= PeriodMonth; p++ {
				start, end := BudgetWindow(p, at, loc)
				if at.Before(start) || !at.Before(end) {
					t.Fatalf("%s %s at %s: [%s, %s) does not hold it", z, p, at, start, end)
				}
				if s2, e2 := BudgetWindow(p, start, loc); !s2.Equal(start) || !e2.Equal(end) {
					t.Fatalf("%s %s: the window of its start %s is [%s, %s)", z, p, start, s2, e2)
				}
				if s3, _ := BudgetWindow(p, end, loc); !s3.Equal(end) {
					t.Fatalf("%s %s: the window after [%s, %s) starts at %s", z, p, start, end, s3)
				}
				if _, e4 := BudgetWindow(p, start.Add(-time.Nanosecond), loc); !e4.Equal(start) {
					t.Fatalf("%s %s: the window before [%s, %s) ends at %s", z, p, start, end, e4)
				}
			}
		}
	}
}

// BudgetWindow allocates nothing: enforcement will ask it often.
func TestBudgetWindowAllocs(t *testing.T) {
	loc := mustZone(t, "America/New_York")
	at := utc("2026-11-01 06:30:00")
	if n := testing.AllocsPerRun(100, func() { BudgetWindow(PeriodHour, at, loc) }); n != 0 {
		t.Errorf("BudgetWindow: %v allocations", n)
	}
}

func BenchmarkBudgetWindow(b *testing.B) {
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		b.Fatal(err)
	}
	at := utc("2026-11-28 06:31:57")
	for b.Loop() {
		for p := PeriodHour; p <= PeriodMonth; p++ {
			BudgetWindow(p, at, loc)
		}
	}
}

// TestBudgetCalendarCompressed: with a DayLength other than 24 h the
// windows are the compressed calendar's, aligned to the Unix epoch
// whatever the zone; with 24 h (or 0) they are the zone's.
func TestBudgetCalendarCompressed(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip(err)
	}
	c := BudgetCalendar{Loc: berlin, DayLength: 24 * time.Second}
	at := time.Unix(1_000_000_005, 500_000_000) // 1e9 = 41,666,666 days of 24 s + 16 s
	for _, tc := range []struct {
		p          BudgetPeriod
		start, len int64 // seconds
	}{
		{PeriodHour, 1_000_000_005, 1},
		{PeriodDay, 1_000_000_000 - 16, 24},
		{PeriodWeek, 1_000_000_000 - 1_000_000_000%168, 168},
		{PeriodMonth, 1_000_000_000 - 1_000_000_000%720, 720},
	} {
		start, end := c.Window(tc.p, at)
		if start.Unix() != tc.start || end.Sub(start) != time.Duration(tc.len)*time.Second {
			t.Errorf("%s: [%v, %v)", tc.p, start.Unix(), end.Unix())
		}
	}
	for _, real := range []BudgetCalendar{{Loc: berlin}, {Loc: berlin, DayLength: 24 * time.Hour}} {
		start, end := real.Window(PeriodDay, at)
		ws, we := BudgetWindow(PeriodDay, at, berlin)
		if !start.Equal(ws) || !end.Equal(we) {
			t.Errorf("%+v: [%v, %v), the zone's [%v, %v)", real, start, end, ws, we)
		}
	}
	// A state on the compressed calendar rolls over with it.
	s := NewBudgetStateIn([]Budget{{Period: PeriodDay, RU: 10, Triggers: []BudgetTrigger{{Percent: 100, Action: BudgetRefuse}}}}, c, at, nil)
	s.Spend(10, at)
	if v := s.Verdict(at); v.Action != BudgetRefuse || v.End.Unix() != 1_000_000_000+8 {
		t.Errorf("verdict %+v", v)
	}
	if v := s.Verdict(time.Unix(1_000_000_008, 0)); v.Action != 0 {
		t.Errorf("after the compressed day: %+v", v)
	}
}

// TestBudgetStateExhausted: a window knows when it ran out — the Spend
// that reached its RU, or the Seed that showed it spent — keeps that
// time while it stays spent (a redefinition included), and forgets it
// when the window rolls over or a larger budget leaves room again.
func TestBudgetStateExhausted(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	day := func(ru uint64) []Budget { return []Budget{{Period: PeriodDay, RU: ru}} }
	exhausted := func(s *BudgetState, now time.Time) time.Time { return s.Windows(now)[0].Exhausted }

	s := NewBudgetState(day(100), nil, t0, nil)
	s.Spend(60, t0.Add(time.Minute))
	if x := exhausted(s, t0.Add(time.Minute)); !x.IsZero() {
		t.Fatalf("60 of 100 spent: exhausted at %v", x)
	}
	ranOut := t0.Add(2 * time.Minute)
	s.Spend(50, ranOut)
	s.Spend(5, ranOut.Add(time.Minute))
	if x := exhausted(s, t0.Add(time.Hour)); !x.Equal(ranOut) {
		t.Fatalf("exhausted at %v, want %v (the Spend that reached 100)", x, ranOut)
	}
	if x := exhausted(NewBudgetState(day(80), nil, t0.Add(time.Hour), s), t0.Add(time.Hour)); !x.Equal(ranOut) {
		t.Errorf("a smaller budget, still spent: exhausted at %v, want %v", x, ranOut)
	}
	if x := exhausted(NewBudgetState(day(1000), nil, t0.Add(time.Hour), s), t0.Add(time.Hour)); !x.IsZero() {
		t.Errorf("a larger budget with room: exhausted at %v", x)
	}
	if x := exhausted(s, t0.Add(24*time.Hour)); !x.IsZero() {
		t.Errorf("the next day's window: exhausted at %v", x)
	}

	seeded := NewBudgetState(day(100), nil, t0, nil)
	start := seeded.Windows(t0)[0].Start
	seeded.Seed(PeriodDay, start, 150, t0.Add(time.Minute))
	if x := exhausted(seeded, t0.Add(time.Hour)); !x.Equal(t0.Add(time.Minute)) {
		t.Errorf("seeded spent: exhausted at %v, want the seed's time", x)
	}
}
