package mysqlproto

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/pingcap/failpoint"
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
	// gets ERR 1040 "Too many connections". 0 means unlimited (the default).
	// Server.SetMaxConnections changes it while serving.
	MaxConnections int
	// MaxPacketPayload is the largest client command payload accepted, in
	// bytes, multi-packet continuations included; a larger one closes the
	// connection with a warning logged. Default 1 GiB.
	MaxPacketPayload int64
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
}

// Server accepts MySQL clients and relays each to its own backend
// connection. Its methods are safe for concurrent use.
type Server struct {
	cfg Config
	log *slog.Logger
	// now is the clock behind BackendTime; tests replace it.
	now func() time.Time
	// words indexes Config.ScanWords; nil when there are none.
	words *wordSet
	// passThrough is true when the policy never blocks, so that sessions
	// need not watch for a client leaving during Before.
	passThrough bool
	// watchDelay: see defaultWatchDelay; tests shorten it.
	watchDelay time.Duration
	// bwatch tells idle sessions that their backend closed (bwatch_linux.go);
	// nil before the first Serve and where it is not supported.
	bwatch atomic.Pointer[backendWatch]
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

	mu      sync.Mutex
	closing bool
	// watchdogOn: the client-watch sampler (watch.go) runs.
	watchdogOn bool
	// bwatchTried: Serve has started the backend watch (or failed to).
	bwatchTried bool
	listeners   map[net.Listener]struct{}
	sessions    map[*session]struct{}
	wg          sync.WaitGroup
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
	if cfg.MaxConnections < 0 {
		return nil, fmt.Errorf("mysqlproto: MaxConnections %d is negative", cfg.MaxConnections)
	}
	if cfg.MaxPacketPayload <= 0 {
		cfg.MaxPacketPayload = 1 << 30
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
		cfg:        cfg,
		log:        cfg.Logger,
		now:        time.Now,
		watchDelay: defaultWatchDelay,
		listeners:  make(map[net.Listener]struct{}),
		sessions:   make(map[*session]struct{}),
	}
	s.maxConns.Store(int64(cfg.MaxConnections))
	if cfg.ClientTLS != nil {
		s.cfg.ClientTLS = s.reloadableTLS(cfg.ClientTLS)
	}
	s.passThrough = passesThrough(cfg.Policy)
	var err error
	if s.words, err = newWordSet(cfg.ScanWords); err != nil {
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
	if !s.passThrough && !s.watchdogOn && s.watchDelay > 0 {
		s.watchdogOn = true
		go s.watchdog(s.hardCtx)
	}
	if !s.bwatchTried {
		s.bwatchTried = true
		s.startBackendWatch()
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		_ = ln.Close()
	}()
	var backoff time.Duration
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
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) {
				// Running out of descriptors is transient: wait a little.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("accept failed; retrying", "err", err, "backoff", backoff)
				t := time.NewTimer(backoff)
				select {
				case <-t.C:
				case <-s.hardCtx.Done():
					t.Stop()
				}
				continue
			}
			return fmt.Errorf("mysqlproto: accept: %w", err)
		}
		backoff = 0
		s.accepted.Add(1)
		if limit := s.maxConns.Load(); limit > 0 && s.conns.Load() >= limit {
			go s.refuse(c, limit)
			continue
		}
		s.conns.Add(1)
		s.wg.Add(1)
		go s.serveConn(c)
	}
}

// startBackendWatch starts the watch of idle backend connections, which
// stops once Shutdown is over.
func (s *Server) startBackendWatch() {
	w, err := newBackendWatch(s.log)
	if err != nil {
		s.log.Debug("backend connections are not watched: a close by the backend is seen at the next statement", "err", err)
		return
	}
	s.bwatch.Store(w)
	go w.run()
	go func() {
		<-s.hardCtx.Done()
		w.close()
	}()
}

// refuse answers a connection beyond MaxConnections with ERR 1040 in place
// of the greeting, as a MySQL server does.
func (s *Server) refuse(c net.Conn, limit int64) {
	defer c.Close()
	_ = c.SetWriteDeadline(time.Now().Add(s.cfg.DialTimeout))
	bw := bufio.NewWriterSize(c, 256)
	_, _ = writeMessage(bw, 0, appendErr(nil, &Error{Code: mysql.ER_CON_COUNT_ERROR, State: "08004", Message: "Too many connections"}))
	_ = bw.Flush()
	s.log.Warn("connection refused: too many connections", "client", c.RemoteAddr(), "max", limit)
}

func (s *Server) serveConn(c net.Conn) {
	defer s.wg.Done()
	defer s.conns.Add(-1)
	ss := newSession(s, c)
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
	select {
	case <-done:
		s.hardCancel()
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
	return ctx.Err()
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	return Stats{
		Connections:   s.conns.Load(),
		Sessions:      s.accepted.Load(),
		ClientBytes:   s.clientBytes.Load(),
		BackendBytes:  s.backendBytes.Load(),
		BackendErrors: s.backendErrors.Load(),
	}
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
}

func (c *countingConn) Read(b []byte) (n int, err error) {
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
