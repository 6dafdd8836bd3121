// Package binlog follows a backend's row-based binary log, as a replica
// would, and tells how many bytes each transaction wrote to tables, so
// that rgproxy can charge a statement for what the backend wrote whatever
// route the bytes took (user variables, EXECUTE IMMEDIATE, PREPARE ...
// USING, INSERT ... SELECT, stored procedures, triggers).
//
// A transaction is named, for a claim, by what the log records of its
// session: on MariaDB its GTID (a session reads its own with @@last_gtid:
// MariaDB's log records a thread id only for DDL), on MySQL the thread id
// of its BEGIN event. A Reader sums each transaction's row events as they
// stream (a transaction of any size costs a few words), keeps completed
// transactions a short while for their claim, and lets a claim wait a
// short while for its transaction: a statement's OK usually reaches the
// client before its events reach the reader.
//
// The package speaks to the backend only through go-mysql's replication
// and client packages; it knows nothing of RU or groups.
package binlog

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/rgproxy/rgproxy/internal/clock"
)

// Attribution says how a session's transactions are told apart in the log
// the reader follows now.
type Attribution uint32

const (
	// AttributeNone: the reader follows no row-based binary log now (not
	// connected yet, reconnecting, log_bin off, binlog_format not ROW,
	// the account lacks the grants).
	AttributeNone Attribution = iota
	// AttributeGTID: MariaDB; claim with the session's @@last_gtid.
	AttributeGTID
	// AttributeThread: MySQL; claim with the session's connection id.
	AttributeThread
)

func (a Attribution) String() string {
	switch a {
	case AttributeGTID:
		return "gtid"
	case AttributeThread:
		return "thread"
	}
	return "none"
}

// Errors that keep a Reader from following the log; it tries again.
var (
	// ErrNoBinlog: the backend's log_bin is off.
	ErrNoBinlog = errors.New("binlog: the backend keeps no binary log (log_bin is OFF)")
	// ErrNotRowFormat: the backend's binlog_format is not ROW.
	ErrNotRowFormat = errors.New("binlog: the backend's binlog_format is not ROW")
)

// Config configures a Reader.
type Config struct {
	// Addr is the backend's host:port. Required.
	Addr string
	// User and Password are the account the reader logs in with: it needs
	// REPLICATION SLAVE (COM_BINLOG_DUMP), and on MySQL REPLICATION CLIENT
	// to read the log's current position. Required.
	User, Password string
	// TLS, when not nil, is used to the backend.
	TLS *tls.Config
	// ServerID is the replica server id the reader registers with; it
	// must differ from every real replica's (a backend drops the older of
	// two dump connections with one id). Default: random in [2^31, 2^32).
	ServerID uint32
	// DialTimeout bounds a connection to the backend. Default 5 s.
	DialTimeout time.Duration
	// ClaimWait is how long a claim waits for its transaction's events.
	// Default 2 s.
	ClaimWait time.Duration
	// Keep is how long a completed transaction nobody claimed is kept.
	// Default 10 s.
	Keep time.Duration
	// MaxKept bounds the completed transactions kept unclaimed (the
	// oldest go first); MaxClaims the claims waiting (beyond it a claim
	// fails at once). Defaults 100,000 and 10,000.
	MaxKept, MaxClaims int
	// Logger receives the reader's logs. Default slog.Default().
	Logger *slog.Logger
	// Clock is the time source. Default the wall clock.
	Clock clock.Clock
}

// Reader follows the backend's binary log. Claims are safe for concurrent
// use and never block; Run follows the log until its context ends.
type Reader struct {
	cfg   Config
	store *store
	tally *tally
	attr  atomic.Uint32
	// lag is the age of the newest event received, in nanoseconds; 0
	// after a heartbeat (the backend had nothing newer to send).
	lag atomic.Int64
	clk clock.Clock
	log *slog.Logger

	// Owned by Run's goroutine: where to resume after a broken
	// connection, so that transactions committed meanwhile still reach
	// their claims.
	gset   mysql.GTIDSet  // MariaDB
	pos    mysql.Position // MySQL
	resume bool
	// failing: the last attempt failed; further failures log at debug.
	failing bool
}

// New returns a Reader; Run starts it.
func New(cfg Config) (*Reader, error) {
	if cfg.Addr == "" || cfg.User == "" {
		return nil, errors.New("binlog: Config.Addr and Config.User are required")
	}
	if _, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return nil, fmt.Errorf("binlog: backend address %q: %w", cfg.Addr, err)
	}
	if cfg.ServerID == 0 {
		cfg.ServerID = 1<<31 | rand.Uint32()
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.ClaimWait <= 0 {
		cfg.ClaimWait = 2 * time.Second
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 10 * time.Second
	}
	if cfg.MaxKept <= 0 {
		cfg.MaxKept = 100000
	}
	if cfg.MaxClaims <= 0 {
		cfg.MaxClaims = 10000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	return &Reader{cfg: cfg, store: newStore(cfg.ClaimWait, cfg.Keep, cfg.MaxKept, cfg.MaxClaims),
		tally: newTally(), clk: cfg.Clock, log: cfg.Logger}, nil
}

// Attribution says how claims are matched now; AttributeNone while the
// reader follows no row-based log.
func (r *Reader) Attribution() Attribution { return Attribution(r.attr.Load()) }

// Lag is the age of the newest event the reader received, by its
// timestamp (1 s resolution); 0 once the backend had nothing newer to
// send (a heartbeat) or while the reader follows nothing.
func (r *Reader) Lag() time.Duration { return time.Duration(r.lag.Load()) }

// ClaimGTID asks for the bytes the transaction with MariaDB GTID gtid
// (domain-server-sequence, as @@last_gtid shows it) wrote; done gets them
// at once or from the reader's goroutine when its events come, or
// Found = false after ClaimWait. done must not block.
func (r *Reader) ClaimGTID(gtid string, done func(Result)) {
	run(r.store.claim(gtid, r.clk.Now(), done))
}

// ClaimThread asks, on MySQL, for the bytes written by the transactions
// of connection id that completed and were not claimed yet, waiting for
// one when there is none yet; see ClaimGTID.
func (r *Reader) ClaimThread(id uint32, done func(Result)) {
	run(r.store.claim(threadKey(id), r.clk.Now(), done))
}

// Run follows the log until ctx ends, reconnecting with backoff (100 ms
// doubling to 30 s) after any failure, and checking each time that the
// backend still keeps a row-based log. It returns once the claims'
// expiry loop it starts has stopped too.
func (r *Reader) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.expireLoop(ctx) }()
	defer wg.Wait() // ctx has ended when Run returns: the loop is stopping
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := r.clk.Now()
		err := r.follow(ctx)
		r.attr.Store(uint32(AttributeNone))
		r.lag.Store(0)
		r.tally.reset()
		if ctx.Err() != nil {
			return
		}
		if r.clk.Now().Sub(start) > time.Minute {
			backoff = 100 * time.Millisecond // it followed a while: start over
		}
		level := slog.LevelWarn
		switch {
		case r.failing:
			level = slog.LevelDebug
		case errors.Is(err, ErrNoBinlog), errors.Is(err, ErrNotRowFormat):
			level = slog.LevelInfo // a backend configured so: not a failure
		}
		r.failing = true
		r.log.Log(ctx, level, "not following the backend's binary log: statements' written bytes come from the estimate",
			"backend", r.cfg.Addr, "err", err, "retry_in", backoff)
		t := r.clk.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

// expireLoop fails the claims whose wait is over and forgets stale
// transactions, ten times a second.
func (r *Reader) expireLoop(ctx context.Context) {
	for {
		t := r.clk.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		run(r.store.expire(r.clk.Now()))
	}
}

// follow checks the backend, starts a dump at the resume point (else the
// log's current end) and handles events until the stream breaks.
func (r *Reader) follow(ctx context.Context) error {
	mariadb, gset, pos, err := r.check(ctx)
	if err != nil {
		return err
	}
	host, portText, _ := net.SplitHostPort(r.cfg.Addr)
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return fmt.Errorf("binlog: port %q: %w", portText, err)
	}
	flavor := mysql.MySQLFlavor
	if mariadb {
		flavor = mysql.MariaDBFlavor
	}
	dialer := &net.Dialer{Timeout: r.cfg.DialTimeout}
	syncer := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{
		ServerID:                  r.cfg.ServerID,
		Flavor:                    flavor,
		Host:                      host,
		Port:                      uint16(port),
		User:                      r.cfg.User,
		Password:                  r.cfg.Password,
		TLSConfig:                 r.cfg.TLS,
		HeartbeatPeriod:           time.Second,
		ReadTimeout:               5 * time.Second,
		DisableRetrySync:          true,
		Dialer:                    dialer.DialContext,
		PayloadDecoderConcurrency: 1,
		RowsEventDecodeFunc:       r.tally.decodeRows,
		SynchronousEventHandler:   handler{r},
		// go-mysql logs every (re)start and failure; the reader logs what
		// matters itself.
		Logger: slog.New(slog.DiscardHandler),
	})
	defer syncer.Close()
	var st *replication.BinlogStreamer
	if mariadb {
		st, err = syncer.StartSyncGTID(gset.Clone())
	} else {
		st, err = syncer.StartSync(pos)
	}
	if err != nil {
		// MariaDB answers a dump request without the privilege with 1045,
		// "Access denied": say which privilege.
		return fmt.Errorf("binlog: starting the dump as %s (the account needs REPLICATION SLAVE): %w", r.cfg.User, err)
	}
	attr := AttributeThread
	if mariadb {
		attr = AttributeGTID
	}
	r.attr.Store(uint32(attr))
	if r.failing {
		r.log.Info("following the backend's binary log", "backend", r.cfg.Addr, "attribution", attr.String())
	}
	r.failing = false
	// Events go to handler; GetEvent returns when the stream fails.
	_, err = st.GetEvent(ctx)
	return fmt.Errorf("binlog: dump stream: %w", err)
}

// check connects once to read what the dump needs: whether the backend
// is MariaDB, keeps a binary log in ROW format, and where the log ends
// now (unless the reader resumes where it stopped).
func (r *Reader) check(ctx context.Context) (mariadb bool, gset mysql.GTIDSet, pos mysql.Position, err error) {
	dialer := &net.Dialer{Timeout: r.cfg.DialTimeout}
	dctx, cancel := context.WithTimeout(ctx, r.cfg.DialTimeout)
	defer cancel()
	c, err := client.ConnectWithDialer(dctx, "tcp", r.cfg.Addr, r.cfg.User, r.cfg.Password, "", dialer.DialContext,
		func(c *client.Conn) error {
			c.SetTLSConfig(r.cfg.TLS)
			c.ReadTimeout, c.WriteTimeout = r.cfg.DialTimeout, r.cfg.DialTimeout
			return nil
		})
	if err != nil {
		return false, nil, pos, fmt.Errorf("binlog: connecting as %s: %w", r.cfg.User, err)
	}
	defer c.Close()
	res, err := c.Execute("SELECT @@version, @@global.log_bin, @@global.binlog_format")
	if err != nil {
		return false, nil, pos, fmt.Errorf("binlog: reading log_bin: %w", err)
	}
	version, _ := res.GetString(0, 0)
	logBin, _ := res.GetString(0, 1)
	format, _ := res.GetString(0, 2)
	mariadb = strings.Contains(strings.ToLower(version), "mariadb")
	switch {
	case logBin != "1" && !strings.EqualFold(logBin, "ON"):
		return mariadb, nil, pos, ErrNoBinlog
	case !strings.EqualFold(format, "ROW"):
		return mariadb, nil, pos, fmt.Errorf("%w (it is %s)", ErrNotRowFormat, format)
	}
	if r.resume {
		r.resume = false // one try: if the log moved on (purged), start at its end
		return mariadb, r.gset, r.pos, nil
	}
	if mariadb {
		res, err := c.Execute("SELECT @@global.gtid_binlog_pos")
		if err != nil {
			return mariadb, nil, pos, fmt.Errorf("binlog: reading gtid_binlog_pos: %w", err)
		}
		p, _ := res.GetString(0, 0)
		if gset, err = mysql.ParseMariadbGTIDSet(p); err != nil {
			return mariadb, nil, pos, fmt.Errorf("binlog: gtid_binlog_pos %q: %w", p, err)
		}
		r.gset = gset.Clone()
		return mariadb, gset, pos, nil
	}
	res, err = c.Execute("SHOW BINARY LOG STATUS") // MySQL 8.2 and later
	if err != nil {
		if res, err = c.Execute("SHOW MASTER STATUS"); err != nil {
			return mariadb, nil, pos, fmt.Errorf("binlog: reading the log position (REPLICATION CLIENT?): %w", err)
		}
	}
	name, _ := res.GetString(0, 0)
	at, _ := res.GetUint(0, 1)
	pos = mysql.Position{Name: name, Pos: uint32(at)}
	r.pos = pos
	return mariadb, nil, pos, nil
}

// handler receives the dump's events on the syncer's goroutine.
type handler struct{ r *Reader }

// HandleEvent implements replication.EventHandler.
func (h handler) HandleEvent(ev *replication.BinlogEvent) error {
	r := h.r
	now := r.clk.Now()
	switch ev.Header.EventType {
	case replication.HEARTBEAT_EVENT, replication.HEARTBEAT_LOG_EVENT_V2:
		r.lag.Store(0)
		return nil
	}
	switch e := ev.Event.(type) {
	case *replication.RotateEvent:
		r.pos = mysql.Position{Name: string(e.NextLogName), Pos: uint32(e.Position)}
		return nil
	case *replication.FormatDescriptionEvent, *replication.MariadbGTIDListEvent, *replication.PreviousGTIDsEvent,
		*replication.MariadbBinlogCheckPointEvent:
		return nil
	}
	if ts := ev.Header.Timestamp; ts > 0 {
		r.lag.Store(int64(max(0, now.Sub(time.Unix(int64(ts), 0)))))
	}
	txn, ok := r.tally.event(ev)
	if !ok {
		return nil
	}
	// The resume point moves past what is complete.
	if ev.Header.LogPos > 0 {
		r.pos.Pos = ev.Header.LogPos
	}
	if g, err := mysql.ParseMariadbGTID(txn.GTID); err == nil && txn.GTID != "" && r.gset != nil {
		_ = r.gset.(*mysql.MariadbGTIDSet).AddSet(g)
	}
	r.resume = true
	if k := txn.key(); k != "" {
		run(r.store.complete(k, txn.Bytes, now))
	}
	return nil
}
