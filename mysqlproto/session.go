package mysqlproto

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/pingcap/failpoint"

	"github.com/rgproxy/rgproxy/sqlscan"
)

// Session errors.
var (
	// ErrBackendLost means the backend connection failed mid-session.
	ErrBackendLost = errors.New("mysqlproto: lost connection to backend")
	// ErrAuthRefused means rgproxy refused to relay an authentication.
	ErrAuthRefused = errors.New("mysqlproto: authentication refused by rgproxy")
	// errQuit ends a session on COM_QUIT or a failed login.
	errQuit = errors.New("mysqlproto: session ends")
	// errBackendClosed ends a session whose backend closed the
	// connection while the session waited for its client.
	errBackendClosed = errors.New("mysqlproto: the backend closed the connection")
)

// inspectLen is how much of a response packet the state machine looks at;
// an OK packet's status flags lie within its first 23 bytes.
const inspectLen = 64

// authLimit bounds a single packet of the handshake.
const authLimit = 1 << 20

// prepared is what a session remembers of a prepared statement.
type prepared struct {
	query    string
	class    sqlscan.Class
	scan     sqlscan.Scan    // of query; Digest points into digest
	charset  sqlscan.Charset // the character set query was read in
	digest   []byte          // the digest, owned by the statement
	longData int64           // SEND_LONG_DATA bytes not yet charged to an EXECUTE
}

// session is one client connection and its dedicated backend connection.
// All its fields are used by its own goroutine, except mu's.
type session struct {
	srv *Server
	log *slog.Logger
	ctx context.Context
	// cancel ends ctx: on session close or when Shutdown gives up.
	cancel context.CancelFunc

	rawClient *countingConn
	client    net.Conn // rawClient, or the TLS connection over it
	crd       *bufio.Reader
	cwr       *bufio.Writer
	clientTLS bool

	rawBackend *countingConn
	backend    net.Conn
	brd        *bufio.Reader
	bwr        *bufio.Writer
	backendTLS bool

	caps   uint32 // capabilities in force between client and backend
	maria  uint32 // MariaDB's extended capabilities in force
	rflags respFlags
	status uint16 // the backend's last status flags
	info   SessionInfo
	pol    SessionPolicy
	// preAuth: the session holds a place in the server's pre-login gate,
	// under host.
	preAuth bool
	host    netip.Prefix
	// acct is what buf is charged to Config.CommandBufferLimit.
	acct allowance
	// The policy's optional hooks, nil when it has none.
	rewriter ErrorRewriter
	progress ProgressObserver
	follow   FollowUpper
	followBe followBackend // the Backend FollowUp gets, reused
	m        respMachine
	rw       replyWriter
	// bufs holds cwr, brd and bwr while the session works (acquire); nil
	// while it is parked between commands.
	bufs   *workBufs
	buf    []byte
	digest []byte // the current statement's digest (Statement.Scan.Digest)
	// lastBackend is when the session last sent the backend a command:
	// see keepBackendAlive.
	lastBackend time.Time
	// prepClass is the class of the text of the COM_STMT_PREPARE in flight.
	prepClass sqlscan.Class
	stmts     map[uint32]*prepared
	// lastStmt is the statement prepared last, which MariaDB lets a
	// command name as lastStmtID; 0 when there is none.
	lastStmt uint32
	// attrLen is the length of the query-attribute block before the
	// current COM_QUERY's text (QUERY_ATTRIBUTES), 0 without it.
	attrLen int
	// unread is what is left to read from the client of the current
	// command's first packet, of which ss.buf holds the start (a large
	// execute or bulk is relayed as it arrives).
	unread int
	seq    byte // sequence id of the last packet sent to the client
	// charset is how the backend reads the session's text now
	// (character_set_client); csStale: a statement may have changed it in
	// a way its text does not tell, and the backend is asked before the
	// next text is scanned; sqlPrepared: what each SQL-level prepared
	// statement (by lower-case name) does to it (charset.go).
	charset     sqlscan.Charset
	csStale     bool
	sqlPrepared map[string]sqlscan.CharsetEffect
	// st and out are the current statement's, reused so that a statement
	// costs no allocation for them; policies get pointers valid only
	// during the call.
	st  Statement
	out Outcome

	// the hangup check (hangup.go): bgen is shared with the hangupSampler,
	// hangupSeen is the hangupSampler's own, hangupDone tells a check's end.
	bgen       atomic.Uint64
	hangupSeen uint64
	hangupDone chan struct{}

	// resetClient closes the client connection with a reset (the backend
	// reset its own).
	resetClient bool

	// bstate is shared with the backend poller (backendpoll_linux.go): bwIdle
	// while the session waits for its client only, bwGone once the
	// backend closed.
	bstate atomic.Uint32

	mu      sync.Mutex
	busy    bool
	closing bool
}

// Bits of session.bstate.
const (
	bwIdle uint32 = 1 << iota
	bwGone
)

// backendClosed is called by the backend poller when the backend connection
// closed. A session waiting for its client is woken by a read deadline in
// the past; a busy one sees the close by itself (its next read of the
// backend fails) or, if its statement ended first, when it next goes idle.
// Once bwGone is set the session never reads its client again, so a wake
// that races with the session leaving idle is harmless.
func (ss *session) backendClosed() {
	if old := ss.bstate.Or(bwGone); old&bwIdle != 0 && old&bwGone == 0 {
		_ = ss.rawClient.SetReadDeadline(time.Unix(1, 0))
	}
}

// enterIdle marks the session as waiting for its client only; true means
// the backend has already closed.
func (ss *session) enterIdle() bool { return ss.bstate.Or(bwIdle)&bwGone != 0 }

// leaveIdle marks the session busy again; true means the backend closed.
func (ss *session) leaveIdle() bool { return ss.bstate.And(^bwIdle)&bwGone != 0 }

// backendGone ends a session whose backend closed while the session waited
// for its client: the backend's last packet, when it is an ERR (MySQL 8
// sends 4031 on wait_timeout, MariaDB nothing), is relayed as it came, and
// the client connection closes at once, as a direct connection's would.
func (ss *session) backendGone() error {
	ss.acquire()
	_ = ss.backend.SetReadDeadline(time.Now().Add(time.Second))
	p, seq, err := readMessage(ss.brd, ss.buf, authLimit)
	ss.buf = p
	if errors.Is(err, syscall.ECONNRESET) {
		// MariaDB resets on wait_timeout: so does rgproxy, so that the
		// client's next write fails as it would directly (the mariadb CLI
		// then says 2006 "Server has gone away").
		ss.resetClient = true
	}
	if err != nil || len(p) == 0 || p[0] != mysql.ERR_HEADER {
		return errBackendClosed
	}
	if ss.sendClient(seq, p) == nil {
		_ = ss.cwr.Flush()
	}
	return fmt.Errorf("%w after ERR %w", errBackendClosed, parseErrPacket(p))
}

// backendReset reads what is left of a backend connection that closed
// during the login (within a second) and reports whether it ended with a
// reset, which the client then gets too: MariaDB resets a login that
// outlives its connect_timeout.
func (ss *session) backendReset() bool {
	ss.acquire()
	_ = ss.backend.SetReadDeadline(time.Now().Add(time.Second))
	_, err := io.Copy(io.Discard, io.LimitReader(ss.brd, authLimit))
	return errors.Is(err, syscall.ECONNRESET)
}

func newSession(s *Server, c net.Conn) *session {
	ss := &session{
		srv:        s,
		rawClient:  &countingConn{Conn: c, raw: newRawSock(c), n: &s.clientBytes, now: s.now, timed: true},
		stmts:      make(map[uint32]*prepared),
		hangupDone: make(chan struct{}, 1),
	}
	ss.info.ID = s.nextID.Add(1)
	ss.info.ClientAddr = c.RemoteAddr()
	ss.log = s.log.With("session", ss.info.ID, "client", ss.info.ClientAddr)
	ss.ctx, ss.cancel = context.WithCancel(s.hardCtx)
	ss.acct.b = &s.budget
	ss.setClient(ss.rawClient)
	ss.acquire()
	return ss
}

// setClient makes c the client connection: a new reader (the old one, if
// it holds bytes, is read through by c), and the client writer, which a
// working session holds, writes to c.
func (ss *session) setClient(c net.Conn) {
	ss.client = c
	ss.crd = bufio.NewReaderSize(c, clientReadSize)
	if ss.cwr != nil {
		ss.cwr.Reset(c)
	}
}

// setBackend makes c the backend connection, read and written through
// the session's pooled reader and writer.
func (ss *session) setBackend(c net.Conn) {
	ss.backend = c
	ss.acquire()
	ss.brd, ss.bwr = ss.bufs.br, ss.bufs.bw
	ss.brd.Reset(c)
	ss.bwr.Reset(c)
}

// acquire takes, from the server's pool, the client writer and the
// backend reader and writer that park gave back.
func (ss *session) acquire() {
	if ss.cwr != nil {
		return
	}
	b := ss.srv.pools.get()
	ss.bufs, ss.cwr = b, b.cw
	ss.cwr.Reset(ss.client)
	if ss.backend != nil {
		ss.brd, ss.bwr = b.br, b.bw
		ss.brd.Reset(ss.backend)
		ss.bwr.Reset(ss.backend)
	}
}

// park is called between commands: the client writer and the backend
// reader and writer go back to the pool when they hold nothing, a
// command buffer that grew beyond keepBuf is dropped, and the wait for
// the rest of a command (Config.NetReadTimeout) is disarmed. An idle
// session then holds only its client reader. A client that pipelined its
// next command keeps everything: it is about to be used.
func (ss *session) park() {
	ss.disarmRead()
	if cap(ss.buf) > keepBuf {
		ss.buf = nil
		ss.acct.release()
	}
	if cap(ss.digest) > keepBuf {
		ss.digest = nil
	}
	if ss.crd.Buffered() == 0 {
		ss.parkBuffers()
	}
}

// parkBuffers gives the pooled writers and reader back if they hold
// nothing: the session is about to wait for its client.
func (ss *session) parkBuffers() {
	if ss.cwr == nil || ss.cwr.Buffered() > 0 ||
		ss.bwr != nil && ss.bwr.Buffered() > 0 || ss.brd != nil && ss.brd.Buffered() > 0 {
		return
	}
	ss.releaseBuffers()
}

// releaseBuffers gives the pooled writers and reader back.
func (ss *session) releaseBuffers() {
	if ss.bufs == nil {
		return
	}
	ss.srv.pools.put(ss.bufs)
	ss.bufs, ss.cwr, ss.brd, ss.bwr = nil, nil, nil, nil
}

// armRead bounds each wait for the rest of the command under way by
// Config.NetReadTimeout; it costs nothing until a read has to wait.
func (ss *session) armRead() { ss.rawClient.readTimeout = ss.srv.cfg.NetReadTimeout }

// disarmRead lifts armRead's bound.
func (ss *session) disarmRead() {
	c := ss.rawClient
	c.readTimeout = 0
	if !c.readDeadlineAt.IsZero() {
		c.readDeadlineAt = time.Time{}
		_ = c.SetReadDeadline(time.Time{})
	}
}

// leavePreAuth gives back the session's place in the pre-login gate.
func (ss *session) leavePreAuth() {
	if ss.preAuth {
		ss.preAuth = false
		ss.srv.gate.leave(ss.host)
	}
}

// shutdown is called by Server.Shutdown: an idle session closes now, a
// busy one after its current response.
func (ss *session) shutdown() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.closing = true
	if !ss.busy {
		_ = ss.rawClient.Close()
	}
}

// forceClose ends a session at once.
func (ss *session) forceClose() {
	ss.cancel()
	_ = ss.rawClient.Close()
	ss.mu.Lock()
	if ss.rawBackend != nil {
		_ = ss.rawBackend.Close()
	}
	ss.mu.Unlock()
}

// beginCommand marks the session busy; false means it must close instead.
func (ss *session) beginCommand() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closing {
		return false
	}
	ss.busy = true
	return true
}

// endCommand marks the session idle; false means it must close now.
func (ss *session) endCommand() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.busy = false
	return !ss.closing
}

func (ss *session) isClosing() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.closing
}

// close releases everything and tells the policy.
func (ss *session) close() {
	ss.cancel()
	if ss.backend != nil {
		ss.srv.bpoll.Load().remove(ss.info.ID)
		if ss.bstate.Load()&bwGone == 0 && ss.pol != nil {
			// A polite COM_QUIT after a login; the backend would otherwise
			// log an aborted connection. (Before one, the backend waits for
			// a handshake response: it would only take it for a bad one.)
			_ = ss.backend.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			ss.acquire()
			_, _ = writeMessage(ss.bwr, 0, []byte{mysql.COM_QUIT})
			_ = ss.bwr.Flush()
		}
		_ = ss.backend.Close()
	}
	if tc, ok := ss.rawClient.Conn.(*net.TCPConn); ok && ss.resetClient {
		_ = tc.SetLinger(0)
	}
	_ = ss.client.Close()
	ss.releaseBuffers()
	ss.acct.release()
	if ss.pol != nil {
		defer func() {
			if r := recover(); r != nil {
				ss.log.Error("policy panicked in Event(close)", "panic", r)
			}
		}()
		ss.pol.Event(EventClose, ss.info)
	}
}

func (ss *session) run() {
	err := ss.login()
	ss.leavePreAuth()
	if err != nil {
		ss.loginFailed(err)
		return
	}
	ss.park()
	ss.pol = ss.srv.cfg.Policy.Open(ss.info)
	ss.rewriter, _ = ss.pol.(ErrorRewriter)
	ss.progress, _ = ss.pol.(ProgressObserver)
	ss.follow, _ = ss.pol.(FollowUpper)
	for {
		err := ss.command()
		if err == nil {
			if ss.endCommand() {
				ss.park()
				continue
			}
			ss.log.Debug("session closed by shutdown")
			return
		}
		var ce *clientError
		switch {
		case errors.As(err, &ce):
			ss.protocolError(ce)
		case errors.Is(err, errQuit):
		case errors.Is(err, ErrBackendLost):
			ss.log.Warn("backend connection lost", "err", err)
		case errors.Is(err, os.ErrDeadlineExceeded) && ss.rawClient.readTimeout > 0:
			ss.protocolError(newClientError(ProtoReadTimeout, ss.seq+1, err))
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) && ss.isClosing() ||
			errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
			ss.log.Debug("client closed the connection", "err", err)
		case errors.Is(err, errBackendClosed):
			ss.log.Debug("backend closed the idle session; closed its client", "err", err)
		default:
			ss.log.Warn("closing session", "err", err)
		}
		return
	}
}

// loginFailed logs, at most once a second for each cause, why a login
// failed, and answers a protocol error as MariaDB does.
func (ss *session) loginFailed(err error) {
	var ce *clientError
	addr := ss.info.ClientAddr.String()
	switch {
	case errors.As(err, &ce):
		ss.protocolError(ce)
	case ss.bstate.Load()&bwGone != 0 && !errors.Is(err, ErrBackendLost):
		if !errors.Is(err, errBackendClosed) { // else backendGone read the backend's end
			ss.resetClient = ss.backendReset()
		}
		ss.log.Debug("backend closed the connection during login", "err", err, "reset", ss.resetClient)
	case errors.Is(err, os.ErrDeadlineExceeded):
		ss.srv.loginLog.event("timeout", "client", addr, "timeout", ss.srv.cfg.HandshakeTimeout, "err", err)
	case errors.Is(err, errQuit):
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
		// Health checks connect and leave: not worth a warning.
		ss.log.Debug("client left during login", "err", err)
	case errors.Is(err, ErrBackendLost):
		ss.srv.loginLog.event("backend", "client", addr, "err", err)
	case errors.Is(err, errClientTLS):
		ss.srv.loginLog.event("tls", "client", addr, "err", err)
	case errors.Is(err, ErrAuthRefused):
		ss.srv.loginLog.event("refused", "client", addr, "user", ss.info.User, "err", err)
	default:
		ss.srv.loginLog.event("other", "client", addr, "err", err)
	}
}

// protocolError counts a client packet refused, logs it (at most once a
// second for all) and sends the client MariaDB's ERR for it; the caller
// then closes the connection.
func (ss *session) protocolError(ce *clientError) {
	ss.srv.protoErrors[ce.kind].Add(1)
	ss.srv.protoLog.event(ce.kind.String(), "client", ss.info.ClientAddr.String(), "user", ss.info.User, "err", ce.err)
	if ce.reply == nil {
		return
	}
	ss.acquire()
	// A client that does not read must not hold the session.
	_ = ss.rawClient.SetWriteDeadline(time.Now().Add(time.Second))
	_ = ss.sendError(ce.seq, ce.reply)
}

// malformed answers a command packet MariaDB answers and goes on from
// (reply nil: it says nothing), and counts and logs it as a protocol
// error; the session goes on.
func (ss *session) malformed(seq byte, reply *Error, err error) error {
	ss.srv.protoErrors[ProtoMalformed].Add(1)
	ss.srv.protoLog.event(ProtoMalformed.String(), "client", ss.info.ClientAddr.String(), "user", ss.info.User, "err", err)
	if reply == nil {
		return nil
	}
	return ss.sendError(seq, reply)
}

// errClientTLS marks a client's failed TLS handshake.
var errClientTLS = errors.New("mysqlproto: client TLS handshake")

// sendClient writes one payload to the client with the next sequence id.
func (ss *session) sendClient(seq byte, p []byte) error {
	next, err := writeMessage(ss.cwr, seq, p)
	ss.seq = next - 1
	return err
}

// sendError writes an ERR packet to the client and flushes.
func (ss *session) sendError(seq byte, e *Error) error {
	if err := ss.sendClient(seq, appendErr(ss.buf[:0], e)); err != nil {
		return err
	}
	return ss.cwr.Flush()
}

// login dials the backend and relays the handshake both ways. The whole
// login is bounded by HandshakeTimeout, and the session is "idle" for the
// backend poller meanwhile: a backend that gives up on a client that does
// not answer (MariaDB's connect_timeout) closes that client at once.
func (ss *session) login() error {
	cfg := &ss.srv.cfg
	deadline := time.Now().Add(cfg.HandshakeTimeout)
	_ = ss.rawClient.SetDeadline(deadline)
	defer ss.rawClient.SetDeadline(time.Time{})
	gp, g, err := ss.dialBackend(deadline)
	if err != nil {
		if errors.Is(err, errBackendRefused) {
			return err
		}
		return ss.backendUnreachable(err, deadline)
	}
	ss.info.BackendConnID = g.ConnID
	backendCaps, backendMaria := g.Caps, g.MariaCaps
	offer := backendCaps & supportedCaps
	if cfg.ClientTLS != nil {
		offer |= mysql.CLIENT_SSL
	}
	rewriteGreeting(gp, &g, offer, backendMaria&supportedMariaCaps)
	if err := ss.sendClient(0, gp); err != nil {
		return err
	}
	if err := ss.cwr.Flush(); err != nil {
		return err
	}

	// The client's answer may take its time (or never come): meanwhile
	// the session holds only its client reader.
	ss.parkBuffers()
	rp, cseq, resp, err := ss.clientHello(deadline)
	ss.acquire()
	if err != nil {
		return err
	}
	if cfg.RequireTLS && !ss.clientTLS {
		_ = ss.sendError(cseq+1, &Error{Code: errCodeSecureTransport, State: "HY000",
			Message: "rgproxy: connections using insecure transport are prohibited; connect with TLS"})
		return fmt.Errorf("%w: client did not use TLS", ErrAuthRefused)
	}
	ss.info.User = resp.User
	ss.setLoginCharset(uint16(resp.Collation))
	plugin := resp.Plugin
	if plugin == "" {
		plugin = g.Plugin
	}
	if clearTextPlugin(resp.Plugin) && !ss.bothTLS() {
		return ss.refuseClearText(cseq+1, resp.Plugin)
	}
	ss.caps = resp.Caps & supportedCaps & backendCaps
	ss.maria = resp.MariaCaps & supportedMariaCaps & backendMaria
	ss.rflags = respFlagsFor(ss.caps, ss.maria)

	// The backend leg: SSLRequest and TLS first when configured.
	bseq := byte(1)
	if cfg.BackendTLS != nil {
		if backendCaps&mysql.CLIENT_SSL == 0 {
			_ = ss.sendError(cseq+1, &Error{Code: errCodeBackendUnreachable, State: "HY000",
				Message: fmt.Sprintf("rgproxy: cannot connect to backend %s with TLS: it does not support TLS", cfg.BackendAddr)})
			return fmt.Errorf("%w: backend does not support TLS", ErrAuthRefused)
		}
		sslReq := make([]byte, sslRequestLen)
		copy(sslReq, rp[:sslRequestLen])
		rewriteHandshakeResponse(sslReq, ss.caps|mysql.CLIENT_SSL, ss.maria)
		if _, err := writeMessage(ss.bwr, bseq, sslReq); err != nil {
			return ss.backendFailed(cseq+1, err)
		}
		if err := ss.bwr.Flush(); err != nil {
			return ss.backendFailed(cseq+1, err)
		}
		// The backend says nothing before the TLS handshake: TLS reads
		// the connection itself, and the session's reader, reset, reads
		// TLS. (Should it hold bytes, TLS reads through it and the
		// session takes another.)
		var under net.Conn = ss.rawBackend
		if ss.brd.Buffered() > 0 {
			under = &bufferedConn{ss.rawBackend, ss.brd}
			ss.bufs.br = bufio.NewReaderSize(nil, cfg.WriteBufferSize)
		}
		tc := tls.Client(under, cfg.BackendTLS)
		ctx, cancel := context.WithDeadline(ss.ctx, earliest(time.Now().Add(cfg.DialTimeout), deadline))
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			return ss.backendFailed(cseq+1, fmt.Errorf("backend TLS handshake: %w", err))
		}
		ss.setBackend(tc)
		ss.backendTLS = true
		bseq++
	}
	legCaps := ss.caps
	if ss.backendTLS {
		legCaps |= mysql.CLIENT_SSL
	}
	rewriteHandshakeResponse(rp, legCaps, ss.maria)
	if _, err := writeMessage(ss.bwr, bseq, rp); err != nil {
		return ss.backendFailed(cseq+1, err)
	}
	if err := ss.bwr.Flush(); err != nil {
		return ss.backendFailed(cseq+1, err)
	}
	ss.rw.caps, ss.rw.maria = ss.caps, ss.maria
	ok, err := ss.relayAuth(plugin, cseq-bseq)
	if err != nil {
		return err
	}
	if !ok {
		return errQuit // the backend's ERR (e.g. 1045) went to the client unchanged
	}
	_ = ss.rawBackend.SetDeadline(time.Time{})
	if ss.leaveIdle() {
		// The backend closed after the OK the client now holds: to the
		// client this is an idle session's backend gone.
		return ss.backendGone()
	}
	ss.log = ss.log.With("user", ss.info.User, "backend_conn", ss.info.BackendConnID)
	ss.log.Debug("session logged in")
	ss.lastBackend = ss.srv.now()
	return nil
}

// earliest returns the earlier of two times.
func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// errBackendRefused: the backend answered the connection with an ERR
// packet in place of its greeting, which went to the client as is.
var errBackendRefused = errors.New("mysqlproto: backend refused the connection")

// dialBackend connects to the backend, registers it with the backend poller and reads its
// greeting. Every error but errBackendRefused means the backend cannot be
// reached.
func (ss *session) dialBackend(deadline time.Time) ([]byte, greeting, error) {
	cfg := &ss.srv.cfg
	var g greeting
	dl := earliest(time.Now().Add(cfg.DialTimeout), deadline)
	ctx, cancel := context.WithDeadline(ss.ctx, dl)
	var d net.Dialer
	bc, err := d.DialContext(ctx, "tcp", cfg.BackendAddr)
	cancel()
	failpoint.Inject("backendDialError", func() {
		if err == nil {
			bc.Close()
			err = errFailpoint
		}
	})
	if err != nil {
		return nil, g, err
	}
	ss.mu.Lock()
	ss.rawBackend = &countingConn{Conn: bc, raw: newRawSock(bc), n: &ss.srv.backendBytes}
	ss.mu.Unlock()
	ss.setBackend(ss.rawBackend)
	ss.enterIdle()
	ss.srv.bpoll.Load().add(ss)
	_ = bc.SetDeadline(dl)
	if cfg.BackendProxyProtocol {
		if _, err := ss.bwr.WriteString(proxyHeader(ss.info.ClientAddr, ss.rawClient.LocalAddr())); err != nil {
			return nil, g, err
		}
	}
	if err := ss.bwr.Flush(); err != nil {
		return nil, g, err
	}
	gp, _, err := readMessage(ss.brd, nil, authLimit)
	if err != nil {
		return nil, g, fmt.Errorf("reading greeting: %w", err)
	}
	// The greeting came: the rest of the login has its own deadline.
	_ = bc.SetDeadline(deadline)
	if len(gp) > 0 && gp[0] == mysql.ERR_HEADER { // e.g. the backend's own 1040 or a blocked host
		_ = ss.sendClient(0, gp)
		_ = ss.cwr.Flush()
		return nil, g, fmt.Errorf("%w: %w", errBackendRefused, parseErrPacket(gp))
	}
	if g, err = parseGreeting(gp); err != nil {
		return nil, g, err
	}
	return gp, g, nil
}

// backendUnreachable answers a client whose backend cannot be reached.
// The error follows a greeting of rgproxy's own and the client's answer
// (and its TLS upgrade), because an ERR in place of the greeting is shown
// by TLS-first clients (libmariadb 3.4, the mariadb CLI) as "ERROR 2002:
// ... the authenticity of the following error cannot be verified".
func (ss *session) backendUnreachable(cause error, deadline time.Time) error {
	cfg := &ss.srv.cfg
	// The backend is out of the picture: its close must no longer wake
	// the client's reads (a backend that accepted, then closed, would
	// otherwise cut the client off before it hears why).
	ss.leaveIdle()
	ss.srv.bpoll.Load().remove(ss.info.ID)
	_ = ss.rawClient.SetDeadline(deadline)
	ss.srv.backendErrors.Add(1)
	err := fmt.Errorf("%w: cannot connect to %s: %w", ErrBackendLost, cfg.BackendAddr, cause)
	caps := supportedCaps
	if cfg.ClientTLS != nil {
		caps |= mysql.CLIENT_SSL
	}
	if ss.sendClient(0, appendGreeting(ss.buf[:0], uint32(ss.info.ID), caps)) != nil || ss.cwr.Flush() != nil {
		return err
	}
	ss.parkBuffers()
	_, cseq, _, herr := ss.clientHello(deadline)
	ss.acquire()
	if herr != nil {
		return err
	}
	_ = ss.sendError(cseq+1, &Error{Code: errCodeBackendUnreachable, State: "HY000",
		Message: fmt.Sprintf("rgproxy: cannot connect to backend %s: %v", cfg.BackendAddr, cause)})
	return err
}

// clientHello reads the client's handshake response, upgrading the
// connection to TLS first when the client asks with an SSLRequest. The
// response is in ss.buf. A response rgproxy cannot read is a clientError
// (1043 Bad handshake, 1156 for a sequence id other than 1, or 2 after an
// SSLRequest), as from MariaDB.
func (ss *session) clientHello(deadline time.Time) (rp []byte, cseq byte, resp handshakeResponse, err error) {
	cfg := &ss.srv.cfg
	if rp, cseq, err = ss.readClient(1, authLimit, ProtoBadHandshake); err != nil {
		return rp, cseq, resp, fmt.Errorf("reading handshake response: %w", err)
	}
	if resp, err = parseHandshakeResponse(rp); err != nil {
		return rp, cseq, resp, newClientError(ProtoBadHandshake, cseq+1, err)
	}
	if resp.Caps&mysql.CLIENT_SSL != 0 {
		if cfg.ClientTLS == nil || len(rp) != sslRequestLen {
			return rp, cseq, resp, newClientError(ProtoBadHandshake, cseq+1, fmt.Errorf("%w: unexpected SSL request", ErrMalformedPacket))
		}
		// The ClientHello may already sit in crd: TLS then reads through it.
		var under net.Conn = ss.rawClient
		if ss.crd.Buffered() > 0 {
			under = &bufferedConn{ss.rawClient, ss.crd}
		}
		tc := tls.Server(under, cfg.ClientTLS)
		ctx, cancel := context.WithDeadline(ss.ctx, earliest(time.Now().Add(cfg.DialTimeout), deadline))
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			return rp, cseq, resp, fmt.Errorf("%w: %w", errClientTLS, err)
		}
		ss.setClient(tc)
		ss.clientTLS = true
		if rp, cseq, err = ss.readClient(cseq+1, authLimit, ProtoBadHandshake); err != nil {
			return rp, cseq, resp, fmt.Errorf("reading handshake response: %w", err)
		}
		if resp, err = parseHandshakeResponse(rp); err != nil {
			return rp, cseq, resp, newClientError(ProtoBadHandshake, cseq+1, err)
		}
	}
	if len(rp) == sslRequestLen {
		return rp, cseq, resp, newClientError(ProtoBadHandshake, cseq+1, fmt.Errorf("%w: second SSL request", ErrMalformedPacket))
	}
	return rp, cseq, resp, nil
}

// readClient reads one logical payload from the client into ss.buf,
// growing it as the bytes arrive (charged to Config.CommandBufferLimit):
// its first packet must carry sequence id seq, each continuation the next
// one, and the whole must not exceed limit. It returns the payload and the
// last packet's sequence id. A packet out of order, too large, or that the
// budget cannot hold is a clientError; malformed is the kind the caller
// gives a payload it cannot parse.
func (ss *session) readClient(seq byte, limit int64, malformed ProtocolErrorKind) ([]byte, byte, error) {
	buf := ss.buf[:0]
	for {
		n, s, err := readHeader(ss.crd)
		if err != nil {
			return buf, seq, err
		}
		if s != seq {
			return buf, seq, errOutOfOrder("packet", s, seq)
		}
		if int64(len(buf)+n) > limit {
			return buf, seq, newClientError(ProtoTooLarge, seq+1, fmt.Errorf("%w: more than %d bytes", ErrPacketTooLarge, limit))
		}
		buf, err = readPayload(ss.crd, buf, n, &ss.acct)
		ss.buf = buf
		if err != nil {
			return buf, seq, asClientError(err, seq+1, malformed)
		}
		if n < mysql.MaxPayloadLen {
			return buf, seq, nil
		}
		seq++
	}
}

func (ss *session) bothTLS() bool { return ss.clientTLS && ss.backendTLS }

func (ss *session) refuseClearText(seq byte, plugin string) error {
	_ = ss.sendError(seq, &Error{Code: mysql.ER_NOT_SUPPORTED_AUTH_MODE, State: "08004", Message: fmt.Sprintf(
		"rgproxy: the '%s' plugin sends the password in clear text; it needs TLS between client and proxy and between proxy and backend", plugin)})
	return fmt.Errorf("%w: clear-text plugin %s without TLS on both legs", ErrAuthRefused, plugin)
}

// relayAuth relays auth-switch and auth-more-data packets both ways until
// the backend's OK or ERR, which reaches the client too. delta is the
// client's sequence id minus the backend's for the same packet. ok is
// false when the backend refused the login.
func (ss *session) relayAuth(plugin string, delta byte) (ok bool, err error) {
	for {
		p, bseq, err := readMessage(ss.brd, ss.buf, authLimit)
		ss.buf = p
		if err != nil {
			return false, ss.backendFailed(bseq+delta+1, err)
		}
		if len(p) == 0 {
			return false, ss.backendFailed(bseq+delta, fmt.Errorf("%w: empty auth packet", ErrMalformedPacket))
		}
		switch p[0] {
		case mysql.OK_HEADER:
			var m respMachine
			if err := m.parseOK(p); err == nil {
				ss.status = m.Status
			}
			// Logged in: the pre-login place is free before the client
			// learns it, so that its next connection finds it free.
			ss.leavePreAuth()
			if err := ss.sendClient(bseq+delta, p); err != nil {
				return false, err
			}
			return true, ss.cwr.Flush()
		case mysql.ERR_HEADER:
			if err := ss.sendClient(bseq+delta, p); err != nil {
				return false, err
			}
			return false, ss.cwr.Flush()
		}
		newPlugin, clearPwd := needsClearPassword(p, plugin)
		if clearPwd && !ss.bothTLS() {
			return false, ss.refuseClearText(bseq+delta, newPlugin)
		}
		plugin = newPlugin
		if err := ss.sendClient(bseq+delta, p); err != nil {
			return false, err
		}
		if err := ss.cwr.Flush(); err != nil {
			return false, err
		}
		if len(p) == 2 && p[0] == mysql.MORE_DATE_HEADER && p[1] == mysql.CACHE_SHA2_FAST_AUTH {
			continue // caching_sha2 fast auth succeeded: the OK follows
		}
		ss.parkBuffers()
		cp, cseq, err := ss.readClient(bseq+delta+1, authLimit, ProtoBadHandshake)
		ss.acquire()
		if err != nil {
			return false, fmt.Errorf("reading client auth data: %w", err)
		}
		if _, err := writeMessage(ss.bwr, cseq-delta, cp); err != nil {
			return false, ss.backendFailed(cseq, err)
		}
		if err := ss.bwr.Flush(); err != nil {
			return false, ss.backendFailed(cseq, err)
		}
	}
}

// backendFailed reports a backend I/O failure to the client (as ERR 1927
// with sequence id seq) and returns the error that ends the session.
// SQLSTATE 08S01, "communication link failure", makes connection pools
// (Connector/J, HikariCP, ...) discard the connection.
func (ss *session) backendFailed(seq byte, cause error) error {
	ss.srv.backendErrors.Add(1)
	_ = ss.sendError(seq, &Error{Code: errCodeBackendLost, State: "08S01",
		Message: fmt.Sprintf("Lost connection to backend MySQL server during query (rgproxy: %v)", cause)})
	return fmt.Errorf("%w: %w", ErrBackendLost, cause)
}

// bufferedConn reads through a bufio.Reader that may already hold bytes
// of the connection, and writes straight to it.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// proxyHeader renders a PROXY protocol v1 header.
func proxyHeader(src, dst net.Addr) string {
	s, ok1 := src.(*net.TCPAddr)
	d, ok2 := dst.(*net.TCPAddr)
	if !ok1 || !ok2 || (s.IP.To4() == nil) != (d.IP.To4() == nil) {
		return "PROXY UNKNOWN\r\n"
	}
	fam := "TCP6"
	sip, dip := s.IP.String(), d.IP.String()
	if s.IP.To4() != nil {
		fam = "TCP4"
		sip, dip = s.IP.To4().String(), d.IP.To4().String()
	}
	return fmt.Sprintf("PROXY %s %s %s %d %d\r\n", fam, sip, dip, s.Port, d.Port)
}
