package tests

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// mtrSuiteDir is where Debian's mariadb-test package installs mysql-test.
const mtrSuiteDir = "/usr/share/mysql/mysql-test"

// mtrFiles are the files of MariaDB's test suite the differential test
// runs: a name is a file of the main suite, a path one of a plugin suite
// (relative to the suite directory). They were
// chosen by running candidates that exercise the protocol broadly (prepared
// statements and cursors, stored procedures with result sets and errors,
// multi-statements, LOAD DATA [LOCAL], SELECT ... INTO OUTFILE, transactions
// and XA, warnings and errors, many column types) directly against the private
// server in all three modes, and keeping those that ran to their end in every
// mode within a few seconds each on a loaded 2-core machine, gave the same
// output in two direct runs, and leave no state behind that the reset below
// does not clear.
var mtrFiles = []string{
	// prepared statements, both text PREPARE and the binary protocol
	"ps_2myisam", "ps_3innodb", "ps_4heap", "ps_grant", "ps_ddl1",
	"ps_max_subselect-5113", "ps_not_windows",
	// stored programs: result sets from CALL, cursors, errors, dynamic SQL
	"sp-no-code", "sp-fib", "sp-big", "sp-dynamic", "sp-prelocking", "sp-bugs",
	"sp_trans", "sp-ucs2",
	// multi-statements, transactions, LOAD DATA and OUTFILE
	"multi_statement", "rollback", "commit_1innodb", "loaddata_autocom_innodb",
	"outfile", "warnings", "truncate", "temp_table",
	// errors and types: many column kinds through both row formats
	"errors", "limit", "count_distinct", "func_if", "func_like", "bigint",
	"auto_increment", "case", "type_set", "type_year", "type_enum", "type_bit",
	"key", "update", "fulltext", "delete",
	// MariaDB's extended capabilities: JSON, UUID, INET4 and INET6 columns
	// carry their type's name or format in the column definitions
	// (EXTENDED_TYPE_INFO; mariadb-test prints it with its metadata, the
	// mariadb CLI with --column-type-info), prepared statements executed
	// again leave their metadata out (CACHE_METADATA, --ps-protocol),
	// progress reports, bulk-style REPLACE
	"type_json", "func_json", "metadata", "progress_976225", "bulk_replace",
	"plugin/type_uuid/type_uuid/type_uuid", "plugin/type_uuid/type_uuid/type_uuid_ps",
	"plugin/type_uuid/type_uuid/type_uuid_mysql", "plugin/type_inet/type_inet/type_inet6",
	"plugin/type_inet/type_inet/type_inet6_ps", "plugin/type_inet/type_inet/type_inet6_mysql",
	"plugin/type_inet/type_inet/type_inet4", "plugin/type_inet/type_inet/type_inet4_mysql",
	"plugin/type_inet/type_inet/type_inet6_mix_json",
}

// mtrMode is one way mariadb-test sends statements.
type mtrMode struct {
	name  string
	flags []string
}

var mtrModes = []mtrMode{
	{"plain", nil},
	{"ps-protocol", []string{"--ps-protocol"}},
	{"cursor-protocol", []string{"--cursor-protocol"}},
}

// mtrEnv is the per-test scaffolding mysql-test-run.pl normally provides.
type mtrEnv struct {
	vardir  string // MYSQLTEST_VARDIR; the server's datadir is two levels below
	server  *privateMariaDB
	baseDBs map[string]bool
	baseUsr map[string]bool
}

// mtrResult is what one mariadb-test run produced.
type mtrResult struct {
	exit   int    // 0 ran to its end, 62 skipped, other failed
	result []byte // the recorded .result
	output []byte // mariadb-test's own stdout and stderr
}

func (r mtrResult) ranToEnd() bool { return r.exit == 0 }

// TestMariadbTestDifferential runs files of MariaDB's own test suite with
// mariadb-test, once straight to a private mariadbd and once through rgproxy
// in front of the same server, in plain, --ps-protocol and --cursor-protocol
// modes; the recorded outputs must be identical byte for byte.
// RGPROXY_MTR_SELFCHECK=1 sends the second leg direct too, which checks that
// the chosen files are deterministic enough to compare;
// RGPROXY_MTR_FILES=a,b runs only those files (to chase one difference).
func TestMariadbTestDifferential(t *testing.T) {
	if testing.Short() {
		t.Skip("takes about two minutes")
	}
	files, wantEnded := mtrFiles, 44
	if only := os.Getenv("RGPROXY_MTR_FILES"); only != "" {
		files, wantEnded = strings.Split(only, ","), 0
	}
	mtrBin := requireTool(t, "mariadb-test", "mariadb-test")
	if _, err := os.Stat(filepath.Join(mtrSuiteDir, "main")); err != nil {
		t.Fatalf("mysql-test suite missing (apt-get install mariadb-test): %v", err)
	}
	env := mtrSetup(t)
	secondAddr, secondName := env.server.Addr, "direct-again"
	if os.Getenv("RGPROXY_MTR_SELFCHECK") != "1" {
		// The full statement path: metering on, tokens from a real rgserver.
		ts := startTokenServer(t)
		secondAddr, secondName = mtrStartProxy(t, env.server.Addr, "--token-server", ts.Addr,
			"--cache-dir", t.TempDir()).Addr, "rgproxy"
	}

	start := time.Now()
	differences := 0
	for _, mode := range mtrModes {
		endedDirect, endedSecond := 0, 0
		for _, file := range files {
			direct := env.run(t, mtrBin, file, mode, env.server.Addr)
			second := env.run(t, mtrBin, file, mode, secondAddr)
			if direct.ranToEnd() {
				endedDirect++
			} else {
				t.Logf("%s %s: direct run did not reach its end (exit %d): %s",
					file, mode.name, direct.exit, mtrTail(direct.output, 3))
			}
			if second.ranToEnd() {
				endedSecond++
			}
			if d := mtrCompare(direct, second); d != "" {
				differences++
				t.Errorf("%s %s: direct and %s differ:\n%s", file, mode.name, secondName, d)
			}
		}
		t.Logf("mode %s: %d of %d files ran to their end direct, %d via %s",
			mode.name, endedDirect, len(files), endedSecond, secondName)
		// The list was chosen so that every file ends; fewer than 44 (of
		// 53) means the environment changed and the comparison proves too
		// little.
		if endedDirect < wantEnded {
			t.Errorf("mode %s: only %d files ran to their end direct, want at least %d", mode.name, endedDirect, wantEnded)
		}
	}
	t.Logf("%d files × %d modes compared in %s, %d differences",
		len(files), len(mtrModes), time.Since(start).Round(time.Second), differences)
}

// mtrSetup starts a private mariadbd with the options mysql-test-run.pl gives
// the main suite (include/default_mysqld.cnf), and lays out a vardir so that
// the suite's relative paths (../../std_data, ../../tmp, seen from the
// datadir) resolve inside it.
func mtrSetup(t *testing.T) *mtrEnv {
	t.Helper()
	// t.TempDir returns <root>/001, the private server's <root>/002; its
	// datadir is <root>/002/data, so <root> is the vardir mtr would use.
	vardir := filepath.Dir(t.TempDir())
	for _, d := range []string{"tmp", "log"} {
		if err := os.MkdirAll(filepath.Join(vardir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A copy, not a symlink: secure_file_priv checks the resolved path.
	if err := mtrCopyTree(filepath.Join(mtrSuiteDir, "std_data"), filepath.Join(vardir, "std_data")); err != nil {
		t.Fatalf("copy std_data: %v", err)
	}
	srv := startPrivateMariaDB(t,
		"--log-bin=mysqld-bin", "--log-basename=mysqld", "--server-id=1",
		"--binlog-direct-non-transactional-updates",
		"--character-set-server=latin1", "--collation-server=latin1_swedish_ci",
		"--local-infile", "--secure-file-priv="+vardir,
		"--log-bin-trust-function-creators=1", "--key-buffer-size=1M",
		"--sort-buffer-size=256K", "--max-heap-table-size=1M",
		"--default-storage-engine=myisam", "--use-stat-tables=preferably",
		"--histogram-type=json_hb", "--open-files-limit=1024", "--connect-timeout=60",
		// mtr logs every statement too; after a hang it shows the last
		// command the server received, which --mark-progress (buffered)
		// cannot.
		"--general-log=1", "--general-log-file="+filepath.Join(vardir, "general.log"),
	)
	if got := filepath.Dir(filepath.Dir(srv.DataDir)); got != vardir {
		t.Fatalf("datadir %s is not two levels below vardir %s", srv.DataDir, vardir)
	}
	// mtr's bootstrap creates mtr.add_suppression, which many files call;
	// only the suppression table matters here, not the warning checks.
	srv.exec(t,
		"CREATE DATABASE mtr",
		"CREATE TABLE mtr.test_suppressions (pattern VARCHAR(255)) ENGINE=MyISAM",
		"CREATE PROCEDURE mtr.add_suppression(pattern VARCHAR(255)) INSERT INTO mtr.test_suppressions VALUES (pattern)",
		"CREATE DATABASE test",
	)
	env := &mtrEnv{vardir: vardir, server: srv}
	env.baseDBs, env.baseUsr = env.snapshot(t)
	return env
}

// snapshot lists the databases and accounts that exist between files.
func (e *mtrEnv) snapshot(t *testing.T) (dbs, users map[string]bool) {
	t.Helper()
	db, err := sql.Open("mysql", dsn(e.server.Addr, "db=mysql"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	dbs = map[string]bool{}
	for _, name := range mtrColumn(t, db, "SELECT schema_name FROM information_schema.schemata") {
		dbs[name] = true
	}
	users = map[string]bool{}
	for _, u := range mtrColumn(t, db, "SELECT CONCAT(QUOTE(user), '@', QUOTE(host)) FROM mysql.global_priv") {
		users[u] = true
	}
	return dbs, users
}

func mtrColumn(t *testing.T, db *sql.DB, query string) []string {
	t.Helper()
	rows, err := db.Query(query)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// reset brings the server and vardir back to the state every run starts
// from: no client connections left over (a run that timed out may leave
// one holding locks), an empty test database, no other new databases or
// accounts, empty tmp and log directories.
func (e *mtrEnv) reset(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sql.Open("mysql", dsn(e.server.Addr, "db=mysql"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // KILL must not hit a connection of our own
	ids := mtrColumn(t, db, "SELECT id FROM information_schema.processlist WHERE id <> CONNECTION_ID() AND command NOT IN ('Daemon', 'Binlog Dump') AND user <> 'system user'")
	stmts := make([]string, 0, len(ids)+4)
	for _, id := range ids {
		stmts = append(stmts, "KILL CONNECTION "+id)
	}
	dbs, users := e.snapshot(t)
	stmts = append(stmts, "DROP DATABASE IF EXISTS test")
	for name := range dbs {
		if !e.baseDBs[name] {
			stmts = append(stmts, "DROP DATABASE IF EXISTS `"+strings.ReplaceAll(name, "`", "``")+"`")
		}
	}
	for u := range users {
		if !e.baseUsr[u] {
			stmts = append(stmts, "DROP USER IF EXISTS "+u)
		}
	}
	stmts = append(stmts, "CREATE DATABASE test")
	for _, s := range stmts {
		// A connection may end between listing and KILL: 1094 is fine.
		if _, err := db.ExecContext(ctx, s); err != nil && !(strings.HasPrefix(s, "KILL") && mysqlErrNo(err) == 1094) {
			t.Fatalf("reset: %s: %v", s, err)
		}
	}
	for _, d := range []string{"tmp", "log"} {
		dir := filepath.Join(e.vardir, d)
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// run resets the server, then runs one file in one mode against addr,
// recording what mariadb-test got.
func (e *mtrEnv) run(t *testing.T, mtrBin, file string, mode mtrMode, addr string) mtrResult {
	t.Helper()
	e.reset(t)
	host, port, _ := strings.Cut(addr, ":")
	// A name alone is a file of the main suite; a path is relative to the
	// suite directory (plugin suites: plugin/type_uuid/type_uuid/...).
	testFile := filepath.Join(mtrSuiteDir, "main", file+".test")
	if strings.Contains(file, "/") {
		testFile = filepath.Join(mtrSuiteDir, file+".test")
	}
	resultFile := filepath.Join(e.vardir, "log", filepath.Base(file)+".result")
	_ = os.Remove(resultFile)
	args := append([]string{"--no-defaults",
		"--basedir=" + mtrSuiteDir, "--host=" + host, "--port=" + port, "--protocol=tcp",
		"--user=root", "--database=test",
		"--tmpdir=" + filepath.Join(e.vardir, "tmp"), "--logdir=" + filepath.Join(e.vardir, "log"),
		"--test-file=" + testFile,
		"--result-file=" + resultFile, "--record", "--silent", "--mark-progress", "--max-connect-retries=20",
	}, mode.flags...)
	ctx, cancel := context.WithTimeout(context.Background(), mtrRunTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, mtrBin, args...)
	// Includes are found relative to the working directory.
	cmd.Dir = mtrSuiteDir
	client := fmt.Sprintf("--no-defaults --protocol=tcp --host=%s --port=%s --user=root", host, port)
	cmd.Env = append(os.Environ(),
		"MYSQL_TEST_DIR="+mtrSuiteDir,
		"MYSQLTEST_VARDIR="+e.vardir,
		"MYSQLTEST_REAL_VARDIR="+e.vardir,
		"MYSQL_TMP_DIR="+filepath.Join(e.vardir, "tmp"),
		"MYSQL_BINDIR=/usr",
		"MASTER_MYPORT="+port,
		"MYSQL=mariadb "+client,
		"MYSQL_DUMP=mariadb-dump "+client,
		"MYSQLADMIN=mariadb-admin "+client,
		"MYSQL_SHOW=mariadb-show "+client,
		"MYSQL_CHECK=mariadb-check "+client,
		"MYSQL_IMPORT=mariadb-import "+client,
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// On a hang, look at the server before the client dies and its
	// session ends; Cancel runs on exec's goroutine, before Wait returns.
	var hang string
	cmd.Cancel = func() error {
		hang = fmt.Sprintf("no end after %s; progress: %s\nserver sessions while hung:\n%slast commands the server received:\n%s",
			mtrRunTimeout, e.lastProgress(), e.sessions(), e.generalLogTail(6))
		return cmd.Process.Kill()
	}
	res := mtrResult{}
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		switch {
		case ctx.Err() != nil:
			// A hang is a finding, not a reason to stop: report it and go
			// on with the next run.
			res.exit = -1
			out.WriteString("\n" + hang)
		case errors.As(err, &ee):
			res.exit = ee.ExitCode()
		default:
			t.Fatalf("%s %s via %s: %v\n%s", file, mode.name, addr, err, out.Bytes())
		}
	}
	res.output = bytes.ReplaceAll(out.Bytes(), []byte(addr), []byte("ADDR"))
	res.output = bytes.ReplaceAll(res.output, []byte("port "+port), []byte("port PORT"))
	res.result, _ = os.ReadFile(resultFile)
	return res
}

// mtrRunTimeout bounds one mariadb-test run; the slowest chosen file takes
// under 10 s on a loaded 2-core machine.
const mtrRunTimeout = 30 * time.Second

// lastProgress returns the last complete line of the file --mark-progress
// writes: the test ran at least that far (the file is written buffered).
func (e *mtrEnv) lastProgress() string {
	files, _ := filepath.Glob(filepath.Join(e.vardir, "log", "*.progress"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			b = b[:i]
		}
		return "at least " + strings.ReplaceAll(mtrTail(b, 1), "\t", " ")
	}
	return "unknown"
}

// generalLogTail returns the last n lines of the server's general log.
func (e *mtrEnv) generalLogTail(n int) string {
	b, err := os.ReadFile(filepath.Join(e.vardir, "general.log"))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		lines[i] = "  " + mtrCut(strings.TrimSpace(l))
	}
	return strings.Join(lines, "\n") + "\n"
}

// sessions lists the server's client sessions, for a report of a hang.
func (e *mtrEnv) sessions() string {
	db, err := sql.Open("mysql", dsn(e.server.Addr, "db=mysql"))
	if err != nil {
		return err.Error()
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := db.QueryContext(ctx, "SELECT CONCAT_WS(' | ', id, command, time, COALESCE(state, ''), LEFT(COALESCE(info, ''), 200)) FROM information_schema.processlist WHERE id <> CONNECTION_ID() AND command <> 'Daemon' AND user <> 'system user'")
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var sb strings.Builder
	for rows.Next() {
		var row string
		if err := rows.Scan(&row); err != nil {
			return err.Error()
		}
		sb.WriteString("  " + row + "\n")
	}
	if err := rows.Err(); err != nil {
		return err.Error()
	}
	return sb.String()
}

// mtrCompare returns "" when two runs match, else a short description: the
// exit status, then the first differing lines of the result, then of the
// client's own output (which holds the error that stopped a failed run).
func mtrCompare(a, b mtrResult) string {
	if a.exit != b.exit {
		return fmt.Sprintf("exit %d vs %d\n--- direct:\n%s\n--- second:\n%s", a.exit, b.exit, mtrLast(a.output, 16), mtrLast(b.output, 16))
	}
	if d := mtrFirstDiff(a.result, b.result); d != "" {
		return "result:\n" + d
	}
	if d := mtrFirstDiff(a.output, b.output); d != "" {
		return "output:\n" + d
	}
	return ""
}

// mtrFirstDiff shows the first differing line with a little context.
func mtrFirstDiff(a, b []byte) string {
	if bytes.Equal(a, b) {
		return ""
	}
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	i := 0
	for i < len(la) && i < len(lb) && la[i] == lb[i] {
		i++
	}
	var sb strings.Builder
	from := max(0, i-3)
	fmt.Fprintf(&sb, "first difference at line %d (%d vs %d lines)\n", i+1, len(la), len(lb))
	for j := from; j < i; j++ {
		fmt.Fprintf(&sb, "  %s\n", mtrCut(la[j]))
	}
	for j := i; j < min(i+4, len(la)); j++ {
		fmt.Fprintf(&sb, "- %s\n", mtrCut(la[j]))
	}
	for j := i; j < min(i+4, len(lb)); j++ {
		fmt.Fprintf(&sb, "+ %s\n", mtrCut(lb[j]))
	}
	return sb.String()
}

func mtrCut(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// mtrLast returns the last n lines of a client's output, one per line.
func mtrLast(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// mtrTail returns the last n lines of a client's output.
func mtrTail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// mtrStartProxy runs rgproxy in front of backend on fresh ports.
func mtrStartProxy(t *testing.T, backend string, extra ...string) *proxy {
	t.Helper()
	px := &proxy{Addr: freeAddr(t), StatusAddr: freeAddr(t)}
	args := append([]string{"--listen", px.Addr, "--status-addr", px.StatusAddr,
		"--backend", backend, "--log-level", "warn"}, extra...)
	px.process = startProcess(t, "rgproxy", args...)
	waitListening(t, px.Addr, px.process)
	return px
}

// mtrCopyTree copies a directory of regular files and subdirectories.
func mtrCopyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}
