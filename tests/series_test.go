package tests

import (
	"bufio"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// groupSeries scrapes statusAddr and returns every series of group:
// `name{labels}` → value text.
func groupSeries(t testing.TB, statusAddr, group string) map[string]string {
	t.Helper()
	resp, err := http.Get("http://" + statusAddr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", statusAddr, err)
	}
	defer resp.Body.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	want := `resource_group="` + group + `"`
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || !strings.Contains(line, want) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		out[line[:i]] = line[i+1:]
	}
	return out
}

// seriesValue finds the series of family name whose labels contain every
// one of labels.
func seriesValue(series map[string]string, name string, labels ...string) (string, bool) {
	for k, v := range series {
		if !strings.HasPrefix(k, name+"{") {
			continue
		}
		if !slices.ContainsFunc(labels, func(l string) bool { return !strings.Contains(k, l) }) {
			return v, true
		}
	}
	return "", false
}

// seriesAfterRead is group's series on statusAddr once they count the
// read statement just answered, or as they are after 5 s. rgproxy counts
// a statement once its answer is relayed (SessionPolicy.After), so a
// client can read /metrics first: beside a CPU hog one read class="read"
// 0 right after its statement.
func seriesAfterRead(t testing.TB, statusAddr, group string) map[string]string {
	t.Helper()
	waitMetric(t, statusAddr, 5*time.Second, func(s scrape) bool {
		return s.v("rgproxy_group_statements_total", "resource_group", group, "class", "read") > 0
	})
	return groupSeries(t, statusAddr, group)
}

// waitNoSeries polls until statusAddr exports no series of group.
func waitNoSeries(t testing.TB, statusAddr, group string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		s := groupSeries(t, statusAddr, group)
		if len(s) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still exports %d series of %s after %v: %v", statusAddr, len(s), group, within, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Issue 15's point 3: right after start, rgproxy's /metrics shows
// default's per-group series at 0 (throttled, consumed, statements) and
// rgserver's shows every group's; a group's series appear on a proxy at
// its first statement there; a dropped group's disappear from both; and a
// group idle on a proxy for --group-idle-expiry leaves that proxy's
// /metrics (and comes back at its next statement).
func TestPerGroupSeriesFromBirthUntilDropped(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts)

	def := groupSeries(t, px.StatusAddr, "default")
	for _, want := range []struct{ name, label string }{
		{"rgproxy_throttled_total", ""},
		{"rgproxy_ru_consumed_total", `type="rru"`},
		{"rgproxy_ru_consumed_total", `type="wru"`},
		{"rgproxy_group_statements_total", `class="read"`},
		{"rgproxy_group_statements_total", `class="write"`},
		{"rgproxy_group_statements_total", `class="other"`},
		{"rgproxy_tokens_granted_total", ""},
		{"rgproxy_throttle_wait_seconds_count", ""},
	} {
		if v, ok := seriesValue(def, want.name, want.label); !ok || v != "0" {
			t.Errorf("right after start, default's %s{%s} = %q (present %v), want 0", want.name, want.label, v, ok)
		}
	}
	if v, ok := seriesValue(def, "rgproxy_group_ru_per_sec"); !ok || v != "+Inf" {
		t.Errorf("default's rgproxy_group_ru_per_sec = %q (present %v), want +Inf", v, ok)
	}

	adminExec(t, px.Addr, "CREATE RESOURCE GROUP rg_series RU_PER_SEC = 1000",
		"CREATE RESOURCE GROUP rg_series_idle RU_PER_SEC = 1000")
	// rgserver: every group from its creation, at 0.
	for _, g := range []string{"default", "rg_series", "rg_series_idle"} {
		if v, ok := seriesValue(groupSeries(t, ts.StatusAddr, g), "rgserver_ru_consumed_total", `type="rru"`); !ok || (g != "default" && v != "0") {
			t.Errorf("rgserver's rgserver_ru_consumed_total of %s = %q (present %v), want present (0 for a new group)", g, v, ok)
		}
	}
	// rgproxy: nothing for a group it never served.
	if s := groupSeries(t, px.StatusAddr, "rg_series"); len(s) != 0 {
		t.Fatalf("series of a group before its first statement here: %v", s)
	}

	db := openDB(t, px.Addr)
	if _, err := db.Exec("SELECT /*+ RESOURCE_GROUP(rg_series) */ 1"); err != nil {
		t.Fatal(err)
	}
	s := seriesAfterRead(t, px.StatusAddr, "rg_series")
	for _, want := range []struct{ name, label, value string }{
		{"rgproxy_throttled_total", "", "0"},
		{"rgproxy_ru_consumed_total", `type="wru"`, "0"},
		{"rgproxy_group_statements_total", `class="read"`, "1"},
		{"rgproxy_group_statements_total", `class="write"`, "0"},
		{"rgproxy_group_ru_per_sec", "", "1000"},
		{"rgproxy_throttle_wait_seconds_count", "", "1"},
		{"rgproxy_tokens_granted_total", "", ""},
		{"rgproxy_token_requests_total", "", ""},
		{"rgproxy_group_tokens", "", ""},
	} {
		v, ok := seriesValue(s, want.name, want.label)
		if !ok || (want.value != "" && v != want.value) {
			t.Errorf("after its first statement, rg_series' %s{%s} = %q (present %v), want %q", want.name, want.label, v, ok, want.value)
		}
	}

	adminExec(t, px.Addr, "DROP RESOURCE GROUP rg_series")
	waitNoSeries(t, px.StatusAddr, "rg_series", 10*time.Second)
	waitNoSeries(t, ts.StatusAddr, "rg_series", 10*time.Second)
	if len(groupSeries(t, px.StatusAddr, "default")) == 0 {
		t.Fatal("default's series went with the dropped group")
	}

	// Idle expiry, on a proxy of its own with a short one.
	idle := startMeteredProxy(t, ts, "--group-idle-expiry", "2s")
	idb := openDB(t, idle.Addr)
	if _, err := idb.Exec("SELECT /*+ RESOURCE_GROUP(rg_series_idle) */ 1"); err != nil {
		t.Fatal(err)
	}
	if _, ok := seriesValue(seriesAfterRead(t, idle.StatusAddr, "rg_series_idle"), "rgproxy_group_statements_total", `class="read"`); !ok {
		t.Fatal("rg_series_idle has no series after its statement")
	}
	waitNoSeries(t, idle.StatusAddr, "rg_series_idle", 15*time.Second)
	if len(groupSeries(t, ts.StatusAddr, "rg_series_idle")) == 0 {
		t.Fatal("an idle group left rgserver's /metrics: only a proxy forgets it")
	}
	if len(groupSeries(t, idle.StatusAddr, "default")) == 0 {
		t.Fatal("default expired")
	}
	if _, err := idb.Exec("SELECT /*+ RESOURCE_GROUP(rg_series_idle) */ 1"); err != nil {
		t.Fatal(err)
	}
	s = seriesAfterRead(t, idle.StatusAddr, "rg_series_idle")
	if v, ok := seriesValue(s, "rgproxy_throttled_total"); !ok || v != "0" {
		t.Fatalf("rg_series_idle used again: throttled %q (present %v)", v, ok)
	}
	if _, ok := seriesValue(s, "rgproxy_group_statements_total", `class="read"`); !ok {
		t.Fatalf("rg_series_idle used again: no statements series: %v", s)
	}
}
