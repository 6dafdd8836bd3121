package resourcegroup

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/rgproxy/rgproxy/sqltext"
)

func strp(s string) *string { return &s }

func TestSQL(t *testing.T) {
	tests := []struct {
		g    Group
		want string
	}{
		{DefaultGroupDefinition(), "CREATE RESOURCE GROUP `default` RU_PER_SEC=UNLIMITED PRIORITY=MEDIUM BURSTABLE=UNLIMITED"},
		{Group{Name: "rg1", RUPerSec: 500, Priority: PriorityHigh, Burst: BurstModerated,
			QueryLimit: &QueryLimit{ExecElapsed: time.Minute, Action: ActionKill, Watch: WatchSimilar, WatchDuration: 10 * time.Minute}},
			"CREATE RESOURCE GROUP `rg1` RU_PER_SEC=500 PRIORITY=HIGH BURSTABLE=MODERATED QUERY_LIMIT=(EXEC_ELAPSED='1m0s', ACTION=KILL, WATCH=SIMILAR DURATION='10m0s')"},
		{Group{Name: "x", RUPerSec: 3000, Priority: PriorityLow, QueryLimit: &QueryLimit{ExecElapsed: 15 * time.Second, Action: ActionKill}},
			"CREATE RESOURCE GROUP `x` RU_PER_SEC=3000 PRIORITY=LOW QUERY_LIMIT=(EXEC_ELAPSED='15s', ACTION=KILL)"},
		{Group{Name: "a`b", RUPerSec: 1, QueryLimit: &QueryLimit{RU: 30, Action: ActionSwitchGroup, SwitchGroup: "quarantine", Watch: WatchExact}},
			"CREATE RESOURCE GROUP `a``b` RU_PER_SEC=1 PRIORITY=MEDIUM QUERY_LIMIT=(RU=30, ACTION=SWITCH_GROUP(quarantine), WATCH=EXACT DURATION=UNLIMITED)"},
		{Group{Name: "x", RUPerSec: 1, QueryLimit: &QueryLimit{RU: 30, Action: ActionSwitchGroup, SwitchGroup: "my group"}},
			"CREATE RESOURCE GROUP `x` RU_PER_SEC=1 PRIORITY=MEDIUM QUERY_LIMIT=(RU=30, ACTION=SWITCH_GROUP(`my group`))"},
		{Group{Name: "x", RUPerSec: 1, QueryLimit: &QueryLimit{RU: 30, Action: ActionSwitchGroup, SwitchGroup: "123"}},
			"CREATE RESOURCE GROUP `x` RU_PER_SEC=1 PRIORITY=MEDIUM QUERY_LIMIT=(RU=30, ACTION=SWITCH_GROUP(`123`))"},
		{Group{Name: "w", RUPerSec: 10, Mode: ModeWarn, MaxConcurrency: 4},
			"CREATE RESOURCE GROUP `w` RU_PER_SEC=10 PRIORITY=MEDIUM MODE=WARN MAX_CONCURRENCY=4"},
		{Group{Name: "o", RUPerSec: 10, Mode: ModeOff}, "CREATE RESOURCE GROUP `o` RU_PER_SEC=10 PRIORITY=MEDIUM MODE=OFF"},
		{Group{Name: "app", RUPerSec: 10, Burst: BurstUnlimited, Parent: "team`1"},
			"CREATE RESOURCE GROUP `app` RU_PER_SEC=10 PRIORITY=MEDIUM BURSTABLE=UNLIMITED PARENT=`team``1`"},
	}
	for _, tt := range tests {
		if got := tt.g.SQL(); got != tt.want {
			t.Errorf("SQL()\n got  %s\n want %s", got, tt.want)
		}
	}
}

func TestInfoSchemaRow(t *testing.T) {
	tests := []struct {
		g    Group
		want []*string
	}{
		{DefaultGroupDefinition(), []*string{strp("default"), strp("UNLIMITED"), strp("MEDIUM"), strp("UNLIMITED"), nil, nil, strp("ENFORCE"), nil, nil, nil}},
		{Group{Name: "x", RUPerSec: 2000, Priority: PriorityLow, Burst: BurstOff, QueryLimit: &QueryLimit{ExecElapsed: 15 * time.Second, Action: ActionKill}},
			[]*string{strp("x"), strp("2000"), strp("LOW"), strp("OFF"), strp("EXEC_ELAPSED='15s', ACTION=KILL"), nil, strp("ENFORCE"), nil, nil, nil}},
		{Group{Name: "y", RUPerSec: 1, Burst: BurstModerated, QueryLimit: &QueryLimit{ExecElapsed: time.Second, Action: ActionCooldown, Watch: WatchExact, WatchDuration: time.Hour}},
			[]*string{strp("y"), strp("1"), strp("MEDIUM"), strp("MODERATED"), strp("EXEC_ELAPSED='1s', ACTION=COOLDOWN, WATCH=EXACT DURATION='1h0m0s'"), nil, strp("ENFORCE"), nil, nil, nil}},
		{Group{Name: "z", RUPerSec: 1, QueryLimit: &QueryLimit{RU: 9, Action: ActionSwitchGroup, SwitchGroup: "q", Watch: WatchSimilar}},
			[]*string{strp("z"), strp("1"), strp("MEDIUM"), strp("OFF"), strp("RU=9, ACTION=SWITCH_GROUP(q), WATCH=SIMILAR DURATION=UNLIMITED"), nil, strp("ENFORCE"), nil, nil, nil}},
		{Group{Name: "w", RUPerSec: 10, Mode: ModeWarn, MaxConcurrency: 4},
			[]*string{strp("w"), strp("10"), strp("MEDIUM"), strp("OFF"), nil, nil, strp("WARN"), strp("4"), nil, nil}},
	}
	for _, tt := range tests {
		if got := InfoSchemaRow(tt.g); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("InfoSchemaRow(%s) = %v, want %v", tt.g.Name, deref(got), deref(tt.want))
		}
	}
}

func deref(row []*string) []string {
	out := make([]string, len(row))
	for i, p := range row {
		if p == nil {
			out[i] = "NULL"
		} else {
			out[i] = *p
		}
	}
	return out
}

func TestEnumStrings(t *testing.T) {
	for _, s := range []string{Priority(9).String(), BurstMode(9).String(), Action(9).String(), WatchType(9).String()} {
		if !strings.Contains(s, "(9)") {
			t.Errorf("unknown value renders as %q", s)
		}
	}
	if ActionNone.String() != "NONE" || WatchNone.String() != "NONE" {
		t.Error("NONE names")
	}
}

// randomGroup builds a valid group from r: names mix case-safe letters,
// digits, '_', '$' and non-ASCII letters (all a new name may hold), and
// every number and duration spans its whole range.
func randomGroup(r *rand.Rand) Group {
	name := func() string {
		rs := []rune("abcxyz019_$é組")
		var b strings.Builder
		for n := 1 + r.IntN(MaxNameLength); n > 0; n-- {
			c := rs[r.IntN(len(rs))]
			if b.Len()+utf8.RuneLen(c) > MaxNameLength {
				break
			}
			b.WriteRune(c)
		}
		return b.String()
	}
	g := Group{Name: name(), Priority: Priority(r.IntN(3)), Burst: BurstMode(r.IntN(3)), Mode: Mode(r.IntN(3))}
	if r.IntN(2) == 0 {
		g.MaxConcurrency = 1 + r.Uint64N(MaxConcurrencyCap)
	}
	if r.IntN(5) == 0 {
		g.RUPerSec = Unlimited
	} else {
		g.RUPerSec = 1 + r.Uint64N(MaxRU)
		if r.IntN(2) == 0 {
			g.RUPerSec = 1 + r.Uint64N(100000)
		}
	}
	if r.IntN(3) > 0 {
		q := &QueryLimit{Action: Action(1 + r.IntN(4))}
		if r.IntN(2) == 0 {
			q.ExecElapsed = time.Duration(1+r.Int64N(int64(MaxExecElapsed/DurationUnit))) * DurationUnit
		} else {
			q.RU = 1 + r.Uint64N(MaxRU)
		}
		if q.Action == ActionSwitchGroup {
			for q.SwitchGroup == "" || q.SwitchGroup == g.Name {
				q.SwitchGroup = name()
			}
		}
		q.Watch = WatchType(r.IntN(3))
		if q.Watch != WatchNone && r.IntN(2) == 0 {
			q.WatchDuration = time.Duration(1+r.Int64N(int64(MaxWatchDuration/DurationUnit))) * DurationUnit
		}
		g.QueryLimit = q
	}
	g.Budgets = randomBudgets(r, g.RUPerSec)
	return g
}

// randomBudgets builds valid budgets for a group of RU_PER_SEC rate: any
// subset of the periods, 1 to 4 triggers each in increasing percent, a
// THROTTLE below the rate (a group of rate 1 has none).
func randomBudgets(r *rand.Rand, rate uint64) []Budget {
	var bs []Budget
	for p := PeriodHour; p <= PeriodMonth; p++ {
		if r.IntN(3) != 0 {
			continue
		}
		b := Budget{Period: p, RU: 1 + r.Uint64N(MaxRU)}
		percent := uint32(0)
		for n := 1 + r.IntN(MaxBudgetTriggers); n > 0; n-- {
			left := MaxBudgetPercent - percent - uint32(n) + 1 // room for the ones after
			percent += 1 + uint32(r.IntN(int(min(left, 300))))
			tr := BudgetTrigger{Percent: percent, Action: BudgetAction(1 + r.IntN(3))}
			if tr.Action == BudgetThrottle {
				max := min(rate-1, MaxRU)
				if max == 0 {
					tr.Action = BudgetRefuse
				} else {
					tr.ThrottleRUPerSec = 1 + r.Uint64N(max)
				}
			}
			b.Triggers = append(b.Triggers, tr)
		}
		bs = append(bs, b)
	}
	return bs
}

// TestRoundTrip is the property Parse(g.SQL(), sqltext.Mode{}) == g over random valid groups.
func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		g := randomGroup(r)
		if err := g.Validate(); err != nil {
			t.Fatalf("#%d: generator made an invalid group %+v: %v", i, g, err)
		}
		sql := g.SQL()
		st, err := Parse(sql, sqltext.Mode{})
		if err != nil {
			t.Fatalf("#%d: Parse(%s): %v", i, sql, err)
		}
		c, ok := st.(*CreateGroup)
		if !ok || !reflect.DeepEqual(c.Group, g) {
			t.Fatalf("#%d: round trip of %s\n got  %#v\n want %#v", i, sql, st, g)
		}
		if !IsAdmin(sql, sqltext.Mode{}) {
			t.Fatalf("#%d: IsAdmin(%s) = false", i, sql)
		}
	}
}
