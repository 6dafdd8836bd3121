package tests

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRunawaySampleMaskedAsWritten: two accounts share a group with a
// DRYRUN rule; one runs slow statements whose literals a reading in the
// default mode would end elsewhere: in an sjis session ('表' is 0x95 0x5C,
// its last byte a backslash), under NO_BACKSLASH_ESCAPES ('C:\') and
// under ANSI_QUOTES ("s\" is a name). The other account reads
// information_schema.runaway_queries and sees none of the literals;
// root sees each text as it was sent, decoded to UTF-8.
func TestRunawaySampleMaskedAsWritten(t *testing.T) {
	ts := startTokenServer(t)
	p := startMeteredProxy(t, ts)
	adminExec(t, p.Addr,
		"DROP RESOURCE GROUP IF EXISTS rg_mask",
		"CREATE RESOURCE GROUP rg_mask RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '100ms', ACTION = DRYRUN)")
	for _, u := range []string{"mask_writer", "mask_reader"} {
		appUser(t, u)
		adminExec(t, p.Addr, "ALTER USER '"+u+"'@'%' RESOURCE GROUP rg_mask")
	}

	ctx := context.Background()
	writer := openDB(t, p.Addr, "user=mask_writer", "password=apppw")
	for _, tc := range []struct{ setup, q string }{
		{"SET NAMES sjis", "SELECT SLEEP(0.3) AS sjis, '\x95\x5c' AS a, 'pw=TopSecretSjis' AS b"},
		{"SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')", `SELECT SLEEP(0.3) AS nbe, 'C:\' AS a, 'pw=TopSecretNbe' AS b`},
		{"SET SESSION sql_mode = CONCAT(@@sql_mode, ',ANSI_QUOTES')", `SELECT SLEEP(0.3) AS "s\", 'z"' AS c, 'pw=TopSecretAnsi' AS b`},
	} {
		conn, err := writer.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{tc.setup, tc.q} {
			if _, err := conn.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		conn.Raw(func(any) error { return driver.ErrBadConn }) // not back to the pool: its mode stays with it
		conn.Close()
	}

	const q = "SELECT ACCOUNT, SAMPLE_SQL FROM information_schema.runaway_queries WHERE RESOURCE_GROUP_NAME = 'rg_mask' ORDER BY SAMPLE_SQL"
	root := openDB(t, p.Addr)
	var rows [][]string
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if rows, err = queryStrings(t, root, q); err == nil && len(rows) == 3 {
			break
		}
		if time.Since(start) > 15*time.Second {
			t.Fatalf("runaway_queries as root after 15 s: %q, %v", rows, err)
		}
	}
	want := map[string]bool{
		`SELECT SLEEP(0.3) AS "s\", 'z"' AS c, 'pw=TopSecretAnsi' AS b`: true,
		`SELECT SLEEP(0.3) AS sjis, '表' AS a, 'pw=TopSecretSjis' AS b`:  true,
		`SELECT SLEEP(0.3) AS nbe, 'C:\' AS a, 'pw=TopSecretNbe' AS b`:  true,
	}
	for _, r := range rows {
		t.Logf("root sees %q", r)
		if r[0] != "mask_writer@%" || !want[r[1]] {
			t.Errorf("root's row %q: want mask_writer@%% and one of the texts as sent, decoded", r)
		}
		delete(want, r[1])
	}

	masked, err := queryStrings(t, openDB(t, p.Addr, "user=mask_reader", "password=apppw"), q)
	if err != nil || len(masked) != 3 {
		t.Fatalf("mask_reader's rows: %q, %v", masked, err)
	}
	wantMasked := map[string]bool{
		"SELECT SLEEP(?) AS sjis, ? AS a, ? AS b": true,
		"SELECT SLEEP(?) AS nbe, ? AS a, ? AS b":  true,
		"SELECT ...":                              true, // "s\", 'z" is a string or a name: the readings disagree
	}
	for _, r := range masked {
		t.Logf("mask_reader sees %q", r)
		if strings.Contains(r[1], "TopSecret") || strings.Contains(r[1], "pw") || !wantMasked[r[1]] {
			t.Errorf("mask_reader sees %q", r)
		}
		delete(wantMasked, r[1])
	}

	// statements_summary and its cluster view show the group's digests to
	// every account of the group: in UTF-8, without the literals.
	for _, view := range []string{"statements_summary", "cluster_statements_summary"} {
		q := "SELECT DIGEST_TEXT FROM information_schema." + view +
			" WHERE RESOURCE_GROUP = 'rg_mask' AND (DIGEST_TEXT LIKE 'SELECT SLEEP%' OR DIGEST_TEXT = 'SELECT ...') ORDER BY DIGEST_TEXT"
		got, err := queryStrings(t, openDB(t, p.Addr, "user=mask_reader", "password=apppw"), q)
		if err != nil {
			t.Fatalf("%s as mask_reader: %v", view, err)
		}
		t.Logf("mask_reader's %s: %q", view, got)
		want := "[[SELECT ...] [SELECT SLEEP(?) AS nbe, ? AS a, ? AS b] [SELECT SLEEP(?) AS sjis, ? AS a, ? AS b]]"
		if fmt.Sprint(got) != want {
			t.Errorf("%s as mask_reader: %q, want %s", view, got, want)
		}
	}
}
