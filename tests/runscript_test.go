package tests

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runScript is scripts/run.sh (`make run`) started by a test, with the
// binaries TestMain built and its logs in a directory of the test's own.
type runScript struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	runDir string
	done   chan struct{}
	err    error
}

func startRunScript(t *testing.T, rgserverFlags, rgproxyFlags string) *runScript {
	t.Helper()
	requireTool(t, "mariadb", "mariadb-client") // scripts/ensure-mariadb.sh uses it
	r := &runScript{out: &syncBuffer{}, runDir: filepath.Join(t.TempDir(), "run"), done: make(chan struct{})}
	r.cmd = exec.Command("bash", "../scripts/run.sh")
	r.cmd.Env = append(os.Environ(), "BIN_DIR="+binDir, "RUN_DIR="+r.runDir,
		"RGSERVER_FLAGS="+rgserverFlags, "RGPROXY_FLAGS="+rgproxyFlags)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.err = r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			_ = r.cmd.Process.Signal(syscall.SIGTERM) // its trap stops what it started
			select {
			case <-r.done:
			case <-time.After(15 * time.Second):
				_ = r.cmd.Process.Kill()
				<-r.done
			}
		}
		if t.Failed() {
			t.Logf("run.sh output:\n%s", r.out.String())
		}
	})
	return r
}

// exit waits for run.sh to end and returns its exit status.
func (r *runScript) exit(t *testing.T) int {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(90 * time.Second):
		t.Fatalf("run.sh still running after 90s:\n%s", r.out.String())
	}
	var ee *exec.ExitError
	if errors.As(r.err, &ee) {
		return ee.ExitCode()
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	return 0
}

// waitOutput waits until run.sh has printed want.
func (r *runScript) waitOutput(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(90 * time.Second)
	for !strings.Contains(r.out.String(), want) {
		select {
		case <-r.done:
			t.Fatalf("run.sh exited (%v) before printing %q:\n%s", r.err, want, r.out.String())
		case <-deadline:
			t.Fatalf("run.sh has not printed %q after 90s:\n%s", want, r.out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// child returns the pid of the process run.sh started from binary name.
func (r *runScript) child(t *testing.T, name string) int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		status, err := os.ReadFile(d + "/status")
		if err != nil || !strings.Contains(string(status), "\nPPid:\t"+strconv.Itoa(r.cmd.Process.Pid)+"\n") {
			continue
		}
		cmdline, _ := os.ReadFile(d + "/cmdline")
		if argv0, _, _ := strings.Cut(string(cmdline), "\x00"); filepath.Base(argv0) == name {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	t.Fatalf("run.sh has no child %q", name)
	return 0
}

// answersTCP says whether something accepts connections at addr.
func answersTCP(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// TestRunScriptPortTaken: with 127.0.0.1:4000 taken, `make run` starts
// nothing and exits non-zero saying so. rgserver is pointed at free ports
// so that only the proxy's default collides.
func TestRunScriptPortTaken(t *testing.T) {
	if ln, err := net.Listen("tcp", "127.0.0.1:4000"); err == nil {
		defer ln.Close()
	} else if !answersTCP("127.0.0.1:4000") {
		t.Fatalf("cannot take 127.0.0.1:4000 (%v), yet nothing answers there", err)
	} // else: someone else holds it, which is as good
	rgs := freeAddr(t)
	r := startRunScript(t, "--addr "+rgs+" --status-addr "+freeAddr(t), "--status-addr "+freeAddr(t))
	if code := r.exit(t); code == 0 {
		t.Fatalf("run.sh exited 0 with port 4000 taken:\n%s", r.out.String())
	}
	out := r.out.String()
	if !strings.Contains(out, "rgproxy's MySQL address 127.0.0.1:4000 is already in use") ||
		!strings.Contains(out, `RGPROXY_FLAGS="--listen`) {
		t.Fatalf("no clear message:\n%s", out)
	}
	if strings.Contains(out, "connect with") {
		t.Fatalf("run.sh says how to connect though it failed:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(r.runDir, "rgserver.log")); err == nil || answersTCP(rgs) {
		t.Fatal("rgserver was started although a port was taken")
	}
}

// TestRunScriptAddressesAndDeaths: run.sh prints the addresses that
// RGPROXY_FLAGS / RGSERVER_FLAGS moved the processes to; a process that
// dies at start or later ends it non-zero with that process's last log
// lines, stopping the other; Ctrl-C ends it with 0. rgproxy has the
// service account make run creates: a KILL rule is accepted.
func TestRunScriptAddressesAndDeaths(t *testing.T) {
	t.Run("dies at start", func(t *testing.T) {
		rgs := freeAddr(t)
		r := startRunScript(t, "--addr "+rgs+" --status-addr "+freeAddr(t),
			"--listen "+freeAddr(t)+" --status-addr "+freeAddr(t)+" --max-wait -1s")
		if code := r.exit(t); code == 0 {
			t.Fatalf("exit 0:\n%s", r.out.String())
		}
		out := r.out.String()
		for _, want := range []string{"rgproxy exited with status 2 while starting", "last lines of " + r.runDir + "/rgproxy.log", "--max-wait"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		if answersTCP(rgs) {
			t.Error("rgserver left running")
		}
	})

	for _, end := range []string{"rgproxy killed", "Ctrl-C"} {
		t.Run(end, func(t *testing.T) {
			rgs, rgsStatus, listen, status := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
			r := startRunScript(t, "--addr "+rgs+" --status-addr "+rgsStatus, "--listen "+listen+" --status-addr "+status)
			r.waitOutput(t, "Ctrl-C stops everything.")
			out := r.out.String()
			_, port, _ := net.SplitHostPort(listen)
			for _, want := range []string{"rgserver: " + rgs + " (status http://" + rgsStatus + ")",
				"rgproxy:  " + listen + " -> 127.0.0.1:3306 (status http://" + status + ")",
				"mariadb -h127.0.0.1 -P" + port + " -uroot --comments"} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			var one int
			if err := openDB(t, listen).QueryRow("SELECT 1").Scan(&one); err != nil {
				t.Fatalf("through the printed address: %v", err)
			}
			// rgserver authenticates, and rgproxy has the credentials.
			if v := metricSum(t, rgsStatus, "rgserver_insecure"); v != 0 {
				t.Errorf("make run's rgserver authenticates nobody (rgserver_insecure %v)", v)
			}
			adminExec(t, listen, "DROP RESOURCE GROUP IF EXISTS rs_auth", "CREATE RESOURCE GROUP rs_auth RU_PER_SEC = 100", "DROP RESOURCE GROUP rs_auth")
			if end == "Ctrl-C" {
				// make run gives rgproxy its service account, so a KILL
				// rule is accepted (without it, refused with 1105).
				if !strings.Contains(out, "rgproxy's service account: rgproxy_svc") {
					t.Errorf("output does not name the service account:\n%s", out)
				}
				adminExec(t, listen, "DROP RESOURCE GROUP IF EXISTS rs_kill",
					"CREATE RESOURCE GROUP rs_kill RU_PER_SEC = 100 QUERY_LIMIT = (EXEC_ELAPSED = '1s', ACTION = KILL)",
					"DROP RESOURCE GROUP rs_kill")
				_ = r.cmd.Process.Signal(syscall.SIGINT)
				if code := r.exit(t); code != 0 {
					t.Fatalf("Ctrl-C: exit %d:\n%s", code, r.out.String())
				}
			} else {
				if err := syscall.Kill(r.child(t, "rgproxy"), syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				if code := r.exit(t); code == 0 {
					t.Fatalf("rgproxy killed, yet exit 0:\n%s", r.out.String())
				}
				out = r.out.String()
				for _, want := range []string{"rgproxy exited (status 137); stopping the rest", `msg="rgproxy serving"`} {
					if !strings.Contains(out, want) {
						t.Errorf("output lacks %q:\n%s", want, out)
					}
				}
			}
			if answersTCP(rgs) || answersTCP(listen) {
				t.Error("a process outlived run.sh")
			}
		})
	}
}
