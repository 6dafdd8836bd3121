package tests

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitLog waits until p's log holds want after its first skip bytes, and
// returns that part of the log.
func waitLog(t testing.TB, p *process, skip int, want string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		log := p.log.String()[skip:]
		if strings.Contains(log, want) {
			return log
		}
		select {
		case <-p.done:
			t.Fatalf("process exited (%v) before logging %q:\n%s", p.err, want, log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the log after 10s:\n%s", want, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lastStatementWait is THROTTLE_WAIT_MS of SHOW LAST STATEMENT RU.
func lastStatementWait(t testing.TB, c *sql.Conn) float64 {
	t.Helper()
	rows, err := c.QueryContext(context.Background(), "SHOW LAST STATEMENT RU")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	all := scanAll(t, rows)
	for i, h := range all[0] {
		if strings.HasPrefix(h, "THROTTLE_WAIT_MS:") && len(all) > 1 {
			v, err := strconv.ParseFloat(all[1][i], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("SHOW LAST STATEMENT RU has no THROTTLE_WAIT_MS: %v", all)
	return 0
}

// TestSIGHUPReloadsConfig: a SIGHUP applies the config file's max-wait and
// log level to a serving rgproxy, open sessions stay up, a changed listen
// address is refused with a log line, flags given on the command line
// still win, and a broken file changes nothing.
func TestSIGHUPReloadsConfig(t *testing.T) {
	ts := startTokenServer(t)
	appUser(t, "rghup")
	dir := t.TempDir()
	listen, status := freeAddr(t), freeAddr(t)
	path := filepath.Join(dir, "rgproxy.toml")
	// Wall time: SLEEP() is charged (CPU time would not count it).
	common := fmt.Sprintf("status-addr = %q\nbackend = %q\ntoken-server = %q\ncache-dir = %q\ncpu-source = \"wall\"\n",
		status, backendAddr, ts.Addr, filepath.Join(dir, "cache"))
	base := fmt.Sprintf("listen = %q\n", listen) + common
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(base + "max-wait = \"1ms\"\nlog-level = \"warn\"\n")
	p := startProcess(t, "rgproxy", "--config", path, "--max-connections", "50")
	waitListening(t, listen, p)
	hup := func() {
		t.Helper()
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}

	// 20 RU/s; SELECT SLEEP(0.05) costs about 17 RU (50 ms of backend
	// time at 1 RU per 3 ms), so a session in a loop owes tokens at once.
	adminExec(t, listen, "DROP RESOURCE GROUP IF EXISTS rg_hup",
		"CREATE RESOURCE GROUP rg_hup RU_PER_SEC = 20", "ALTER USER 'rghup'@'%' RESOURCE GROUP rg_hup")
	dashWaitGroup(t, listen, "rghup", "rg_hup")
	ctx := context.Background()
	keep, err := openDB(t, listen).Conn(ctx) // an idle session across the reloads
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	user, err := openDB(t, listen, "user=rghup", "password=apppw").Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer user.Close()

	// max-wait 1ms: the group in debt refuses at once with 8252.
	refused := false
	for i := 0; i < 20 && !refused; i++ {
		start := time.Now()
		_, err := user.ExecContext(ctx, "SELECT SLEEP(0.05)")
		if err != nil {
			if mysqlErrNo(err) != 8252 {
				t.Fatalf("statement %d: %v", i, err)
			}
			if el := time.Since(start); el > time.Second {
				t.Fatalf("8252 after %v with max-wait 1ms", el)
			}
			refused = true
		}
	}
	if !refused {
		t.Fatal("20 statements at about 17 RU each in a 20 RU/s group, max-wait 1ms: none refused")
	}
	if strings.Contains(p.log.String(), "level=DEBUG") {
		t.Fatalf("debug lines at log-level warn:\n%s", p.log.String())
	}

	// Reload: max-wait 20s and log-level debug apply; the new listen address
	// is refused; max-connections is given on the command line, which wins.
	skip := len(p.log.String())
	write(fmt.Sprintf("listen = %q\n", freeAddr(t)) + common +
		"max-wait = \"20s\"\nlog-level = \"debug\"\nmax-connections = 1\n")
	hup()
	log := waitLog(t, p, skip, "config reload: these settings need a restart")
	for _, want := range []string{`level=INFO msg="config reloaded"`, "max-wait: 1ms → 20s", "log-level: warn → debug", `refused=listen`} {
		if !strings.Contains(log, want) {
			t.Errorf("reload log lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "max-connections:") {
		t.Errorf("max-connections, given on the command line, was reloaded from the file:\n%s", log)
	}

	// The same session: statements now wait for their tokens instead of
	// being refused.
	var waited float64
	for i := 0; i < 3; i++ {
		if _, err := user.ExecContext(ctx, "SELECT SLEEP(0.05)"); err != nil {
			t.Fatalf("statement %d after the reload to max-wait 20s: %v", i, err)
		}
		waited += lastStatementWait(t, user)
	}
	t.Logf("after the reload, 3 statements waited %.0f ms for tokens in all", waited)
	if waited < 200 {
		t.Errorf("3 statements of about 17 RU in a 20 RU/s group waited %.0f ms in all; max-wait 20s not in force?", waited)
	}
	if err := keep.PingContext(ctx); err != nil {
		t.Fatalf("idle session lost across the reload: %v", err)
	}
	// More sessions than the file's max-connections = 1, and debug lines.
	var one int
	if err := openDB(t, listen).QueryRow("SELECT 1").Scan(&one); err != nil {
		t.Fatalf("a third session (--max-connections 50 on the command line): %v", err)
	}
	waitLog(t, p, skip, `level=DEBUG msg="session logged in"`)

	// A broken file changes nothing and the proxy keeps serving.
	skip = len(p.log.String())
	write(base + "max-wait = \n")
	hup()
	waitLog(t, p, skip, `level=ERROR msg="config reload failed; nothing changed"`)
	if _, err := user.ExecContext(ctx, "SELECT SLEEP(0.05)"); err != nil {
		t.Fatalf("after a broken file, max-wait 20s must still hold: %v", err)
	}
	if err := keep.PingContext(ctx); err != nil {
		t.Fatalf("idle session lost: %v", err)
	}
	select {
	case <-p.done:
		t.Fatalf("rgproxy exited: %v", p.err)
	default:
	}
}
