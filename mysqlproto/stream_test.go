package mysqlproto

import (
	"bufio"
	"bytes"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// rowStream plays prebuilt byte slices in order (the same slice may
// repeat), so that it allocates nothing while being read.
type rowStream struct {
	parts [][]byte
	i     int
}

func (s *rowStream) Read(b []byte) (int, error) {
	for s.i < len(s.parts) && len(s.parts[s.i]) == 0 {
		s.i++
	}
	if s.i == len(s.parts) {
		return 0, io.EOF
	}
	n := copy(b, s.parts[s.i])
	s.parts[s.i] = s.parts[s.i][n:]
	return n, nil
}

// wirePacket frames a payload as packets, continuations included.
func wirePacket(p []byte) []byte {
	var w []byte
	for {
		n := min(len(p), mysql.MaxPayloadLen)
		w = append(w, byte(n), byte(n>>8), byte(n>>16), 0)
		w = append(w, p[:n]...)
		p = p[n:]
		if n < mysql.MaxPayloadLen {
			return w
		}
	}
}

// resultSetStream is a one-column result set: the given rows, each
// repeated count times.
func resultSetStream(rows [][]byte, count int) *rowStream {
	s := &rowStream{}
	s.parts = append(s.parts, wirePacket(countPkt(1)), wirePacket(colPkt("b")), wirePacket(eofPkt(0)))
	for _, r := range rows {
		w := wirePacket(appendLenencString(nil, string(r)))
		for range count {
			s.parts = append(s.parts, w)
		}
	}
	s.parts = append(s.parts, wirePacket(eofPkt(mysql.SERVER_STATUS_AUTOCOMMIT)))
	return s
}

// TestStreamingDoesNotBuffer relays 48 MiB of rows (one of them 17 MiB,
// split over two packets) and checks that the relay allocated almost
// nothing: the response is never held whole.
func TestStreamingDoesNotBuffer(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 48 MiB")
	}
	var sink countWriter
	s, err := NewServer(Config{})
	if err != nil {
		t.Fatal(err)
	}
	ss := newSession(s, &sink)
	big := bytes.Repeat([]byte{'B'}, 17<<20)
	gen := resultSetStream([][]byte{big}, 1)
	more := resultSetStream([][]byte{bytes.Repeat([]byte{'r'}, 1<<20)}, 31)
	// The big row, then 31 rows of 1 MiB, then the end.
	gen.parts = append(gen.parts[:len(gen.parts)-1], more.parts[3:]...)
	var total int64
	for _, p := range gen.parts {
		total += int64(len(p))
	}
	ss.brd = bufio.NewReaderSize(gen, 64<<10)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var out Outcome
	if err := ss.relayResponse(respGeneric, false, &out); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if sink.n != total || out.ResponseBytes < 48<<20 {
		t.Fatalf("client got %d bytes of %d (response bytes %d)", sink.n, total, out.ResponseBytes)
	}
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 1<<20 {
		t.Errorf("allocated %d KiB while relaying %d MiB", grown>>10, total>>20)
	}
}

// countWriter is a client connection that counts and drops what it gets.
type countWriter struct {
	discardConn
	n int64
}

func (w *countWriter) Write(b []byte) (int, error) { w.n += int64(len(b)); return len(b), nil }

// fakeClock is a clock that moves only when the test's connections say so.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// slowClient blocks (on the fake clock) for 50 ms per write.
type slowClient struct {
	discardConn
	clock *fakeClock
}

func (c *slowClient) Write(b []byte) (int, error) {
	c.clock.t = c.clock.t.Add(50 * time.Millisecond)
	return len(b), nil
}

// slowBackend takes 10 ms (on the fake clock) per read.
type slowBackend struct {
	r     io.Reader
	clock *fakeClock
	reads int
}

func (b *slowBackend) Read(p []byte) (int, error) {
	b.reads++
	b.clock.t = b.clock.t.Add(10 * time.Millisecond)
	return b.r.Read(p)
}

// BackendTime excludes the time spent blocked writing to the client.
func TestBackendTimeExcludesClientWrites(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	s, err := NewServer(Config{WriteBufferSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	s.now = clock.now
	ss := newSession(s, &slowClient{clock: clock})
	pol := newRecPolicy()
	ss.pol = pol.Open(SessionInfo{})
	// 40 rows of 1000 bytes: the 4 KiB client buffer fills about ten times.
	be := &slowBackend{clock: clock}
	be.r = resultSetStream([][]byte{bytes.Repeat([]byte{'x'}, 1000)}, 40)
	ss.brd = bufio.NewReaderSize(be, 512)
	ss.bwr = bufio.NewWriter(io.Discard)
	ss.buf = query("SELECT b FROM t")
	st := Statement{Command: mysql.COM_QUERY, Query: "SELECT b FROM t"}
	if err := ss.statement(&st, len(ss.buf), respGeneric, false, nil); err != nil {
		t.Fatal(err)
	}
	got := pol.outcomes()
	if len(got) != 1 {
		t.Fatalf("outcomes %+v", got)
	}
	want := time.Duration(be.reads) * 10 * time.Millisecond
	if got[0].out.BackendTime != want || ss.rawClient.blocked < 10*50*time.Millisecond {
		t.Errorf("backend time %v, want %v (client blocked %v)", got[0].out.BackendTime, want, ss.rawClient.blocked)
	}
}
