package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/rgproxy/rgproxy/internal/clock"
)

func TestParseAccounts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []account
		err  bool
	}{
		{"app_a,app_b", []account{{"app_a", "pw"}, {"app_b", "pw"}}, false},
		{" app_a:secret , app_b ", []account{{"app_a", "secret"}, {"app_b", "pw"}}, false},
		{"root:", []account{{"root", ""}}, false},
		{"u:a:b", []account{{"u", "a:b"}}, false},
		{"a,,b,", []account{{"a", "pw"}, {"b", "pw"}}, false},
		{"", nil, true},
		{" , ", nil, true},
		{":pw", nil, true},
		{"a,a:x", nil, true},
	} {
		got, err := parseAccounts(tc.in, "pw")
		if tc.err {
			if !errors.Is(err, ErrUsage) {
				t.Errorf("parseAccounts(%q) = %v, %v; want ErrUsage", tc.in, got, err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseAccounts(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseAccounts(f *testing.F) {
	for _, s := range []string{"app_a,app_b", "a:b,c", "", ",:,", "x:y:z", "a,a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseAccounts(s, "def")
		if err != nil {
			if !errors.Is(err, ErrUsage) || got != nil {
				t.Fatalf("parseAccounts(%q) = %v, %v", s, got, err)
			}
			return
		}
		if len(got) == 0 {
			t.Fatalf("parseAccounts(%q): no accounts and no error", s)
		}
		seen := map[string]bool{}
		for _, a := range got {
			if a.Name == "" || seen[a.Name] || strings.ContainsAny(a.Name, ",:") || !strings.Contains(s, a.Name) {
				t.Fatalf("parseAccounts(%q): bad account %+v in %v", s, a, got)
			}
			seen[a.Name] = true
		}
	})
}

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   func(config) bool
		err  bool
	}{
		{nil, func(c config) bool {
			return c.Addr == "127.0.0.1:4000" && len(c.Accounts) == 2 && c.Accounts[0] == (account{"app_a", "apppw"}) &&
				c.Clients == 4 && c.Query == "SELECT BENCHMARK(150000, SHA1('rgproxy'))" && c.Duration == 0 && c.Interval == time.Second && c.Backoff == 20*time.Millisecond
		}, false},
		{[]string{"--users", "x", "--password", "p", "--clients", "2", "--duration", "3s"}, func(c config) bool {
			return len(c.Accounts) == 1 && c.Accounts[0] == (account{"x", "p"}) && c.Clients == 2 && c.Duration == 3*time.Second
		}, false},
		{[]string{"--clients", "0"}, nil, true},
		{[]string{"--interval", "0s"}, nil, true},
		{[]string{"--duration", "-1s"}, nil, true},
		{[]string{"--query", "  "}, nil, true},
		{[]string{"--users", ""}, nil, true},
		{[]string{"extra"}, nil, true},
		{[]string{"--no-such-flag"}, nil, true},
	} {
		c, err := parseArgs(tc.args, io.Discard)
		if tc.err != (err != nil) || (err == nil && !tc.ok(c)) {
			t.Errorf("parseArgs(%q) = %+v, %v", tc.args, c, err)
		}
	}
}

func TestIsThrottled(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&mysql.MySQLError{Number: 8252, Message: "Exceeded resource group quota limitation"}, true},
		{fmt.Errorf("exec: %w", &mysql.MySQLError{Number: 8252}), true},
		{&mysql.MySQLError{Number: 1045}, false},
		{errors.New("8252"), false},
		{nil, false},
	} {
		if got := isThrottled(tc.err); got != tc.want {
			t.Errorf("isThrottled(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestRateLine(t *testing.T) {
	for _, tc := range []struct {
		name      string
		prev, cur []counts
		dt        time.Duration
		want      string
	}{
		{"two users", []counts{{10, 0, 0}, {5, 5, 0}}, []counts{{110, 0, 0}, {25, 45, 0}}, 2 * time.Second,
			"   4.0s  a:    50.0 ok/s     0.0 throttled/s  b:    10.0 ok/s    20.0 throttled/s"},
		{"failures shown", []counts{{0, 0, 0}, {0, 0, 0}}, []counts{{1, 0, 3}, {0, 0, 0}}, time.Second,
			"   4.0s  a:     1.0 ok/s     0.0 throttled/s   3.0 failed/s  b:     0.0 ok/s     0.0 throttled/s"},
	} {
		if got := rateLine(4*time.Second, []string{"a", "b"}, tc.prev, tc.cur, tc.dt); got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

// TestRunAgainstMariaDB drives the shared MariaDB directly (no rgproxy:
// nothing is throttled) for 300 ms of a fake clock at 100 ms intervals:
// exactly three rate lines and the totals, however slowly this machine
// runs, once a statement has run (or failed) before the clock moves.
func TestRunAgainstMariaDB(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name       string
		query      string
		wantOK     bool
		wantFailed bool
	}{
		{"statements run", "SELECT 1", true, false},
		{"errors counted", "SELEC 1", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config{Addr: "127.0.0.1:3306", Accounts: []account{{"root", ""}}, Clients: 2, Query: tc.query,
				Duration: 300 * time.Millisecond, Interval: 100 * time.Millisecond, Backoff: 10 * time.Millisecond}
			l, err := open(context.Background(), cfg)
			if err != nil {
				t.Skipf("MariaDB on 127.0.0.1:3306 not reachable as root: %v", err)
			}
			defer l.close()
			clk := clock.NewFake()
			var out bytes.Buffer
			done := make(chan []counts, 1)
			go func() { done <- l.run(context.Background(), clk, &out, quiet) }()
			waitFor(t, func() bool { c := l.snap()[0]; return c.OK+c.Failed > 0 })
			for range 3 {
				waitFor(t, func() bool { return clk.Pending() == 1 }) // the next tick is armed
				clk.Advance(cfg.Interval)
			}
			var total []counts
			select {
			case total = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("run did not end at the end of its duration")
			}
			if got := total[0]; (got.OK > 0) != tc.wantOK || (got.Failed > 0) != tc.wantFailed || got.Throttled != 0 {
				t.Errorf("totals %+v", got)
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			ok := len(lines) == 5 && strings.HasPrefix(lines[4], "total:    0.3s  root:")
			for i, want := range []string{"   0.1s  root:", "   0.2s  root:", "   0.3s  root:"} {
				ok = ok && strings.HasPrefix(lines[i+1], want)
			}
			if !ok {
				t.Errorf("output:\n%s", out.String())
			}
		})
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRunFailsFastOnBadAddress(t *testing.T) {
	cfg := config{Addr: "127.0.0.1:1", Accounts: []account{{"u", "p"}}, Clients: 1, Query: "SELECT 1",
		Interval: time.Second, Backoff: time.Millisecond}
	start := time.Now()
	if _, err := run(context.Background(), cfg, clock.Real{}, io.Discard, slog.New(slog.DiscardHandler)); err == nil ||
		!strings.Contains(err.Error(), "user u") {
		t.Fatalf("run against a closed port: %v", err)
	}
	if d := time.Since(start); d > 6*time.Second {
		t.Errorf("took %v to fail", d)
	}
}
