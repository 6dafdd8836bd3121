package tests

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"
)

// A go-sql-driver client sending SQLCommenter-tagged statements lands in
// the tag's group, an untagged one in its user's; the binding reaches
// every proxy, is listed, and once dropped the tag routes nothing.
func TestTagBindingsRouteStatements(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts)
	px2 := startMeteredProxy(t, ts)
	appUser(t, "tagapp")
	adminExec(t, px.Addr,
		"CREATE RESOURCE GROUP rg_tag_user RU_PER_SEC = 1000",
		"CREATE RESOURCE GROUP rg_tag_reports RU_PER_SEC = 1000",
		"CREATE RESOURCE GROUP binding RU_PER_SEC = 1000", // a group named binding is still a group
		"ALTER USER 'tagapp'@'%' RESOURCE GROUP rg_tag_user",
		"CREATE RESOURCE GROUP BINDING FOR TAG route = '/report' TO rg_tag_user",
		// Creating again replaces the binding.
		"CREATE RESOURCE GROUP BINDING FOR TAG route = '/report' TO rg_tag_reports")

	ctx := context.Background()
	// lastGroup runs q (and reads its rows) on conn, then returns the
	// group SHOW LAST STATEMENT RU reports for it: "g+t" when it was also
	// charged to a tag's group t.
	lastGroup := func(conn *sql.Conn, q string, args ...any) string {
		t.Helper()
		rows, err := conn.QueryContext(ctx, q, args...)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		for rows.Next() {
		}
		if err := rows.Close(); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		last := lastStatementRU(t, conn)
		if tag := last["TAG_RESOURCE_GROUP"]; tag != "" {
			return last["RESOURCE_GROUP"] + "+" + tag
		}
		return last["RESOURCE_GROUP"]
	}
	app := openDB(t, px.Addr, "user=tagapp", "password=apppw")
	conn, err := app.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The user has no SUPER. In strict mode (the default) a tag adds its
	// group: the statement runs in the user's group and is charged to the
	// tag's too.
	for _, tc := range []struct {
		query string
		args  []any
		want  string
	}{
		{query: "SELECT 1 /*controller='report',route='%2Freport'*/", want: "rg_tag_user+rg_tag_reports"},
		{query: "SELECT 1", want: "rg_tag_user"},
		{query: "SELECT 1 /*controller='index',framework='django%3A4.2',route='%2Freport'*/", want: "rg_tag_user+rg_tag_reports"},
		{query: "/*route='%2Freport'*/ SELECT 1", want: "rg_tag_user+rg_tag_reports"},
		{query: "SELECT 1 /*route='%2Fother'*/", want: "rg_tag_user"},
		{query: "SELECT 1 /* route='/report' said the developer */", want: "rg_tag_user"},
		// With arguments the driver prepares the statement: the tag of
		// the prepared text routes each execution.
		{query: "SELECT ? /*route='%2Freport'*/", args: []any{7}, want: "rg_tag_user+rg_tag_reports"},
	} {
		if got := lastGroup(conn, tc.query, tc.args...); got != tc.want {
			t.Errorf("%s: ran in %s, want %s", tc.query, got, tc.want)
		}
	}

	// The binding reached the other proxy.
	app2 := openDB(t, px2.Addr, "user=tagapp", "password=apppw")
	conn2, err := app2.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	deadline := time.Now().Add(2 * time.Second)
	for lastGroup(conn2, "SELECT 1 /*route='%2Freport'*/") != "rg_tag_user+rg_tag_reports" {
		if time.Now().After(deadline) {
			t.Fatal("the tag binding did not reach the second proxy within 2s")
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Listed: every binding for root; for the user its account's and
	// every tag's.
	const listing = "SELECT USER, HOST, RESOURCE_GROUP, TAG_KEY, TAG_VALUE FROM information_schema.resource_group_bindings ORDER BY RESOURCE_GROUP"
	root := openDB(t, px.Addr)
	want := "[[<nil> <nil> rg_tag_reports route /report] [tagapp % rg_tag_user <nil> <nil>]]"
	if got := fmt.Sprint(rowsOf(t, root, listing)[1:]); got != want {
		t.Errorf("bindings listed to root: %s, want %s", got, want)
	}
	if got := fmt.Sprint(connRows(t, conn, listing)[1:]); got != want {
		t.Errorf("bindings listed to the user: %s, want %s", got, want)
	}

	// Dropped: the tag routes nothing, on this proxy at once.
	adminExec(t, px.Addr, "DROP RESOURCE GROUP BINDING FOR TAG route = '/report'")
	if got := lastGroup(conn, "SELECT 1 /*controller='report',route='%2Freport'*/"); got != "rg_tag_user" {
		t.Errorf("after DROP the tagged statement ran in %s, want rg_tag_user", got)
	}
	if _, err := root.Exec("DROP RESOURCE GROUP BINDING FOR TAG route = '/report'"); mysqlErrNo(err) != 1105 {
		t.Errorf("DROP of a missing tag binding: %v, want 1105", err)
	}
	rconn, err := root.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rconn.Close()
	if _, err := rconn.ExecContext(ctx, "DROP RESOURCE GROUP BINDING IF EXISTS FOR TAG route = '/report'"); err != nil {
		t.Fatalf("DROP ... IF EXISTS of a missing tag binding: %v", err)
	}
	if w := connRows(t, rconn, "SHOW WARNINGS"); len(w) != 2 || w[1][1] != "1105" {
		t.Errorf("the note of DROP ... IF EXISTS: %v", w)
	}
	if _, err := root.Exec("CREATE RESOURCE GROUP BINDING FOR TAG route = '/x' TO rg_nope"); mysqlErrNo(err) != 8249 {
		t.Errorf("binding to a missing group: %v, want 8249", err)
	}
	if _, err := app.Exec("CREATE RESOURCE GROUP BINDING FOR TAG route = '/x' TO rg_tag_reports"); mysqlErrNo(err) != 1227 {
		t.Errorf("binding a tag without SUPER: %v, want 1227", err)
	}
	if got := fmt.Sprint(rowsOf(t, root, "SELECT NAME FROM information_schema.resource_groups WHERE NAME = 'binding'")[1:]); got != "[[binding]]" {
		t.Errorf("the group named binding: %s", got)
	}
}

// connRows is rowsOf on one connection.
func connRows(t testing.TB, conn *sql.Conn, query string) [][]string {
	t.Helper()
	rows, err := conn.QueryContext(context.Background(), query)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	return scanAll(t, rows)
}
