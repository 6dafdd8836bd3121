package mysqlproto

import (
	"database/sql"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	sqldriver "github.com/go-sql-driver/mysql"
)

// mariadbCLI runs the mariadb command-line client against addr.
func mariadbCLI(t *testing.T, addr string, args ...string) (string, error) {
	t.Helper()
	bin, err := exec.LookPath("mariadb")
	if err != nil {
		t.Skip("no mariadb client")
	}
	host, port, _ := net.SplitHostPort(addr)
	all := append([]string{"--no-defaults", "-h" + host, "-P" + port, "-uroot", "--protocol=tcp", "--batch", "--skip-ssl"}, args...)
	out, err := exec.Command(bin, all...).CombinedOutput()
	return string(out), err
}

func TestMariaDBCLI(t *testing.T) {
	setupSchema(t)
	_, addr := startProxy(t, Config{})
	csv := filepath.Join(t.TempDir(), "cli.csv")
	if err := os.WriteFile(csv, []byte("1\n2\n3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := `USE rgproxy_test;
DROP TABLE IF EXISTS cli; CREATE TABLE cli (a INT);
LOAD DATA LOCAL INFILE '` + csv + `' INTO TABLE cli;
SELECT SUM(a) AS total FROM cli;
CALL two_sets();
status
`
	out, err := mariadbCLI(t, addr, "--local-infile=1", "-e", script)
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, want := range []string{"total\n6\n", "a\n1\n", "b\tc\n2\tx\n", "Uptime:", "Current database:\trgproxy_test"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, err = mariadbCLI(t, addr, "-urgp_user", "-pwrong", "-e", "SELECT 1")
	if err == nil || !strings.Contains(out, "ERROR 1045") {
		t.Errorf("wrong password: %v %s", err, out)
	}
}

// TestEd25519AuthSwitch logs in with MariaDB's ed25519 plugin, which the
// backend reaches through an auth switch from mysql_native_password.
func TestEd25519AuthSwitch(t *testing.T) {
	setupSchema(t)
	c := sqldriver.NewConfig()
	c.User, c.Net, c.Addr = "root", "tcp", backendAddr
	root, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if _, err := root.Exec("INSTALL SONAME 'auth_ed25519'"); err != nil {
		var me *sqldriver.MySQLError
		if !errors.As(err, &me) || me.Number != 1968 && me.Number != 1125 { // already installed
			t.Skipf("no ed25519 plugin: %v", err)
		}
	}
	if _, err := root.Exec("CREATE OR REPLACE USER 'rgp_ed'@'%' IDENTIFIED VIA ed25519 USING PASSWORD('secret2')"); err != nil {
		t.Skipf("cannot create an ed25519 user: %v", err)
	}
	_, addr := startProxy(t, Config{})
	c.User, c.Passwd, c.Addr = "rgp_ed", "secret2", addr
	db, _ := sql.Open("mysql", c.FormatDSN())
	defer db.Close()
	var u string
	if err := db.QueryRow("SELECT CURRENT_USER()").Scan(&u); err != nil || u != "rgp_ed@%" {
		t.Fatalf("go driver: %q %v", u, err)
	}
	out, err := mariadbCLI(t, addr, "-urgp_ed", "-psecret2", "-e", "SELECT CURRENT_USER()")
	if err != nil || !strings.Contains(out, "rgp_ed@%") {
		t.Fatalf("mariadb client: %v %s", err, out)
	}
	c.Passwd = "nope"
	bad, _ := sql.Open("mysql", c.FormatDSN())
	defer bad.Close()
	var me *sqldriver.MySQLError
	if err := bad.Ping(); !errors.As(err, &me) || me.Number != 1045 {
		t.Fatalf("wrong ed25519 password: %v", err)
	}
}
