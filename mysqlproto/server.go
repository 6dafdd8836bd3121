package mysqlproto

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/pingcap/failpoint"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/sqlscan"
)

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("mysqlproto: server closed")

// Config configures a Server. The zero value of every field is replaced by
// its default in NewServer.
type Config struct {
	// BackendAddr is the host:port of the MySQL/MariaDB server.
	// Default "127.0.0.1:3306".
	BackendAddr string
	// DialTimeout bounds the backend dial, the backend's greeting and each
	// TLS handshake. Default 5s.
	DialTimeout time.Duration
	// HandshakeTimeout bounds a client's whole login, from its connection
	// to the backend's OK: a client that stalls is closed, and so is its
	// backend connection. Default 10s (MariaDB's connect_timeout).
	HandshakeTimeout time.Duration
	// BackendTLS, when non-nil, makes rgproxy speak TLS to the backend
	// (--backend-tls=skip-verify|verify). nil: plaintext (--backend-tls=off).
	BackendTLS *tls.Config
	// ClientTLS, when non-nil, lets clients upgrade to TLS (CLIENT_SSL is
	// advertised). nil: CLIENT_SSL is not advertised.
	// Server.SetClientCertificate replaces its certificate while serving.
	ClientTLS *tls.Config
	// RequireTLS refuses clients that do not upgrade to TLS (ERR 3159).
	// Default false.
	RequireTLS bool
	// BackendProxyProtocol sends a PROXY protocol v1 header with the
	// client's address before anything else on the backend connection.
	// Default false.
	BackendProxyProtocol bool
	// MaxConnections is the most client sessions served at once; one more
	// gets ERR 1040 "Too many connections" at once. 0 (the default) means
	// DefaultMaxConnections of the process's file-descriptor limit
	// (unlimited where no limit is known). Server.SetMaxConnections
	// changes it while serving.
	MaxConnections int
	// MaxUnauthenticated is the most connections that have not logged in
	// yet (each holds a backend connection that the backend counts against
	// its max_connections); one more gets ERR 1040 at once, without a
	// backend connection. Default 64.
	MaxUnauthenticated int
	// MaxUnauthenticatedPerHost is the same bound per client address (an
	// IPv4 address, an IPv6 /64), loopback included. Default 16.
	MaxUnauthenticatedPerHost int
	// MaxPacketPayload is the largest client command payload accepted, in
	// bytes, multi-packet continuations included; a larger one gets ERR
	// 1153 and the connection closes. Default 1 GiB.
	MaxPacketPayload int64
	// CommandBufferLimit bounds the bytes held at once, over all sessions,
	// in the buffers of client commands being received or run, beyond each
	// session's first 16 KiB (a command buffer grows as its bytes arrive);
	// a command that would go beyond gets ERR 1041 and its connection
	// closes. Default the larger of 1 GiB and MaxPacketPayload.
	CommandBufferLimit int64
	// NetReadTimeout bounds each wait for the rest of a command the
	// client has started to send (MariaDB's net_read_timeout): after that
	// long without a byte the client gets ERR 1159 and is closed. Default
	// 30s.
	NetReadTimeout time.Duration
	// WriteBufferSize is the size in bytes of each session's buffered
	// writer towards the client (and of its reader from the backend).
	// Default 64 KiB.
	WriteBufferSize int
	// Policy decides about each statement. Default PassThrough{}.
	Policy Policy
	// ScanWords are words (at most 64, ASCII, any case) the policy wants
	// to know about: bit i of Statement.Scan.Mentions says that word i
	// appears in the statement's text as an identifier or keyword. Empty
	// by default.
	ScanWords []string
	// Logger receives the server's logs. Default slog.Default().
	Logger *slog.Logger
	// Clock paces the rate-limited logs. Default the wall clock.
	Clock clock.Clock
}

// Stats is a snapshot of a Server's counters.
type Stats struct {
	// Connections is the number of client sessions open now.
	Connections int64
	// Sessions is the number of client connections accepted so far
	// (including those refused with 1040).
	Sessions uint64
	// ClientBytes counts bytes read from and written to clients, on the
	// wire (packet headers and TLS records included).
	ClientBytes uint64
	// BackendBytes counts bytes read from and written to backends, on the
	// wire.
	BackendBytes uint64
	// BackendErrors counts backend dial failures and backend connections
	// lost in the middle of a session.
	BackendErrors uint64
	// Unauthenticated is the number of connections not logged in yet.
	Unauthenticated int64
	// Refused counts the connections answered ERR 1040 at once, by reason.
	Refused [NumRefusalReasons]uint64
	// ProtocolErrors counts the client packets refused, by kind.
	ProtocolErrors [NumProtocolErrorKinds]uint64
	// CommandBufferBytes is what command buffers hold now beyond each
	// session's first 16 KiB (bounded by Config.CommandBufferLimit).
	CommandBufferBytes int64
}

// Server accepts MySQL clients and relays each to its own backend
// connection. Its methods are safe for concurrent use.
type Server struct {
	cfg Config
	log *slog.Logger
	// now is the clock behind BackendTime; tests replace it.
	now func() time.Time
	// words indexes Config.ScanWords; nil when there are none.
	words *sqlscan.Words
	// passThrough is true when the policy never blocks, so that sessions
	// need not check for a client leaving during Before.
	passThrough bool
	// hangupDelay: see defaultHangupDelay; tests shorten it.
	hangupDelay time.Duration
	// bpoll tells idle sessions that their backend closed (backendpoll_linux.go);
	// nil before the first Serve and where it is not supported.
	bpoll atomic.Pointer[backendPoller]
	// maxConns is Config.MaxConnections in force (reload.go).
	maxConns atomic.Int64
	// clientCert, when set, replaces ClientTLS's certificate (reload.go).
	clientCert atomic.Pointer[tls.Certificate]
	// certGen counts SetClientCertificate calls; session tickets carry it.
	certGen atomic.Uint64

	nextID        atomic.Uint64
	conns         atomic.Int64
	accepted      atomic.Uint64
	clientBytes   atomic.Uint64
	backendBytes  atomic.Uint64
	backendErrors atomic.Uint64
	refused       [NumRefusalReasons]atomic.Uint64
	protoErrors   [NumProtocolErrorKinds]atomic.Uint64

	// gate bounds the connections that have not logged in.
	gate preAuthGate
	// budget bounds the bytes of command buffers (Config.CommandBufferLimit).
	budget memBudget
	// pools lends sessions their writers and backend reader while they work.
	pools *bufPool
	// The rate-limited logs: refused connections, accept failures,
	// protocol errors, failed logins.
	refuseLog, acceptLog, protoLog, loginLog *logLimiter

	mu      sync.Mutex
	closing bool
	// hangupSamplerOn: the hangup sampler (hangup.go) runs.
	hangupSamplerOn bool
	// bpollTried: Serve has started the backend poller (or failed to).
	bpollTried bool
	listeners  map[net.Listener]struct{}
	sessions   map[*session]struct{}
	wg         sync.WaitGroup
	// bg holds the hang-up sampler and the backend poller, which end with
	// hardCtx; Shutdown waits for them.
	bg sync.WaitGroup
	// hardCtx ends when Shutdown gives up waiting: every session's context
	// derives from it.
	hardCtx    context.Context
	hardCancel context.CancelFunc
}

// NewServer checks cfg, fills in defaults and returns a Server.
func NewServer(cfg Config) (*Server, error) {
	if cfg.BackendAddr == "" {
		cfg.BackendAddr = "127.0.0.1:3306"
	}
	if _, _, err := net.SplitHostPort(cfg.BackendAddr); err != nil {
		return nil, fmt.Errorf("mysqlproto: backend address %q: %w", cfg.BackendAddr, err)
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.RequireTLS && cfg.ClientTLS == nil {
		return nil, errors.New("mysqlproto: RequireTLS needs ClientTLS (a certificate and key)")
	}
	if cfg.MaxConnections < 0 || cfg.MaxUnauthenticated < 0 || cfg.MaxUnauthenticatedPerHost < 0 {
		return nil, fmt.Errorf("mysqlproto: MaxConnections %d, MaxUnauthenticated %d, MaxUnauthenticatedPerHost %d: negative",
			cfg.MaxConnections, cfg.MaxUnauthenticated, cfg.MaxUnauthenticatedPerHost)
	}
	if cfg.MaxUnauthenticated == 0 {
		cfg.MaxUnauthenticated = 64
	}
	if cfg.MaxUnauthenticatedPerHost == 0 {
		cfg.MaxUnauthenticatedPerHost = 16
	}
	if cfg.MaxPacketPayload <= 0 {
		cfg.MaxPacketPayload = 1 << 30
	}
	if cfg.CommandBufferLimit <= 0 {
		cfg.CommandBufferLimit = max(1<<30, cfg.MaxPacketPayload)
	}
	if cfg.NetReadTimeout <= 0 {
		cfg.NetReadTimeout = 30 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.WriteBufferSize <= 0 {
		cfg.WriteBufferSize = 64 << 10
	}
	if cfg.WriteBufferSize < 4096 {
		cfg.WriteBufferSize = 4096
	}
	if cfg.Policy == nil {
		cfg.Policy = PassThrough{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.BackendTLS != nil && cfg.BackendTLS.ServerName == "" && !cfg.BackendTLS.InsecureSkipVerify {
		host, _, _ := net.SplitHostPort(cfg.BackendAddr)
		cfg.BackendTLS = cfg.BackendTLS.Clone()
		cfg.BackendTLS.ServerName = host
	}
	s := &Server{
		cfg:         cfg,
		log:         cfg.Logger,
		now:         time.Now,
		hangupDelay: defaultHangupDelay,
		listeners:   make(map[net.Listener]struct{}),
		sessions:    make(map[*session]struct{}),
	}
	s.maxConns.Store(int64(effectiveMaxConnections(cfg.MaxConnections)))
	s.gate.byHost = make(map[netip.Prefix]int)
	s.budget.limit = cfg.CommandBufferLimit
	s.pools = newBufPool(cfg.WriteBufferSize)
	clk := cfg.Clock
	s.refuseLog = newLogLimiter(s.log, clk, slog.LevelWarn, "connection refused with 1040", "connections refused with 1040", "reason")
	s.acceptLog = newLogLimiter(s.log, clk, slog.LevelWarn, "accept failed; retrying", "accept failures", "error")
	s.protoLog = newLogLimiter(s.log, clk, slog.LevelWarn, "client protocol error", "client protocol errors", "kind")
	s.loginLog = newLogLimiter(s.log, clk, slog.LevelWarn, "login failed", "logins failed", "cause")
	if cfg.ClientTLS != nil {
		s.cfg.ClientTLS = s.reloadableTLS(cfg.ClientTLS)
	}
	s.passThrough = passesThrough(cfg.Policy)
	var err error
	if s.words, err = sqlscan.NewWords(cfg.ScanWords); err != nil {
		return nil, err
	}
	s.hardCtx, s.hardCancel = context.WithCancel(context.Background())
	return s, nil
}

// Serve accepts connections on ln until Shutdown, and then returns
// ErrServerClosed. It closes ln on return.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	if !s.passThrough && !s.hangupSamplerOn && s.hangupDelay > 0 {
		s.hangupSamplerOn = true
		s.bg.Go(func() { s.hangupSampler(s.hardCtx) })
	}
	if !s.bpollTried {
		s.bpollTried = true
		s.startBackendPoller()
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		_ = ln.Close()
	}()
	var backoff time.Duration
	spare := openSpare()
	defer func() { closeSpare(spare) }()
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			var ne net.Error
			fdsGone := errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
			if fdsGone && spare != nil {
				// Out of descriptors: give the spare one up for the client
				// waiting in the backlog, so that it gets its 1040 rather
				// than a hang, then take it back.
				closeSpare(spare)
				if c, err = ln.Accept(); err == nil {
					s.refuse(c, RefusedDescriptors, 0)
				}
				spare = openSpare()
				if err == nil {
					continue
				}
			}
			if errors.As(err, &ne) && ne.Timeout() || fdsGone || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM) {
				// Transient: wait a little, then try again.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.acceptLog.event(acceptErrorKey(err), "err", err, "backoff", backoff)
				t := time.NewTimer(backoff)
				select {
				case <-t.C:
				case <-s.hardCtx.Done():
					t.Stop()
				}
				continue
			}
			s.mu.Lock()
			closing = s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			return fmt.Errorf("mysqlproto: accept: %w", err)
		}
		backoff = 0
		s.accepted.Add(1)
		if limit := s.maxConns.Load(); limit > 0 && s.conns.Load() >= limit {
			s.wg.Go(func() { s.refuse(c, RefusedMaxConnections, int(limit)) })
			continue
		}
		host := hostKey(c.RemoteAddr())
		if reason, ok := s.gate.enter(host, s.cfg.MaxUnauthenticated, s.cfg.MaxUnauthenticatedPerHost); !ok {
			limit := s.cfg.MaxUnauthenticated
			if reason == RefusedUnauthenticatedPerHost {
				limit = s.cfg.MaxUnauthenticatedPerHost
			}
			s.wg.Go(func() { s.refuse(c, reason, limit) })
			continue
		}
		s.conns.Add(1)
		s.wg.Add(1)
		go s.serveConn(c, host)
	}
}

// acceptErrorKey names an accept error in the rate-limited log's counts.
func acceptErrorKey(err error) string {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return "timeout"
}

// startBackendPoller starts the poller of idle backend connections, which
// stops once Shutdown is over.
func (s *Server) startBackendPoller() {
	w, err := newBackendPoller(s.log)
	if err != nil {
		s.log.Debug("backend connections are not polled: a close by the backend is seen at the next statement", "err", err)
		return
	}
	s.bpoll.Store(w)
	s.bg.Go(w.run)
	s.bg.Go(func() {
		<-s.hardCtx.Done()
		w.close()
	})
}

// tooManyConnections is the ERR packet, header included, that a refused
// connection gets in place of the greeting, as from a MySQL server at its
// max_connections.
var tooManyConnections = func() []byte {
	p := appendErr(nil, &Error{Code: mysql.ER_CON_COUNT_ERROR, State: "08004", Message: "Too many connections"})
	return append([]byte{byte(len(p)), byte(len(p) >> 8), byte(len(p) >> 16), 0}, p...)
}()

// refuse answers a connection with ERR 1040 at once, without dialing the
// backend, and closes it. The log says so at most once a second.
func (s *Server) refuse(c net.Conn, reason RefusalReason, limit int) {
	s.refused[reason].Add(1)
	// A new socket's send buffer is empty: the write does not wait for the
	// client, and the deadline is there only to be sure.
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(tooManyConnections)
	_ = c.Close()
	s.refuseLog.event(reason.String(), "client", c.RemoteAddr().String(), "limit", limit)
}

func (s *Server) serveConn(c net.Conn, host netip.Prefix) {
	defer s.wg.Done()
	defer s.conns.Add(-1)
	ss := newSession(s, c)
	ss.preAuth, ss.host = true, host
	defer ss.leavePreAuth()
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = c.Close()
		return
	}
	s.sessions[ss] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.sessions, ss)
		s.mu.Unlock()
	}()
	defer ss.close()
	defer func() {
		if r := recover(); r != nil {
			ss.log.Error("session panicked; closing it", "panic", r, "stack", string(debug.Stack()))
		}
	}()
	ss.run()
}

// Shutdown stops accepting, closes idle sessions at once and lets busy
// ones finish their current response. When ctx ends first it closes
// everything that is left and returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for ln := range s.listeners {
		_ = ln.Close()
	}
	for ss := range s.sessions {
		ss.shutdown()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	defer s.stopLogs()
	select {
	case <-done:
		s.hardCancel()
		s.bg.Wait()
		return nil
	case <-ctx.Done():
	}
	s.hardCancel()
	s.mu.Lock()
	for ss := range s.sessions {
		ss.forceClose()
	}
	s.mu.Unlock()
	<-done
	s.bg.Wait()
	return ctx.Err()
}

// stopLogs writes the rate-limited logs' pending summaries.
func (s *Server) stopLogs() {
	for _, l := range []*logLimiter{s.refuseLog, s.acceptLog, s.protoLog, s.loginLog} {
		l.stop()
	}
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	st := Stats{
		Connections:        s.conns.Load(),
		Sessions:           s.accepted.Load(),
		ClientBytes:        s.clientBytes.Load(),
		BackendBytes:       s.backendBytes.Load(),
		BackendErrors:      s.backendErrors.Load(),
		Unauthenticated:    int64(s.gate.count()),
		CommandBufferBytes: s.budget.used.Load(),
	}
	for i := range st.Refused {
		st.Refused[i] = s.refused[i].Load()
	}
	for i := range st.ProtocolErrors {
		st.ProtocolErrors[i] = s.protoErrors[i].Load()
	}
	return st
}

// ProbeBackend dials the backend and reads its greeting, to tell whether
// it is reachable (for /readyz). It neither authenticates nor starts TLS.
func ProbeBackend(ctx context.Context, cfg Config) error {
	if cfg.BackendAddr == "" {
		cfg.BackendAddr = "127.0.0.1:3306"
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", cfg.BackendAddr)
	if err != nil {
		return fmt.Errorf("mysqlproto: probe %s: %w", cfg.BackendAddr, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if cfg.BackendProxyProtocol {
		if _, err := c.Write([]byte("PROXY UNKNOWN\r\n")); err != nil {
			return fmt.Errorf("mysqlproto: probe %s: %w", cfg.BackendAddr, err)
		}
	}
	p, _, err := readMessage(bufio.NewReaderSize(c, 512), nil, 1<<16)
	if err != nil {
		return fmt.Errorf("mysqlproto: probe %s: reading greeting: %w", cfg.BackendAddr, err)
	}
	if len(p) > 0 && p[0] == mysql.ERR_HEADER {
		e := parseErrPacket(p)
		return fmt.Errorf("mysqlproto: probe %s: backend refused: %w", cfg.BackendAddr, e)
	}
	if _, err := parseGreeting(p); err != nil {
		return fmt.Errorf("mysqlproto: probe %s: %w", cfg.BackendAddr, err)
	}
	return nil
}

// parseErrPacket decodes an ERR packet payload.
func parseErrPacket(p []byte) *Error {
	e := &Error{Code: 0xffff, State: "HY000"}
	if len(p) < 3 {
		e.Message = "malformed error packet"
		return e
	}
	e.Code = uint16(p[1]) | uint16(p[2])<<8
	msg := p[3:]
	if len(msg) >= 6 && msg[0] == '#' {
		e.State = string(msg[1:6])
		msg = msg[6:]
	}
	e.Message = string(msg)
	return e
}

// countingConn counts a connection's bytes into a server counter and, for
// client connections, the time spent blocked in Write.
type countingConn struct {
	net.Conn
	raw     *rawSock // nil: use Conn's Read and Write
	n       *atomic.Uint64
	now     func() time.Time
	blocked time.Duration // written only by the session goroutine
	timed   bool
	// readTimeout, when > 0, bounds each read: a read that gets no byte
	// for this long fails with os.ErrDeadlineExceeded (a session sets it
	// while it receives a command: Config.NetReadTimeout).
	// readDeadlineAt is when the deadline in force was set (zero: none).
	// Both belong to whichever goroutine reads.
	readTimeout    time.Duration
	readDeadlineAt time.Time
}

// deadlineSlack is how often an armed read deadline is pushed back: a
// read waits between readTimeout and readTimeout + deadlineSlack.
const deadlineSlack = time.Second

func (c *countingConn) Read(b []byte) (n int, err error) {
	if c.readTimeout > 0 {
		if now := time.Now(); now.Sub(c.readDeadlineAt) >= deadlineSlack {
			c.readDeadlineAt = now
			_ = c.Conn.SetReadDeadline(now.Add(c.readTimeout + deadlineSlack))
		}
	}
	if c.raw != nil {
		n, err = c.raw.Read(b)
	} else {
		n, err = c.Conn.Read(b)
	}
	c.n.Add(uint64(n))
	return n, err
}

func (c *countingConn) write(b []byte) (int, error) {
	if c.raw != nil {
		return c.raw.Write(b)
	}
	return c.Conn.Write(b)
}

func (c *countingConn) Write(b []byte) (int, error) {
	if !c.timed {
		n, err := c.write(b)
		c.n.Add(uint64(n))
		return n, err
	}
	t0 := c.now()
	failpoint.Inject("clientWriteStall", func(val failpoint.Value) {
		if ms, ok := val.(int); ok {
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
	})
	n, err := c.write(b)
	c.blocked += c.now().Sub(t0)
	c.n.Add(uint64(n))
	return n, err
}

// openSpare opens a descriptor kept in reserve for the moment the process
// runs out: Serve closes it to accept, and refuse, the client waiting in
// the backlog. nil when it cannot be opened.
func openSpare() *os.File {
	f, err := os.Open(os.DevNull)
	if err != nil {
		return nil
	}
	return f
}

func closeSpare(f *os.File) {
	if f != nil {
		_ = f.Close()
	}
}

// effectiveMaxConnections is MaxConnections in force for a configured n:
// n itself, or for 0 DefaultMaxConnections of the descriptor limit (0,
// unlimited, where none is known).
func effectiveMaxConnections(n int) int {
	if n > 0 {
		return n
	}
	if nofile, ok := nofileLimit(); ok {
		return DefaultMaxConnections(nofile)
	}
	return 0
}
