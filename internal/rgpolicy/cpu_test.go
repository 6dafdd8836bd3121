package rgpolicy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/ru"
)

// fakeProc builds a proc tree: this process (self/stat), a mariadbd with
// pid 100 and its thread 123, and a thread 200 of some other program.
func fakeProc(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	write := func(rel, body string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("self/stat", "1 (rgproxy) S")
	write("100/comm", "mariadbd\n")
	write("123/status", "Name:\tmariadbd\nTgid:\t100\nPid:\t123\n")
	write("123/schedstat", "5000000 12345 67\n")
	write("300/comm", "bash\n")
	write("200/status", "Name:\tbash\nTgid:\t300\n")
	write("200/schedstat", "1 2 3\n")
	return root
}

// threadBackend answers the thread-id query like MariaDB (or, with
// mysql set, only MySQL's form), or fails.
type threadBackend struct {
	tid, handling string
	mysql         bool
	queries       []string
}

func (b *threadBackend) Query(_ context.Context, sql string) ([]string, [][]*string, error) {
	b.queries = append(b.queries, sql)
	if b.mysql == strings.Contains(sql, "information_schema.PROCESSLIST") {
		return nil, nil, &mysqlproto.Error{Code: 1054, Message: "Unknown column"}
	}
	return []string{"TID", "@@thread_handling"}, [][]*string{{&b.tid, &b.handling}}, nil
}

func TestCPUReaderFindsTheBackendThread(t *testing.T) {
	root := fakeProc(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	tests := []struct {
		name    string
		mode    CPUSource
		backend string
		be      *threadBackend
		want    CPUSource
	}{
		{"local MariaDB", CPUAuto, "127.0.0.1:3306", &threadBackend{tid: "123", handling: "one-thread-per-connection"}, CPUProc},
		{"local MySQL", CPUAuto, "127.0.0.1:3306", &threadBackend{tid: "123", handling: "one-thread-per-connection", mysql: true}, CPUProc},
		{"remote backend", CPUAuto, "192.0.2.1:3306", &threadBackend{tid: "123", handling: "one-thread-per-connection"}, CPUWall},
		{"remote backend, proc forced", CPUProc, "192.0.2.1:3306", &threadBackend{tid: "123", handling: "one-thread-per-connection"}, CPUProc},
		{"wall asked", CPUWall, "127.0.0.1:3306", &threadBackend{tid: "123", handling: "one-thread-per-connection"}, CPUWall},
		{"thread pool", CPUAuto, "127.0.0.1:3306", &threadBackend{tid: "123", handling: "pool-of-threads"}, CPUWall},
		{"a thread of another program", CPUProc, "127.0.0.1:3306", &threadBackend{tid: "200", handling: "one-thread-per-connection"}, CPUWall},
		{"no such thread", CPUAuto, "127.0.0.1:3306", &threadBackend{tid: "999", handling: "one-thread-per-connection"}, CPUWall},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := newCPUSource(tc.mode, tc.backend, root, quiet)
			var r cpuReader
			r.open(context.Background(), src, tc.be)
			defer r.close()
			if got := src.inForce(); got != tc.want {
				t.Fatalf("source %v, want %v", got, tc.want)
			}
			d, ok := r.read()
			if ok != (tc.want == CPUProc) || (ok && d != 5*time.Millisecond) {
				t.Fatalf("read %v %v", d, ok)
			}
			// Once per session.
			n := len(tc.be.queries)
			r.open(context.Background(), src, tc.be)
			if len(tc.be.queries) != n {
				t.Fatal("the thread was looked up twice")
			}
		})
	}
}

func TestCPUReaderRemembersTheDialect(t *testing.T) {
	root := fakeProc(t)
	src := newCPUSource(CPUAuto, "127.0.0.1:3306", root, slog.New(slog.NewTextHandler(io.Discard, nil)))
	be := &threadBackend{tid: "123", handling: "one-thread-per-connection", mysql: true}
	var r1, r2 cpuReader
	r1.open(context.Background(), src, be)
	r2.open(context.Background(), src, be)
	r1.close()
	r2.close()
	if len(be.queries) != 3 {
		t.Fatalf("queries %q: the second session must ask MySQL's form only", be.queries)
	}
}

func TestCPUReaderReadAllocatesNothing(t *testing.T) {
	root := fakeProc(t)
	f, _, err := openSchedstat(root, 123)
	if err != nil {
		t.Fatal(err)
	}
	r := cpuReader{tried: true, f: f}
	defer r.close()
	if n := testing.AllocsPerRun(100, func() { r.read() }); n != 0 {
		t.Fatalf("%v allocations per read", n)
	}
}

func TestParseSchedstat(t *testing.T) {
	for in, want := range map[string]time.Duration{"123 4 5\n": 123, "0 0 0": 0, "99": 99} {
		if got, ok := parseSchedstat([]byte(in)); !ok || got != want {
			t.Errorf("%q: %v %v", in, got, ok)
		}
	}
	for _, bad := range []string{"", "x 1", "-1 2"} {
		if _, ok := parseSchedstat([]byte(bad)); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestParseCPUSource(t *testing.T) {
	for in, want := range map[string]CPUSource{"auto": CPUAuto, "WALL": CPUWall, "proc": CPUProc} {
		if got, err := ParseCPUSource(in); err != nil || got != want {
			t.Errorf("%s: %v %v", in, got, err)
		}
	}
	if _, err := ParseCPUSource("cycles"); err == nil {
		t.Fatal("accepted cycles")
	}
}

// A broken backend connection stops the lookup at once.
func TestCPUReaderBrokenBackend(t *testing.T) {
	root := fakeProc(t)
	src := newCPUSource(CPUAuto, "127.0.0.1:3306", root, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var r cpuReader
	r.open(context.Background(), src, brokenBackend{})
	if src.inForce() != CPUWall {
		t.Fatal("not wall")
	}
}

type brokenBackend struct{}

func (brokenBackend) Query(context.Context, string) ([]string, [][]*string, error) {
	return nil, nil, errors.New("connection reset")
}

// A statement's start is the previous one's end while nothing else ran on
// the thread: one read of schedstat per statement, not two.
func TestCPUReaderReusesTheLastEnd(t *testing.T) {
	root := fakeProc(t)
	r := cpuReader{tried: true}
	if f, _, err := openSchedstat(root, 123); r.use(f, err) != nil {
		t.Fatal(err)
	}
	defer r.close()
	set := func(ns string) {
		if err := os.WriteFile(filepath.Join(root, "123", "schedstat"), []byte(ns+" 0 0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set("1000")
	start, _ := r.start()
	set("5000")
	end, _ := r.end()
	if start != 1000 || end != 5000 {
		t.Fatalf("first statement %v..%v", start, end)
	}
	set("7000") // something ran in between, but nobody said so: reused
	if s, _ := r.start(); s != 5000 {
		t.Fatalf("start %v, want the last end 5000", s)
	}
	r.stale() // a policy query ran
	if s, _ := r.start(); s != 7000 {
		t.Fatalf("start after stale %v, want a fresh 7000", s)
	}
}

// With CPU-true RU in force, a new shape's statements are charged the
// CPU the backend thread spent; once the shape is short its CPU goes
// unread and it is charged its wall time, but never more than
// cpuMinEstimate: a 30 ms stall of a point select is not CPU.
func TestPolicyChargesShortShapesCappedWallTime(t *testing.T) {
	root := fakeProc(t)
	setCPU := func(ns int) {
		body := strconv.Itoa(ns) + " 0 0\n"
		if err := os.WriteFile(filepath.Join(root, "123", "schedstat"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setCPU(1_000_000)
	tok := testGroups()
	p, err := New(Config{Tokens: tok, Settings: Settings{MaxWait: time.Second}, CPU: CPUProc, ProcRoot: root,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	be := &threadBackend{tid: "123", handling: "one-thread-per-connection"}
	s := p.Open(mysqlproto.SessionInfo{User: "nobody"}).(*session)
	defer s.Event(mysqlproto.EventClose, mysqlproto.SessionInfo{})
	cpu := 1_000_000
	run := func(wall, used time.Duration) float64 {
		t.Helper()
		st := query("SELECT c FROM t WHERE id = 7")
		if v := s.Before(context.Background(), st, be); v.Reply != nil {
			t.Fatal(v.Reply.Err)
		}
		cpu += int(used)
		setCPU(cpu)
		s.After(st, &mysqlproto.Outcome{BackendTime: wall})
		return s.last.cost.RRU
	}
	// RRU of a point select: the base cost plus 1/3 RU per CPU ms.
	base := ru.DefaultConfig().BeforeCost(ru.RequestInfo{Class: ru.ClassRead}).RRU
	cpuRU := func(d time.Duration) float64 { return base + float64(d)/float64(time.Millisecond)/3 }
	steps := []struct {
		name       string
		wall, used time.Duration
		want       float64
	}{
		{"new shape: its CPU is read", 300 * time.Microsecond, 90 * time.Microsecond, cpuRU(90 * time.Microsecond)},
		{"short now: wall time", 300 * time.Microsecond, 90 * time.Microsecond, cpuRU(300 * time.Microsecond)},
		{"a stall: capped", 30 * time.Millisecond, 90 * time.Microsecond, cpuRU(time.Millisecond)},
	}
	for _, st := range steps {
		if got := run(st.wall, st.used); !near(got, st.want) {
			t.Fatalf("%s: %.4f RRU, want %.4f", st.name, got, st.want)
		}
	}
	if got := p.CPUSourceInForce(); got != "proc" {
		t.Fatalf("CPU source %s, want proc", got)
	}
}
