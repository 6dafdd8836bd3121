package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/internal/reload/reloadtest"
	"github.com/rgproxy/rgproxy/mysqlproto"
)

// lockedBuffer is a log sink safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// take returns what was logged since the last call.
func (l *lockedBuffer) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.b.String()
	l.b.Reset()
	return s
}

// reloadFixture is a reloader over a real (not listening) mysqlproto
// server, started from the command line args and the file at path.
type reloadFixture struct {
	t    *testing.T
	path string
	r    *reloader
	logs *lockedBuffer
}

func newReloadFixture(t *testing.T, file string, args ...string) *reloadFixture {
	t.Helper()
	f := &reloadFixture{t: t, path: filepath.Join(t.TempDir(), "rgproxy.toml"), logs: &lockedBuffer{}}
	f.write(file)
	args = append([]string{"--config", f.path, "--metering=false"}, args...)
	cfg, _, err := parseArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	level := new(slog.LevelVar)
	level.Set(parseLevel(cfg.LogLevel))
	logger := slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: level}))
	pcfg, cert, err := proxyConfig(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mysqlproto.NewServer(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	f.r = &reloader{args: args, cur: cfg, level: level, srv: srv, cert: cert, log: logger}
	return f
}

func (f *reloadFixture) write(body string) {
	f.t.Helper()
	if err := os.WriteFile(f.path, []byte(body), 0o600); err != nil {
		f.t.Fatal(err)
	}
}

// reload rewrites the file, reloads and returns the log lines it wrote.
func (f *reloadFixture) reload(body string) string {
	f.t.Helper()
	f.write(body)
	f.logs.take()
	f.r.reload()
	return f.logs.take()
}

func wantLines(t *testing.T, logs string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(logs, w) {
			t.Errorf("log lacks %q:\n%s", w, logs)
		}
	}
}

func TestReloadAppliesReloadableAndRefusesTheRest(t *testing.T) {
	f := newReloadFixture(t, "listen = \"127.0.0.1:4000\"\nmax-wait = \"30s\"\nlog-level = \"warn\"\n")
	logs := f.reload("listen = \"127.0.0.1:4001\"\nmax-wait = \"100ms\"\nlog-level = \"debug\"\n" +
		"max-connections = 5\nmax-wait-in-txn = \"50ms\"\nmax-backend-concurrency = 8\nstrict-resource-groups = false\n" +
		"chargeback-tag-keys = \"application,controller\"\ndial-timeout = \"1s\"\n")
	if n := strings.Count(logs, "\n"); n != 2 {
		t.Errorf("want one line of changes and one of refusals, got %d lines:\n%s", n, logs)
	}
	wantLines(t, logs, `level=INFO msg="config reloaded"`,
		"log-level: warn → debug", "max-wait: 30s → 100ms", "max-wait-in-txn: 100ms → 50ms",
		"max-connections: 0 → 5", "max-backend-concurrency: 0 → 8", "strict-resource-groups: true → false",
		`chargeback-tag-keys: \"\" → application,controller`,
		`level=WARN msg="config reload: these settings need a restart and were not changed"`,
		`refused="dial-timeout, listen"`, "listen: 127.0.0.1:4000 → 127.0.0.1:4001")
	if strings.Contains(logs, "changed=") && strings.Contains(strings.SplitN(logs, "\n", 2)[0], "listen") {
		t.Errorf("listen reported as changed:\n%s", logs)
	}
	c := f.r.cur
	if c.MaxWait != 100*time.Millisecond || c.MaxWaitInTxn != 50*time.Millisecond || c.MaxBackendConcurrency != 8 ||
		c.StrictResourceGroups || c.LogLevel != "debug" || c.MaxConnections != 5 || c.ChargebackTagKeys != "application,controller" {
		t.Errorf("settings in force: %+v", c)
	}
	if c.Listen != "127.0.0.1:4000" || c.DialTimeout != 5*time.Second {
		t.Errorf("a setting that needs a restart moved: listen %s, dial-timeout %v", c.Listen, c.DialTimeout)
	}
	if f.r.srv.MaxConnections() != 5 || f.r.level.Level() != slog.LevelDebug {
		t.Errorf("server limit %d, log level %v", f.r.srv.MaxConnections(), f.r.level.Level())
	}

	// The same file again: nothing to apply; the refusal is said again.
	logs = f.reload("listen = \"127.0.0.1:4001\"\nmax-wait = \"100ms\"\nlog-level = \"debug\"\n" +
		"max-connections = 5\nmax-wait-in-txn = \"50ms\"\nmax-backend-concurrency = 8\nstrict-resource-groups = false\n" +
		"chargeback-tag-keys = \"application,controller\"\n")
	wantLines(t, logs, `refused=listen`)
	if strings.Contains(logs, "config reloaded") {
		t.Errorf("nothing changed, yet:\n%s", logs)
	}

	// Going quieter still says so.
	logs = f.reload("listen = \"127.0.0.1:4000\"\nlog-level = \"error\"\n")
	wantLines(t, logs, `level=INFO msg="config reloaded"`, "log-level: debug → error", "max-wait: 100ms → 30s")
	if f.r.level.Level() != slog.LevelError {
		t.Errorf("log level %v", f.r.level.Level())
	}
	if logs = f.reload("listen = \"127.0.0.1:4000\"\nlog-level = \"info\"\n"); !strings.Contains(logs, "log-level: error → info") {
		t.Errorf("back to info:\n%s", logs)
	}
	if logs = f.reload("listen = \"127.0.0.1:4000\"\nlog-level = \"info\"\n"); !strings.Contains(logs, `msg="config reloaded: nothing changed"`) {
		t.Errorf("unchanged file:\n%s", logs)
	}
}

func TestReloadCommandLineWins(t *testing.T) {
	f := newReloadFixture(t, "max-wait = \"30s\"\n", "--max-wait", "2s", "--max-connections", "3")
	logs := f.reload("max-wait = \"100ms\"\nmax-connections = 9\nlog-level = \"debug\"\n")
	wantLines(t, logs, "log-level: info → debug")
	if strings.Contains(logs, "max-wait:") || strings.Contains(logs, "max-connections:") {
		t.Errorf("a flag given on the command line was reloaded from the file:\n%s", logs)
	}
	if f.r.cur.MaxWait != 2*time.Second || f.r.srv.MaxConnections() != 3 {
		t.Errorf("max-wait %v, max-connections %d", f.r.cur.MaxWait, f.r.srv.MaxConnections())
	}
}

func TestReloadOfABadFileChangesNothing(t *testing.T) {
	for _, tt := range []struct{ name, body, why string }{
		{"syntax", "max-wait = \"100ms\"\nlog-level = \n", "config "},
		{"unknown key", "max-wait = \"100ms\"\nmax-wiat = \"1s\"\n", `unknown key \"max-wiat`},
		{"invalid value", "max-wait = \"100ms\"\nmax-connections = -1\n", "--max-connections must be >= 0"},
		{"bad duration", "max-wait = \"soon\"\n", `max-wait\": parse error`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newReloadFixture(t, "max-wait = \"30s\"\nmax-connections = 4\n")
			logs := f.reload(tt.body)
			wantLines(t, logs, `level=ERROR msg="config reload failed; nothing changed"`, tt.why)
			if f.r.cur.MaxWait != 30*time.Second || f.r.srv.MaxConnections() != 4 {
				t.Errorf("changed: max-wait %v, max-connections %d", f.r.cur.MaxWait, f.r.srv.MaxConnections())
			}
		})
	}
}

func TestReloadClientCertificate(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "a.pem"), filepath.Join(dir, "a.key")
	reloadtest.WriteCert(t, cert, key)
	body := "tls-cert = \"" + cert + "\"\ntls-key = \"" + key + "\"\n"
	f := newReloadFixture(t, body)
	first := f.r.cert.Label

	// Rotated in place: same file names, a new certificate.
	reloadtest.WriteCert(t, cert, key)
	logs := f.reload(body)
	wantLines(t, logs, `msg="config reloaded"`, "tls-cert: "+first+" → "+cert+" (sha256:")
	if f.r.cert.Label == first {
		t.Fatal("the rotated certificate is not in force")
	}

	// Other files.
	cert2, key2 := filepath.Join(dir, "b.pem"), filepath.Join(dir, "b.key")
	reloadtest.WriteCert(t, cert2, key2)
	logs = f.reload("tls-cert = \"" + cert2 + "\"\ntls-key = \"" + key2 + "\"\n")
	wantLines(t, logs, "tls-cert: "+cert+" (sha256:", "→ "+cert2+" (sha256:", "tls-key: "+key+" → "+key2)
	if f.r.cur.TLSCert != cert2 || f.r.cur.TLSKey != key2 {
		t.Errorf("files in force %s %s", f.r.cur.TLSCert, f.r.cur.TLSKey)
	}

	// A key that does not match: nothing changes.
	inForce := f.r.cert.Label
	logs = f.reload("tls-cert = \"" + cert2 + "\"\ntls-key = \"" + key + "\"\nmax-wait = \"1s\"\n")
	wantLines(t, logs, `msg="config reload failed; nothing changed"`, "client TLS")
	if f.r.cert.Label != inForce || f.r.cur.MaxWait != 30*time.Second {
		t.Error("a failed certificate changed something")
	}

	// Turning client TLS off needs a restart.
	logs = f.reload("max-wait = \"1s\"\n")
	wantLines(t, logs, "max-wait: 30s → 1s", `refused="tls-cert, tls-key"`)
	if f.r.cur.TLSCert != cert2 {
		t.Error("client TLS turned off by a reload")
	}
}

func TestReloadCannotTurnClientTLSOn(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "a.pem"), filepath.Join(dir, "a.key")
	reloadtest.WriteCert(t, cert, key)
	f := newReloadFixture(t, "")
	logs := f.reload("tls-cert = \"" + cert + "\"\ntls-key = \"" + key + "\"\n")
	wantLines(t, logs, `refused="tls-cert, tls-key"`)
	if f.r.cur.TLSCert != "" || f.r.cert.Label != "" {
		t.Error("client TLS turned on by a reload")
	}
}
