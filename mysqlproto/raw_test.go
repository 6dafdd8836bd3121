package mysqlproto

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// rawClient speaks the protocol by hand, to send what drivers never send.
type rawClient struct {
	t     *testing.T
	c     net.Conn
	br    *bufio.Reader
	bw    *bufio.Writer
	salt  []byte
	caps  uint32
	maria uint32 // MariaDB's extended capabilities in force
	sent  []byte // the start of the last packet sent, for errors
}

// rawCaps are the capabilities dialRaw asks for.
const rawCaps = mysql.CLIENT_PROTOCOL_41 | mysql.CLIENT_SECURE_CONNECTION | mysql.CLIENT_PLUGIN_AUTH |
	mysql.CLIENT_MULTI_STATEMENTS | mysql.CLIENT_MULTI_RESULTS | mysql.CLIENT_PS_MULTI_RESULTS |
	mysql.CLIENT_TRANSACTIONS | mysql.CLIENT_LONG_PASSWORD | mysql.CLIENT_CONNECT_WITH_DB

func nativePassword(salt []byte, pw string) []byte {
	if pw == "" {
		return nil
	}
	h1 := sha1.Sum([]byte(pw))
	h2 := sha1.Sum(h1[:])
	h := sha1.New()
	h.Write(salt)
	h.Write(h2[:])
	h3 := h.Sum(nil)
	for i := range h3 {
		h3[i] ^= h1[i]
	}
	return h3
}

// dialRaw logs in as user with a mysql_native_password response.
func dialRaw(t *testing.T, addr, user, pw string) *rawClient {
	t.Helper()
	return dialRawCaps(t, addr, user, pw, rawCaps, 0)
}

// dialRawCaps logs in asking for the capabilities want and MariaDB's
// extended capabilities maria, of those the greeting offers.
func dialRawCaps(t *testing.T, addr, user, pw string, want, maria uint32) *rawClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	rc := &rawClient{t: t, c: c, br: bufio.NewReader(c), bw: bufio.NewWriter(c)}
	t.Cleanup(func() { c.Close() })
	g, _ := rc.read()
	gr, err := parseGreeting(g)
	if err != nil {
		t.Fatalf("greeting %q: %v", g, err)
	}
	// scramble: 8 bytes after conn id, then 12 after the reserved bytes
	i := bytes.IndexByte(g[1:], 0) + 2 + 4
	rc.salt = append(append([]byte{}, g[i:i+8]...), g[gr.reservedOff+10:gr.reservedOff+22]...)
	rc.caps, rc.maria = gr.Caps&want, gr.MariaCaps&maria
	resp := []byte{byte(rc.caps), byte(rc.caps >> 8), byte(rc.caps >> 16), byte(rc.caps >> 24), 0, 0, 0, 1, 45}
	resp = append(resp, make([]byte, 19)...)
	resp = append(resp, byte(rc.maria), byte(rc.maria>>8), byte(rc.maria>>16), byte(rc.maria>>24))
	resp = append(append(resp, user...), 0)
	auth := nativePassword(rc.salt, pw)
	resp = append(append(resp, byte(len(auth))), auth...)
	resp = append(append(resp, "rgproxy_test"...), 0)
	resp = append(append(resp, "mysql_native_password"...), 0)
	rc.write(1, resp)
	rc.finishAuth(pw)
	return rc
}

// finishAuth answers auth switches until OK.
func (rc *rawClient) finishAuth(pw string) {
	rc.t.Helper()
	for {
		p, seq := rc.read()
		switch p[0] {
		case mysql.OK_HEADER:
			return
		case mysql.ERR_HEADER:
			rc.t.Fatalf("login refused: %v", parseErrPacket(p))
		case mysql.EOF_HEADER:
			name, k, _ := nulString(p[1:])
			if string(name) != "mysql_native_password" {
				rc.t.Fatalf("auth switch to %s", name)
			}
			salt := bytes.TrimRight(p[1+k:], "\x00")
			rc.write(seq+1, nativePassword(salt, pw))
		default:
			rc.t.Fatalf("unexpected auth packet %q", p)
		}
	}
}

func (rc *rawClient) write(seq byte, p []byte) {
	rc.t.Helper()
	rc.sent = p[:min(len(p), 80)]
	if _, err := writeMessage(rc.bw, seq, p); err != nil {
		rc.t.Fatal(err)
	}
	if err := rc.bw.Flush(); err != nil {
		rc.t.Fatal(err)
	}
}

func (rc *rawClient) read() ([]byte, byte) {
	rc.t.Helper()
	p, seq, err := readMessage(rc.br, nil, 1<<30)
	if err != nil {
		rc.t.Fatalf("read (after sending %q): %v", rc.sent, err)
	}
	return p, seq
}

// cmd sends a command and returns its whole response as raw bytes
// (headers included), framed by a respMachine.
func (rc *rawClient) cmd(kind respKind, binary bool, p []byte) (raw []byte, m respMachine) {
	rc.t.Helper()
	rc.write(0, p)
	return rc.response(kind, binary)
}

// response reads one response framed by a respMachine.
func (rc *rawClient) response(kind respKind, binary bool) (raw []byte, m respMachine) {
	rc.t.Helper()
	m.reset(kind, respFlagsFor(rc.caps, rc.maria), binary)
	for {
		pl, seq := rc.read()
		raw = append(raw, byte(len(pl)), byte(len(pl)>>8), byte(len(pl)>>16), seq)
		raw = append(raw, pl...)
		ev, err := m.feed(pl, len(pl))
		if err != nil {
			rc.t.Fatalf("response: %v", err)
		}
		if ev == evDone {
			return raw, m
		}
		if ev == evInfile {
			rc.write(seq+1, nil)
		}
	}
}

// expectClosed checks that the proxy closed the connection.
func (rc *rawClient) expectClosed() {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		if _, _, err := readHeader(rc.br); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				rc.t.Fatal("connection still open")
			}
			return
		}
		rc.br.Discard(rc.br.Buffered())
	}
}

func query(q string) []byte { return append([]byte{mysql.COM_QUERY}, q...) }

func TestRawCommands(t *testing.T) {
	setupSchema(t)
	_, addr := startProxy(t, Config{})
	rc := dialRaw(t, addr, "root", "")
	ping := func() {
		t.Helper()
		raw, m := rc.cmd(respGeneric, false, []byte{mysql.COM_PING})
		if m.ErrCode != 0 || raw[4] != mysql.OK_HEADER {
			t.Fatalf("ping: %q", raw)
		}
	}
	for _, c := range []byte{0x12 /* BINLOG_DUMP */, 0x15 /* REGISTER_SLAVE */, 0x1d /* DAEMON */, 0x13 /* TABLE_DUMP */} {
		_, m := rc.cmd(respGeneric, false, []byte{c, 0, 0, 0, 0})
		if m.ErrCode != mysql.ER_UNKNOWN_COM_ERROR {
			t.Fatalf("command 0x%02x: error %d, want 1047", c, m.ErrCode)
		}
		ping()
	}
	raw, _ := rc.cmd(respSingle, false, []byte{mysql.COM_STATISTICS})
	if !bytes.Contains(raw, []byte("Uptime")) {
		t.Fatalf("statistics: %q", raw)
	}
	ping()
	rc.cmd(respGeneric, false, query("CREATE TABLE IF NOT EXISTS fl (a INT, b TEXT)"))
	raw, m := rc.cmd(respFieldList, false, append([]byte{mysql.COM_FIELD_LIST}, "fl\x00"...))
	if m.ErrCode != 0 || !bytes.Contains(raw, []byte("fl")) {
		t.Fatalf("field list: %q", raw)
	}
	_, m = rc.cmd(respSingle, false, []byte{mysql.COM_SET_OPTION, 1, 0}) // MULTI_STATEMENTS_OFF
	if m.ErrCode != 0 {
		t.Fatalf("set option: %d", m.ErrCode)
	}
	_, m = rc.cmd(respGeneric, false, append([]byte{mysql.COM_INIT_DB}, "mysql"...))
	if m.ErrCode != 0 {
		t.Fatalf("init db: %d", m.ErrCode)
	}
	_, m = rc.cmd(respGeneric, false, []byte{mysql.COM_RESET_CONNECTION})
	if m.ErrCode != 0 {
		t.Fatalf("reset connection: %d", m.ErrCode)
	}
	ping()
}

// TestBinaryRowsAndCursor compares COM_STMT_EXECUTE and COM_STMT_FETCH
// responses byte for byte with a direct connection.
func TestBinaryRowsAndCursor(t *testing.T) {
	setupSchema(t)
	_, addr := startProxy(t, Config{})
	run := func(addr string) [][]byte {
		rc := dialRaw(t, addr, "root", "")
		var out [][]byte
		_, m := rc.cmd(respPrepare, false, append([]byte{mysql.COM_STMT_PREPARE},
			"SELECT seq, seq * 1.5, CAST(seq AS CHAR), NOW() - NOW(), NULL, x'00ff', CAST('2020-01-02 03:04:05.6' AS DATETIME(3)) FROM seq_1_to_50"...))
		if m.ErrCode != 0 || !m.Prepared {
			t.Fatalf("prepare: %+v", m)
		}
		id := m.StmtID
		exec := func(flags byte) []byte {
			return []byte{mysql.COM_STMT_EXECUTE, byte(id), byte(id >> 8), byte(id >> 16), byte(id >> 24), flags, 1, 0, 0, 0}
		}
		raw, _ := rc.cmd(respGeneric, true, exec(0))
		out = append(out, raw)
		raw, m = rc.cmd(respGeneric, true, exec(1)) // CURSOR_TYPE_READ_ONLY
		if m.Status&mysql.SERVER_STATUS_CURSOR_EXISTS == 0 {
			t.Fatalf("no cursor opened: status %#x", m.Status)
		}
		out = append(out, raw)
		for range 3 {
			raw, _ = rc.cmd(respFetch, true, []byte{mysql.COM_STMT_FETCH, byte(id), byte(id >> 8), byte(id >> 16), byte(id >> 24), 20, 0, 0, 0})
			out = append(out, raw)
		}
		rc.write(0, []byte{mysql.COM_STMT_CLOSE, byte(id), byte(id >> 8), byte(id >> 16), byte(id >> 24)})
		raw, _ = rc.cmd(respGeneric, false, []byte{mysql.COM_PING})
		out = append(out, raw)
		return out
	}
	got, want := run(addr), run(backendAddr)
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("response %d differs:\nproxy  %q\ndirect %q", i, got[i], want[i])
		}
	}
}

// answer is what a server did with a packet: its first answer, if any
// (an ERR's code, SQLSTATE and sequence id), and whether it then closed
// the connection.
type answer struct {
	code   uint16
	state  string
	seq    byte
	closed bool
}

// answerOf reads what comes back within wait: an ERR (or nothing), then
// whether the connection closes.
func (rc *rawClient) answerOf(wait time.Duration) answer {
	rc.t.Helper()
	var a answer
	_ = rc.c.SetReadDeadline(time.Now().Add(wait))
	defer rc.c.SetReadDeadline(time.Time{})
	p, seq, err := readMessage(rc.br, nil, 1<<20)
	if err == nil {
		if len(p) > 0 && p[0] == mysql.ERR_HEADER {
			e := parseErrPacket(p)
			a.code, a.state = e.Code, e.State
		}
		a.seq = seq
		_, _, err = readHeader(rc.br)
	}
	var ne net.Error
	a.closed = err != nil && !(errors.As(err, &ne) && ne.Timeout())
	return a
}

// TestMalformedClientPackets: a broken command packet gets the ERR MariaDB
// sends for it, with its sequence id, and the connection closes or goes
// on as MariaDB's does; other sessions see nothing.
func TestMalformedClientPackets(t *testing.T) {
	setupSchema(t)
	srv, addr := startProxy(t, Config{MaxPacketPayload: 1024})
	other := dialRaw(t, addr, "root", "")
	for _, tc := range []struct {
		name  string
		send  func(rc *rawClient)
		want  answer
		kind  ProtocolErrorKind
		alike bool // compared with MariaDB itself
	}{
		{"bad sequence", func(rc *rawClient) { rc.write(5, []byte{mysql.COM_PING}) },
			answer{mysql.ER_NET_PACKETS_OUT_OF_ORDER, "08S01", 0, true}, ProtoOutOfOrder, true},
		{"empty packet", func(rc *rawClient) { rc.write(0, nil) },
			answer{mysql.ER_UNKNOWN_COM_ERROR, "08S01", 1, false}, ProtoMalformed, true},
		{"short execute", func(rc *rawClient) { rc.write(0, []byte{mysql.COM_STMT_EXECUTE, 1}) },
			answer{mysql.ER_MALFORMED_PACKET, "HY000", 1, false}, ProtoMalformed, true},
		{"short close", func(rc *rawClient) { rc.write(0, []byte{mysql.COM_STMT_CLOSE, 1}) },
			answer{}, ProtoMalformed, true},
		{"truncated", func(rc *rawClient) {
			rc.bw.Write([]byte{100, 0, 0, 0, mysql.COM_QUERY, 'S'})
			rc.bw.Flush()
			rc.c.(*net.TCPConn).CloseWrite()
		}, answer{closed: true}, -1, true},
		// MariaDB's max_allowed_packet is not 1024 here: rgproxy's own limit.
		{"oversized", func(rc *rawClient) { rc.write(0, query(string(make([]byte, 2000)))) },
			answer{mysql.ER_NET_PACKET_TOO_LARGE, "08S01", 1, true}, ProtoTooLarge, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := srv.Stats().ProtocolErrors
			try := func(addr string) answer {
				rc := dialRaw(t, addr, "root", "")
				tc.send(rc)
				a := rc.answerOf(time.Second)
				if !a.closed {
					if _, m := rc.cmd(respGeneric, false, []byte{mysql.COM_PING}); m.ErrCode != 0 {
						t.Fatalf("%s: the session does not go on: %d", addr, m.ErrCode)
					}
				}
				return a
			}
			if got := try(addr); got != tc.want {
				t.Errorf("through rgproxy: %+v, want %+v", got, tc.want)
			}
			if tc.alike {
				if direct := try(backendAddr); direct != tc.want {
					t.Errorf("MariaDB itself: %+v, the test wants %+v", direct, tc.want)
				}
			}
			after := srv.Stats().ProtocolErrors
			for k := range after {
				want := before[k]
				if ProtocolErrorKind(k) == tc.kind {
					want++
				}
				if after[k] != want {
					t.Errorf("%s errors counted %d, want %d", ProtocolErrorKind(k), after[k]-before[k], want-before[k])
				}
			}
			if _, m := other.cmd(respGeneric, false, []byte{mysql.COM_PING}); m.ErrCode != 0 {
				t.Fatal("other session affected")
			}
		})
	}
}

func newBufs(c net.Conn) (*bufio.Reader, *bufio.Writer) {
	return bufio.NewReader(c), bufio.NewWriter(c)
}
