package rgpolicy

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
)

// CPUSource chooses where the CPU part of a statement's RU comes from.
type CPUSource uint8

const (
	// CPUAuto reads the backend thread's CPU time when the backend runs on
	// this host (Linux) and serves each session on its own thread, else
	// uses wall time.
	CPUAuto CPUSource = iota
	// CPUWall charges backend wall time: forwarding to final packet, less
	// time blocked writing to the client. Lock waits and SLEEP count.
	CPUWall
	// CPUProc reads the backend thread's CPU time wherever its thread id
	// can be read and belongs to a local mariadbd or mysqld, even when the
	// backend's address does not look local (a container, a NAT); a
	// session where it cannot falls back to wall time.
	CPUProc
)

// ParseCPUSource reads auto, wall or proc.
func ParseCPUSource(s string) (CPUSource, error) {
	switch strings.ToLower(s) {
	case "auto", "":
		return CPUAuto, nil
	case "wall":
		return CPUWall, nil
	case "proc":
		return CPUProc, nil
	}
	return CPUAuto, fmt.Errorf("rgpolicy: cpu source %q: want auto, wall or proc", s)
}

func (c CPUSource) String() string {
	switch c {
	case CPUWall:
		return "wall"
	case CPUProc:
		return "proc"
	}
	return "auto"
}

// cpuSource is the process-wide part: the mode asked for, whether the
// backend is local, which SQL finds a session's thread id (MariaDB's or
// MySQL's), and the source the latest session resolved to.
type cpuSource struct {
	mode     CPUSource
	local    bool
	procRoot string
	log      *slog.Logger
	// dialect: 0 unknown, 1 MariaDB's PROCESSLIST.TID, 2 MySQL's
	// performance_schema.threads.THREAD_OS_ID.
	dialect atomic.Int32
	// last is the source (CPUWall or CPUProc) of the session resolved last.
	last atomic.Uint32
	// onChange is called when last changes (the metric); may be nil.
	onChange atomic.Pointer[func(CPUSource)]
	// backendPID is the process of the backend thread a session read last
	// (0: none yet): CALIBRATE RESOURCE reads its CPU time and CPUs.
	backendPID atomic.Int64
}

func newCPUSource(mode CPUSource, backendAddr, procRoot string, log *slog.Logger) *cpuSource {
	c := &cpuSource{mode: mode, procRoot: procRoot, log: log}
	c.local = isLocalAddr(backendAddr)
	initial := CPUWall
	if mode != CPUWall && (mode == CPUProc || c.local) && procAvailable(procRoot) {
		initial = CPUProc // what sessions will try; the first one confirms
	}
	c.last.Store(uint32(initial))
	return c
}

// inForce is the source of the latest session (before any: the one
// sessions will try).
func (c *cpuSource) inForce() CPUSource { return CPUSource(c.last.Load()) }

func (c *cpuSource) note(src CPUSource) {
	if CPUSource(c.last.Swap(uint32(src))) != src {
		if f := c.onChange.Load(); f != nil {
			(*f)(src)
		}
	}
}

// procAvailable reports whether the proc file system shows this process.
func procAvailable(root string) bool {
	_, err := os.Stat(filepath.Join(root, "self", "stat"))
	return err == nil
}

// isLocalAddr reports whether host:port names this host: a loopback
// address, a local interface's address, or localhost.
func isLocalAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "" || strings.EqualFold(host, "localhost") {
		return true
	}
	ips := []net.IP{net.ParseIP(host)}
	if ips[0] == nil {
		addrs, err := net.LookupIP(host)
		if err != nil {
			return false
		}
		ips = addrs
	}
	local, _ := net.InterfaceAddrs()
	for _, ip := range ips {
		if ip.IsLoopback() || ip.IsUnspecified() {
			return true
		}
		for _, a := range local {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return true
			}
		}
	}
	return false
}

// cpuReader reads the CPU time of one session's backend thread from
// /proc/<tid>/schedstat, kept open. Used by the session goroutine only.
type cpuReader struct {
	tried bool
	f     *os.File
	fd    int // f's descriptor, read with pread while f is open
	buf   [64]byte
	// last is the reading at the end of the previous statement; lastOK
	// says nothing has run on the thread since (the backend thread is idle
	// between commands), so it is the next statement's start too.
	last   time.Duration
	lastOK bool
}

// cpuMinEstimate: a statement whose shape nearly always answers within
// this wall time on the backend (shapeEstimate.Short) is charged its
// backend wall time, at most cpuMinEstimate, instead of reading its CPU
// time: reading schedstat costs two system calls, more than such a
// statement's CPU is worth to measure, and a statement this short costs
// at most a third of an RU of CPU either way. The cap keeps a stall of
// the machine (or a row lock) out of a short statement's CPU: its CPU
// stayed short, its wait did not burn any. Heavy statements, new shapes
// and anything that waits (SLEEP, locks) more than now and then are read.
const cpuMinEstimate = time.Millisecond

// start returns the thread's CPU time at the start of a statement: the
// previous statement's end when nothing ran since, else a fresh reading.
func (r *cpuReader) start() (time.Duration, bool) {
	if r.lastOK {
		return r.last, true
	}
	return r.read()
}

// end reads the thread's CPU time at a statement's end and keeps it as
// the next one's start.
func (r *cpuReader) end() (time.Duration, bool) {
	r.last, r.lastOK = r.read()
	return r.last, r.lastOK
}

// stale notes that something ran on the thread outside a measured
// statement (a policy query, a statement charged wall time).
func (r *cpuReader) stale() { r.lastOK = false }

// readable says the session's backend thread's CPU can be read: CPU-true
// RU is in force for it.
func (r *cpuReader) readable() bool { return r.f != nil }

// open finds the session's backend thread, once per session: its id from
// the backend, then its schedstat file, which must belong to a local
// mariadbd or mysqld that runs one thread per connection. Anything else
// leaves the session on wall time.
func (r *cpuReader) open(ctx context.Context, src *cpuSource, be mysqlproto.Backend) {
	if r.tried {
		return
	}
	r.tried = true
	r.stale()
	if src.mode == CPUWall || (src.mode == CPUAuto && !src.local) || !procAvailable(src.procRoot) {
		src.note(CPUWall)
		return
	}
	tid, err := src.threadID(ctx, be)
	pid := 0
	if err == nil {
		var f *os.File
		f, pid, err = openSchedstat(src.procRoot, tid)
		err = r.use(f, err)
	}
	if err != nil {
		src.log.Debug("backend thread CPU not readable: charging wall time", "err", err)
		src.note(CPUWall)
		return
	}
	if _, ok := r.read(); !ok {
		r.close()
		src.note(CPUWall)
		return
	}
	src.backendPID.Store(int64(pid))
	src.note(CPUProc)
}

// threadID asks the backend for the OS thread serving this connection.
func (c *cpuSource) threadID(ctx context.Context, be mysqlproto.Backend) (int, error) {
	queries := [...]string{
		"SELECT TID, @@thread_handling FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()",
		"SELECT THREAD_OS_ID, @@thread_handling FROM performance_schema.threads WHERE PROCESSLIST_ID = CONNECTION_ID()",
	}
	order := []int{0, 1}
	switch c.dialect.Load() {
	case 1:
		order = []int{0}
	case 2:
		order = []int{1}
	}
	var lastErr error
	for _, i := range order {
		_, rows, err := be.Query(ctx, queries[i])
		if err != nil {
			var me *mysqlproto.Error
			if !asMySQLError(err, &me) {
				return 0, err // the connection broke: do not try more
			}
			lastErr = err
			continue
		}
		c.dialect.Store(int32(i + 1))
		if len(rows) != 1 || len(rows[0]) != 2 || rows[0][0] == nil {
			return 0, fmt.Errorf("rgpolicy: no thread id for this connection")
		}
		if h := rows[0][1]; h != nil && *h != "one-thread-per-connection" {
			return 0, fmt.Errorf("rgpolicy: thread_handling is %s: a session has no thread of its own", *h)
		}
		return strconv.Atoi(*rows[0][0])
	}
	return 0, lastErr
}

// openSchedstat opens <root>/<tid>/schedstat after checking that the
// thread belongs to a mariadbd or mysqld process, whose id it returns.
func openSchedstat(root string, tid int) (*os.File, int, error) {
	if tid <= 0 {
		return nil, 0, fmt.Errorf("rgpolicy: thread id %d", tid)
	}
	dir := filepath.Join(root, strconv.Itoa(tid))
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return nil, 0, fmt.Errorf("rgpolicy: thread %d: %w", tid, err)
	}
	tgid := ""
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
			tgid = strings.TrimSpace(v)
		}
	}
	comm, err := os.ReadFile(filepath.Join(root, tgid, "comm"))
	if err != nil {
		return nil, 0, fmt.Errorf("rgpolicy: thread %d: process %q: %w", tid, tgid, err)
	}
	switch name := strings.TrimSpace(string(comm)); name {
	case "mariadbd", "mysqld":
	default:
		return nil, 0, fmt.Errorf("rgpolicy: thread %d belongs to %q, not a MySQL server", tid, name)
	}
	pid, _ := strconv.Atoi(tgid)
	f, err := os.Open(filepath.Join(dir, "schedstat"))
	return f, pid, err
}

// read returns the thread's CPU time so far: schedstat's first field, in
// nanoseconds. It allocates nothing.
func (r *cpuReader) read() (time.Duration, bool) {
	if r.f == nil {
		return 0, false
	}
	// One pread: os.File.ReadAt would read again until the buffer is full,
	// a second system call that only finds the end of the file.
	n, err := syscall.Pread(r.fd, r.buf[:], 0)
	if n <= 0 || err != nil {
		return 0, false
	}
	return parseSchedstat(r.buf[:n])
}

// parseSchedstat reads the first field of a schedstat line: the thread's
// CPU time in nanoseconds.
func parseSchedstat(b []byte) (time.Duration, bool) {
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	var ns uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		ns = ns*10 + uint64(c-'0')
	}
	return time.Duration(ns), len(b) > 0
}

// use makes f, as openSchedstat returned it, the file r reads.
func (r *cpuReader) use(f *os.File, err error) error {
	if err != nil {
		return fmt.Errorf("rgpolicy: opening the thread's schedstat: %w", err)
	}
	r.f, r.fd = f, int(f.Fd())
	return nil
}

func (r *cpuReader) close() {
	if r.f != nil {
		_ = r.f.Close()
		r.f = nil
	}
}
