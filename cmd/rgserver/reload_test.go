package main

import (
	"bytes"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/internal/reload/reloadtest"
)

// peerCert shakes hands with tc over a pipe and returns the certificate
// the server offered.
func peerCert(t *testing.T, tc *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		s := tls.Server(a, tc)
		if s.Handshake() == nil {
			_, _ = io.Copy(io.Discard, s)
		}
	}()
	c := tls.Client(b, &tls.Config{InsecureSkipVerify: true})
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	return c.ConnectionState().PeerCertificates[0].Raw
}

func TestReloadLogLevelAndCertificate(t *testing.T) {
	dir := t.TempDir()
	cert, key, file := filepath.Join(dir, "c.pem"), filepath.Join(dir, "c.key"), filepath.Join(dir, "rgserver.toml")
	reloadtest.WriteCert(t, cert, key)
	write := func(body string) {
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tlsKeys := "tls-cert = \"" + cert + "\"\ntls-key = \"" + key + "\"\n"
	write(tlsKeys + "log-level = \"warn\"\n")
	args := []string{"--config", file, "--addr", "127.0.0.1:4444"}
	cfg, _, err := parseArgs(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	rl := &reloader{args: args, cur: cfg, level: new(slog.LevelVar)}
	rl.level.Set(slog.LevelWarn)
	rl.log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: rl.level}))
	tc, err := serverTLS(cfg, rl)
	if err != nil {
		t.Fatal(err)
	}
	first := peerCert(t, tc)
	reload := func(body string) string {
		t.Helper()
		write(body)
		logs.Reset()
		rl.reload()
		return logs.String()
	}

	// Rotated in place, the level lowered, an address changed in the file
	// (the command line's wins, so no change) and the status address moved
	// (needs a restart).
	reloadtest.WriteCert(t, cert, key)
	out := reload(tlsKeys + "log-level = \"debug\"\naddr = \"127.0.0.1:5555\"\nstatus-addr = \"127.0.0.1:5556\"\n")
	for _, want := range []string{`level=INFO msg="config reloaded"`, "log-level: warn → debug", "tls-cert: " + cert + " (sha256:",
		`level=WARN msg="config reload: these settings need a restart and were not changed"`, "status-addr: 127.0.0.1:3380 → 127.0.0.1:5556"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "addr: 127.0.0.1:4444") {
		t.Errorf("the command line's --addr lost to the file:\n%s", out)
	}
	if rl.level.Level() != slog.LevelDebug {
		t.Errorf("level %v", rl.level.Level())
	}
	if bytes.Equal(peerCert(t, tc), first) {
		t.Error("a new handshake still gets the old certificate")
	}

	// A file that does not validate changes nothing.
	out = reload(tlsKeys + "log-level = \"loud\"\n")
	if !strings.Contains(out, `level=ERROR msg="config reload failed; nothing changed"`) || rl.level.Level() != slog.LevelDebug {
		t.Errorf("bad level: %v\n%s", rl.level.Level(), out)
	}
	// Nor does a certificate whose key does not match.
	other, otherKey := filepath.Join(dir, "o.pem"), filepath.Join(dir, "o.key")
	reloadtest.WriteCert(t, other, otherKey)
	inForce := peerCert(t, tc)
	out = reload("tls-cert = \"" + other + "\"\ntls-key = \"" + key + "\"\nlog-level = \"info\"\n")
	if !strings.Contains(out, "config reload failed") || rl.level.Level() != slog.LevelDebug || !bytes.Equal(peerCert(t, tc), inForce) {
		t.Errorf("a mismatched key changed something:\n%s", out)
	}
	// TLS cannot be turned off while serving.
	out = reload("log-level = \"info\"\n")
	if !strings.Contains(out, `refused="tls-cert, tls-key"`) || !strings.Contains(out, "log-level: debug → info") {
		t.Errorf("turning TLS off:\n%s", out)
	}
}

// --budget-time-zone needs a restart: moving the windows under a running
// leader would change which spending counts in which window. A zone that
// does not load fails the reload as a whole.
func TestReloadRefusesBudgetTimeZone(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rgserver.toml")
	write := func(body string) {
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("budget-time-zone = \"UTC\"\n")
	args := []string{"--config", file}
	cfg, _, err := parseArgs(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	rl := &reloader{args: args, cur: cfg, level: new(slog.LevelVar)}
	rl.log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: rl.level}))
	write("budget-time-zone = \"Europe/Berlin\"\n")
	rl.reload()
	if out := logs.String(); !strings.Contains(out, "these settings need a restart and were not changed") ||
		!strings.Contains(out, "budget-time-zone: UTC → Europe/Berlin") {
		t.Errorf("a changed zone was not refused:\n%s", out)
	}
	if rl.cur.BudgetTimeZone != "UTC" || rl.cur.budgetLoc != time.UTC {
		t.Errorf("zone in force %q %v", rl.cur.BudgetTimeZone, rl.cur.budgetLoc)
	}
	logs.Reset()
	write("budget-time-zone = \"Nowhere/Atlantis\"\n")
	rl.reload()
	if out := logs.String(); !strings.Contains(out, "Nowhere/Atlantis") || !strings.Contains(out, "not an IANA time zone name") {
		t.Errorf("an unknown zone did not fail the reload:\n%s", out)
	}
}
