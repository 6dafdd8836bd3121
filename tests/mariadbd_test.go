package tests

import (
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// privateMariaDB is a mariadbd of the test's own, for what the shared one
// must not be bent to: TLS, PROXY protocol, being killed.
type privateMariaDB struct {
	*process
	Addr    string
	DataDir string
	args    []string
}

// startPrivateMariaDB initialises a data directory and starts mariadbd on a
// fresh port with extra server options. root has an empty password.
func startPrivateMariaDB(t testing.TB, extra ...string) *privateMariaDB {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	install := exec.Command("mariadb-install-db", "--no-defaults", "--datadir="+data, "--user=root",
		"--auth-root-authentication-method=normal", "--skip-test-db")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	m := &privateMariaDB{Addr: freeAddr(t), DataDir: data}
	_, port, _ := strings.Cut(m.Addr, ":")
	m.args = append([]string{"--no-defaults", "--datadir=" + data, "--user=root", "--bind-address=127.0.0.1",
		"--port=" + port, "--socket=" + filepath.Join(dir, "mysqld.sock"), "--skip-log-bin",
		"--innodb-buffer-pool-size=16M", "--innodb-log-file-size=8M", "--pid-file=" + filepath.Join(dir, "mysqld.pid")},
		extra...)
	m.start(t)
	return m
}

func (m *privateMariaDB) start(t testing.TB) {
	t.Helper()
	p := &process{log: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(mariadbdPath(), m.args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start mariadbd: %v", err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(20 * time.Second)
		if t.Failed() {
			t.Logf("private mariadbd log:\n%s", p.log.String())
		}
	})
	m.process = p
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		db, _ := sql.Open("mysql", dsn(m.Addr, "db=mysql"))
		err := db.Ping()
		db.Close()
		if err == nil {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("mariadbd exited: %v\n%s", p.err, p.log.String())
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Fatalf("private mariadbd not ready after 60s\n%s", p.log.String())
}

func mariadbdPath() string {
	for _, p := range []string{"/usr/sbin/mariadbd", "/usr/sbin/mysqld"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "mariadbd"
}

// exec runs statements as root on the private server.
func (m *privateMariaDB) exec(t testing.TB, stmts ...string) {
	t.Helper()
	db, err := sql.Open("mysql", dsn(m.Addr, "db=mysql"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func (m *privateMariaDB) String() string { return fmt.Sprintf("mariadbd@%s", m.Addr) }
