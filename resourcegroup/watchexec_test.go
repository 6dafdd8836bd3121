package resourcegroup

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/sqltext"
)

func TestExecuteWatches(t *testing.T) {
	ctx := context.Background()
	store := NewMemStore()
	run := func(sql string, prep func(*QueryWatchAdd)) (*Result, error) {
		t.Helper()
		st, err := Parse(sql, sqltext.Mode{})
		if err != nil {
			t.Fatalf("Parse(%s): %v", sql, err)
		}
		if a, ok := st.(*QueryWatchAdd); ok && prep != nil {
			prep(a)
		}
		return Execute(ctx, st, store)
	}
	for _, sql := range []string{
		"CREATE RESOURCE GROUP rg1 RU_PER_SEC = 10 QUERY_LIMIT = (EXEC_ELAPSED = '1s', ACTION = COOLDOWN, WATCH = SIMILAR DURATION = '10m')",
		"CREATE RESOURCE GROUP rg2 RU_PER_SEC = 10",
	} {
		if _, err := run(sql, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Without ACTION the group's rule applies, and its DURATION.
	res, err := run("QUERY WATCH ADD RESOURCE GROUP rg1 SQL TEXT EXACT TO 'select sleep(5)'", nil)
	if err != nil || len(res.Rows) != 1 || *res.Rows[0][0] != "1" {
		t.Fatalf("add exact: %v %v", res, err)
	}
	// SIMILAR needs the caller's digest.
	if _, err := run("QUERY WATCH ADD RESOURCE GROUP rg2 ACTION KILL SQL TEXT SIMILAR TO 'select 1'", nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("similar without a digest: %v", err)
	}
	if _, err := run("QUERY WATCH ADD RESOURCE GROUP rg2 ACTION KILL SQL TEXT SIMILAR TO 'select 1'", func(a *QueryWatchAdd) { a.Digest = "SELECT ?" }); err != nil {
		t.Fatal(err)
	}
	// No ACTION and no rule on the group: refused.
	if _, err := run("QUERY WATCH ADD RESOURCE GROUP rg2 SQL TEXT EXACT TO 'x'", nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("no action anywhere: %v", err)
	}
	// Unknown group; no group at all (the caller fills in the session's).
	if _, err := run("QUERY WATCH ADD RESOURCE GROUP nope ACTION KILL SQL TEXT EXACT TO 'x'", nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown group: %v", err)
	}
	if _, err := run("QUERY WATCH ADD ACTION KILL SQL TEXT EXACT TO 'x'", nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("no group: %v", err)
	}
	res, err = run("SELECT * FROM information_schema.runaway_watches", nil)
	if err != nil || len(res.Rows) != 2 {
		t.Fatalf("list: %v %v", res, err)
	}
	r := res.Rows[0]
	if *r[1] != "rg1" || r[3] == nil || *r[4] != "EXACT" || *r[5] != "select sleep(5)" || *r[6] != WatchSourceManual || *r[7] != "COOLDOWN" {
		t.Fatalf("row 1: %v", derefAll(r))
	}
	if end, _ := time.Parse("2006-01-02 15:04:05", *r[3]); time.Until(end) < 9*time.Minute {
		t.Fatalf("END_TIME %s, want about 10 minutes from now", *r[3])
	}
	if r := res.Rows[1]; *r[4] != "SIMILAR" || *r[5] != "SELECT ?" || *r[7] != "KILL" || r[3] != nil {
		t.Fatalf("row 2: %v", derefAll(r))
	}
	if _, err := run("QUERY WATCH REMOVE 1", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := run("QUERY WATCH REMOVE 1", nil); !errors.Is(err, ErrWatchNotFound) {
		t.Fatalf("remove twice: %v", err)
	}
	res, err = run("QUERY WATCH REMOVE RESOURCE GROUP rg2", nil)
	if err != nil || res.AffectedRows != 1 {
		t.Fatalf("remove by group: %v %v", res, err)
	}
	if res, _ := run("SELECT * FROM information_schema.runaway_watches", nil); len(res.Rows) != 0 {
		t.Fatalf("left: %v", res.Rows)
	}
}

func derefAll(r []*string) []string {
	out := make([]string, len(r))
	for i, p := range r {
		if p == nil {
			out[i] = "NULL"
		} else {
			out[i] = *p
		}
	}
	return out
}
