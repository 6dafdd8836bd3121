package mysqlproto

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// discardConn is a client connection that swallows what it is written.
type discardConn struct{ net.Conn }

func (discardConn) Write(b []byte) (int, error) { return len(b), nil }
func (discardConn) Close() error                { return nil }
func (discardConn) RemoteAddr() net.Addr        { return &net.TCPAddr{} }

// smallResultSet is a backend response: 3 columns, 20 rows.
func smallResultSet() []byte { return smallResultSetRows(20) }

// smallResultSetRows is a backend response: 3 columns, rows rows.
func smallResultSetRows(rows int) []byte {
	var wire []byte
	add := func(p []byte) {
		wire = append(wire, byte(len(p)), byte(len(p)>>8), byte(len(p)>>16), 0)
		wire = append(wire, p...)
	}
	add(countPkt(3))
	for _, c := range []string{"id", "name", "price"} {
		add(colPkt(c))
	}
	add(eofPkt(0))
	for range rows {
		add(rowPkt("12345", "a product name", "19.99"))
	}
	add(eofPkt(mysql.SERVER_STATUS_AUTOCOMMIT))
	return wire
}

func relaySession(t testing.TB) (*session, *bytes.Reader) {
	s, err := NewServer(Config{})
	if err != nil {
		t.Fatal(err)
	}
	ss := newSession(s, discardConn{})
	src := bytes.NewReader(nil)
	ss.brd = bufio.NewReaderSize(src, 64<<10)
	return ss, src
}

// The relay of a response allocates nothing per packet.
func TestRelayAllocations(t *testing.T) {
	wire := smallResultSet()
	ss, src := relaySession(t)
	var out Outcome
	allocs := testing.AllocsPerRun(200, func() {
		src.Reset(wire)
		ss.brd.Reset(src)
		out = Outcome{}
		if err := ss.relayResponse(respGeneric, false, &out); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per relayed result set", allocs)
	}
	if out.ResponseBytes != int64(len(wire)-4*26) || ss.status != mysql.SERVER_STATUS_AUTOCOMMIT {
		t.Errorf("outcome %+v status %#x", out, ss.status)
	}
}

func BenchmarkRelaySmallResultSet(b *testing.B) {
	wire := smallResultSet()
	ss, src := relaySession(b)
	b.ReportAllocs()
	b.SetBytes(int64(len(wire)))
	for b.Loop() {
		src.Reset(wire)
		ss.brd.Reset(src)
		var out Outcome
		if err := ss.relayResponse(respGeneric, false, &out); err != nil {
			b.Fatal(err)
		}
	}
}

// nopPolicy forwards everything like PassThrough, but is not
// PassThrough: sessions treat it as a policy that may block, as they treat
// rgproxy's production policy.
type nopPolicy struct{ after int }

func (p *nopPolicy) Open(SessionInfo) SessionPolicy                      { return p }
func (p *nopPolicy) Before(context.Context, *Statement, Backend) Verdict { return Verdict{} }
func (p *nopPolicy) After(*Statement, *Outcome)                          { p.after++ }
func (p *nopPolicy) Event(EventKind, SessionInfo)                        {}

// BenchmarkStatement runs one COM_QUERY through a session against an
// in-memory backend: read the command, ask the policy, forward it, relay a
// one-row result set, report the outcome. "passthrough" is the bare wire
// path; "policy" is what production runs (a policy that may block, so the
// session arms its hangup check).
func BenchmarkStatement(b *testing.B) {
	for _, bc := range []struct {
		name string
		pol  Policy
	}{{"passthrough", PassThrough{}}, {"policy", &nopPolicy{}}} {
		b.Run(bc.name, func(b *testing.B) {
			s, err := NewServer(Config{Policy: bc.pol})
			if err != nil {
				b.Fatal(err)
			}
			ss := newSession(s, discardConn{})
			ss.pol = s.cfg.Policy.Open(SessionInfo{})
			ss.bwr = bufio.NewWriter(io.Discard)
			cmd := wirePacket(query("SELECT c FROM sbtest1 WHERE id=4242"))
			resp := smallResultSetRows(1)
			cr, br := bytes.NewReader(nil), bytes.NewReader(nil)
			ss.crd, ss.brd = bufio.NewReader(cr), bufio.NewReader(br)
			b.ReportAllocs()
			for b.Loop() {
				cr.Reset(cmd)
				ss.crd.Reset(cr)
				br.Reset(resp)
				ss.brd.Reset(br)
				if err := ss.command(); err != nil {
					b.Fatal(err)
				}
				ss.endCommand()
			}
			ss.cancel()
		})
	}
}

// BenchmarkSessionLoop runs statements through a real Server over loopback
// TCP: a client, the session's goroutine and an in-process backend that
// answers every command with a one-row result set. It measures the whole
// session loop, syscalls and scheduling included (the client's and the
// fake backend's costs too, so compare it only with itself).
func BenchmarkSessionLoop(b *testing.B) {
	for _, bc := range []struct {
		name string
		pol  Policy
	}{{"passthrough", PassThrough{}}, {"policy", &nopPolicy{}}} {
		b.Run(bc.name, func(b *testing.B) {
			resp := smallResultSetRows(1)
			backend := fakeBackend(b, resp)
			s, err := NewServer(Config{BackendAddr: backend, Policy: bc.pol,
				Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go func() { _ = s.Serve(ln) }()
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = s.Shutdown(ctx)
			}()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			if _, _, err := readMessage(br, nil, 1<<20); err != nil { // greeting
				b.Fatal(err)
			}
			caps := mysql.CLIENT_PROTOCOL_41 | mysql.CLIENT_SECURE_CONNECTION | mysql.CLIENT_PLUGIN_AUTH
			login := wirePacket(handshakeResp(caps, "bench", nil, "", "mysql_native_password", false))
			login[3] = 1
			if _, err := c.Write(login); err != nil {
				b.Fatal(err)
			}
			if p, _, err := readMessage(br, nil, 1<<20); err != nil || p[0] != mysql.OK_HEADER {
				b.Fatalf("login: %q, %v", p, err)
			}
			cmd := wirePacket(query("SELECT c FROM sbtest1 WHERE id=4242"))
			got := make([]byte, len(resp))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Write(cmd); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(br, got); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if !bytes.Equal(got, resp) {
				b.Fatalf("response %q, want %q", got, resp)
			}
		})
	}
}

// fakeBackend serves one connection: a greeting, OK to the login, then
// resp to every command. It returns its address.
func fakeBackend(b *testing.B, resp []byte) string {
	caps := mysql.CLIENT_PROTOCOL_41 | mysql.CLIENT_SECURE_CONNECTION | mysql.CLIENT_PLUGIN_AUTH
	return scriptedBackend(b, mariaGreeting(caps, 0, "mysql_native_password"), func(_ []byte, r *backendReply) { r.raw(resp) })
}
