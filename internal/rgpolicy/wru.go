package rgpolicy

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rgproxy/rgproxy/internal/binlog"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/sqlscan"
)

// This file makes writes pay for what the backend wrote. The before-cost
// charges a write the bytes of its own packet (ru.BeforeCost); bytes that
// reach a table by another route — a user variable, EXECUTE IMMEDIATE,
// PREPARE ... USING, INSERT ... SELECT, a stored procedure, a trigger —
// are charged here, after the statement, from one of two sources:
//
//   - binlog: the backend's row-based binary log, read by internal/binlog.
//     After a statement that may have committed a write (a write or
//     EXECUTE / DO statement outside a transaction, or the end of a
//     transaction that ran one), the session names the transaction it
//     committed — MariaDB: SELECT @@last_gtid on its own connection in
//     FollowUp; MySQL: its connection id — and claims it from the reader.
//     The claim resolves when the transaction's events arrive (usually
//     milliseconds after the OK) and charges, as debt, the bytes the log
//     shows beyond the packet bytes already charged for the statement (or
//     for the transaction's statements): a statement pays max(packet,
//     binlog bytes).
//   - estimate: without a binary log, a statement that names one target
//     table (INSERT / REPLACE / single-table UPDATE, also through EXECUTE
//     IMMEDIATE 'text' and EXECUTE of a text PREPAREd in the session)
//     pays max(packet, affected rows × the table's AVG_ROW_LENGTH), the
//     average read once a minute from information_schema.TABLES on the
//     session's own connection before the statement runs (and trusted
//     from 1 MiB of data on: minTrustedDataLength).
//
// Anything else pays its packet, as before.

// WriteSource is where the bytes a statement wrote come from
// (--write-source).
type WriteSource uint8

const (
	// WriteAuto: the binary log while the reader follows a row-based
	// one, else the estimate.
	WriteAuto WriteSource = iota
	// WriteBinlog: the binary log only; the packet while the reader
	// follows none.
	WriteBinlog
	// WriteEstimate: the estimate only, never the binary log.
	WriteEstimate
	// WritePacket: the packet bytes only (no query, no lookup).
	WritePacket
)

func (w WriteSource) String() string {
	switch w {
	case WriteBinlog:
		return "binlog"
	case WriteEstimate:
		return "estimate"
	case WritePacket:
		return "packet"
	}
	return "auto"
}

// ParseWriteSource parses --write-source.
func ParseWriteSource(s string) (WriteSource, error) {
	for _, w := range []WriteSource{WriteAuto, WriteBinlog, WriteEstimate, WritePacket} {
		if strings.EqualFold(s, w.String()) {
			return w, nil
		}
	}
	return WriteAuto, fmt.Errorf("rgpolicy: write source %q: want auto, binlog, estimate or packet", s)
}

// Binlog is what the policy needs of the binary-log reader
// (*internal/binlog.Reader); an interface so that the policy's accounting
// is tested without a backend.
type Binlog interface {
	Attribution() binlog.Attribution
	ClaimGTID(gtid string, done func(binlog.Result))
	ClaimThread(id uint32, done func(binlog.Result))
}

// wsrc names what settled a statement's written bytes: the label of
// rgproxy_written_bytes_total and rgproxy_write_source, and SHOW LAST
// STATEMENT RU's WRU_SOURCE.
type wsrc uint8

const (
	srcPacket wsrc = iota
	srcBinlog
	srcEstimate
	nSources
)

var srcNames = [nSources]string{"packet", "binlog", "estimate"}

func (w wsrc) String() string { return srcNames[w] }

// followUpTimeout bounds a policy query after a statement.
const followUpTimeout = 10 * time.Second

// writes is the policy's side of write accounting, shared by sessions.
type writes struct {
	source WriteSource
	binlog Binlog // nil: no reader
	rows   *rowLengths
}

func newWrites(source WriteSource, bl Binlog, reg prometheus.Registerer) (*writes, error) {
	w := &writes{source: source, binlog: bl, rows: newRowLengths()}
	if reg == nil {
		return w, nil
	}
	for s := range nSources {
		g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "rgproxy_write_source",
			Help:        "1 for where the bytes statements write come from now (--write-source; auto moves between binlog and estimate as the binary-log reader follows the backend or not), 0 for the others.",
			ConstLabels: prometheus.Labels{"source": s.String()},
		}, func() float64 {
			if w.inForce() == s {
				return 1
			}
			return 0
		})
		if err := reg.Register(g); err != nil {
			return nil, fmt.Errorf("rgpolicy: registering rgproxy_write_source: %w", err)
		}
	}
	return w, nil
}

// inForce is the source that settles statements now.
func (w *writes) inForce() wsrc {
	following := w.binlog != nil && w.binlog.Attribution() != binlog.AttributeNone
	switch w.source {
	case WritePacket:
		return srcPacket
	case WriteEstimate:
		return srcEstimate
	case WriteBinlog:
		if following {
			return srcBinlog
		}
		return srcPacket
	}
	if following {
		return srcBinlog
	}
	return srcEstimate
}

// WriteSourceInForce names where the bytes statements write come from
// now: "binlog", "estimate" or "packet".
func (p *Policy) WriteSourceInForce() string { return p.writes.inForce().String() }

// writeState is a session's write accounting between statements.
type writeState struct {
	// head is what Before read of the statement in flight.
	head stmtHead
	// lastGTID is @@last_gtid as the session last read it (MariaDB).
	lastGTID string
	// txn sums, over the open transaction's statements, the written
	// bytes already charged, and whether one of them may have written.
	txnBytes float64
	txnWrote bool
	// db is the session's current database (dbKnown: as last asked),
	// for the estimate's table lookups.
	db      string
	dbKnown bool
	// prepared maps the names of statements PREPAREd from a literal text
	// to their target table, for EXECUTE name (estimate).
	prepared map[string]sqlscan.Table
	// rowCount is what ROW_COUNT() said after the session's last
	// statement, before the @@last_gtid query set it to -1 (rowCountSet:
	// known; see rowCountRewrite).
	rowCount    int64
	rowCountSet bool
	// xa is the open XA transaction's accounting (wru_routes.go).
	xa xaState
}

// maxPrepared bounds a session's remembered PREPARE names.
const maxPrepared = 64

// stmtHead is what the policy reads of a statement's first words
// (sqlscan.ReadHead; a Target's Schema "" is the current database), and
// what it makes of them.
type stmtHead struct {
	sqlscan.Head
	// mayWrite: the statement may commit a write (see writesBefore).
	mayWrite bool
	// avg is the target's average row length, when the estimate has it.
	avg float64
	// route is what wru_routes.go read of the statement.
	route routeHead
}

// writesBefore reads what the write accounting needs of a statement
// before it runs: whether it may write, and, for the estimate, its target
// table's average row length (asked of the backend at most once a minute
// per table; before the statement, so that the lookup disturbs none of its
// diagnostics — warnings, ROW_COUNT()).
func (s *session) writesBefore(ctx context.Context, st *mysqlproto.Statement, be mysqlproto.Backend) {
	w := &s.wr
	w.head = stmtHead{}
	if s.p.writes.source == WritePacket || (st.Class != sqlscan.ClassWrite && st.Class != sqlscan.ClassOther) {
		return
	}
	switch st.Command {
	case mysql.COM_QUERY, mysql.COM_STMT_EXECUTE, comStmtBulkExecute:
	default:
		return // PREPARE writes nothing; COM_INIT_DB and the like have no text
	}
	// A write may write; of the other statements, EXECUTE (a prepared
	// or immediate statement) and DO (a function) may, and several
	// statements in one may hold one.
	h := stmtHead{mayWrite: st.Class == sqlscan.ClassWrite || st.Multi}
	if st.Class == sqlscan.ClassOther && !st.Multi {
		h.Verb = sqlscan.FirstWord(st.Query, st.Mode())
		h.mayWrite = h.Verb == "EXECUTE" || h.Verb == "DO"
	}
	if s.p.writes.inForce() == srcEstimate && !st.Multi &&
		(st.Class == sqlscan.ClassWrite || h.Verb == "EXECUTE" || h.Verb == "PREPARE") {
		h.Head = sqlscan.ReadHead(st.Query, st.Mode())
		if h.Verb == "EXECUTE" && h.Target == (sqlscan.Table{}) && h.Prepare != "" {
			h.Target = w.prepared[strings.ToLower(h.Prepare)]
			h.Prepare = ""
		}
		if h.Target.Table != "" && h.Verb != "PREPARE" {
			h.avg = s.rowLength(ctx, be, h.Target)
		}
	}
	s.routesBefore(ctx, st, be, &h)
	w.head = h
}

// comStmtBulkExecute is MariaDB's COM_STMT_BULK_EXECUTE.
const comStmtBulkExecute = 0xfa

// FollowUp implements mysqlproto.FollowUpper: once the statement's
// response is with the client, it settles the bytes the statement wrote
// from the source in force (see the top of this file).
func (s *session) FollowUp(ctx context.Context, st *mysqlproto.Statement, out *mysqlproto.Outcome, be mysqlproto.Backend) {
	// Copying DDL (ddl.go) last: its bytes are none of the packet's nor
	// the binary log's.
	defer s.copyFollowUp(ctx, st, out, be)
	w := &s.wr
	h := w.head
	w.head = stmtHead{}
	switch {
	case st.Command == mysql.COM_RESET_CONNECTION:
		*w = writeState{}
	case st.Command == mysql.COM_INIT_DB || h.Verb == "USE" || st.Multi:
		w.dbKnown = false
	}
	if h.Prepare != "" && h.Verb == "PREPARE" && out.ErrCode == 0 {
		if w.prepared == nil {
			w.prepared = map[string]sqlscan.Table{}
		}
		for k := range w.prepared {
			if len(w.prepared) < maxPrepared {
				break
			}
			delete(w.prepared, k)
		}
		w.prepared[strings.ToLower(h.Prepare)] = h.Target
	}
	w.rowCountSet = false
	cur := &s.cur
	if out.NotForwarded || cur.req.Class == ru.ClassFree || !s.last.valid || s.series == nil {
		return
	}
	if cur.req.Class == ru.ClassRead || cur.req.Class == ru.ClassFetch {
		// A read writes nothing; one that ends a transaction (a deadlock's
		// rollback) ends its accounting too.
		if !out.InTransaction {
			w.txnBytes, w.txnWrote = 0, false
		}
		return
	}
	// The statement's groups: its own and, in strict mode, a bound tag's
	// (charged alike, as After charges them). Its shape's estimate learns
	// what it alone wrote; a transaction's bytes, charged at its end, go
	// to the summary of the statement that ended it.
	own := !st.InTransaction && !out.InTransaction
	to := s.led.lateTargets(cur, s.series, own)
	written := max(s.last.cost.WriteBytes, 0)
	s.led.wrotePacket(&to, written)
	src := s.p.writes.inForce()
	if per := max(h.avg, h.route.varBytes); src == srcEstimate && per > 0 && out.ErrCode == 0 && out.AffectedRows > 0 {
		est := float64(out.AffectedRows) * per
		if more := est - written; more > 0 {
			s.led.late(&to, ru.Consumption{WRU: more * s.p.cost.WriteCostPerByte, WriteBytes: more}, srcEstimate, true)
			written = est
		}
		s.last.write = &writeResult{source: srcEstimate}
	}
	// The binary log names transactions, not statements: inside one, the
	// bytes charged so far wait for its end.
	var charged float64
	var wrote bool
	r := s.routesFollowUp(ctx, st, out, be, h, &to, written)
	switch {
	case r.handled && !r.claim:
		return
	case r.handled:
		charged, wrote = r.charged, true
	case out.InTransaction:
		if !st.InTransaction {
			w.txnBytes, w.txnWrote = 0, false
		}
		w.txnBytes += written
		w.txnWrote = w.txnWrote || h.mayWrite
		return
	case st.InTransaction:
		charged, wrote = w.txnBytes+written, w.txnWrote || h.mayWrite
		w.txnBytes, w.txnWrote = 0, false
	default:
		charged, wrote = written, h.mayWrite
	}
	if src != srcBinlog || !wrote {
		return
	}
	c := &writeClaim{led: &s.led, to: to, charged: charged, done: make(chan struct{})}
	switch s.p.writes.binlog.Attribution() {
	case binlog.AttributeGTID:
		if own && !st.Multi && (st.Command == mysql.COM_QUERY || st.Command == mysql.COM_STMT_EXECUTE) {
			// The query sets ROW_COUNT() to -1; a plain DML statement's
			// is known, and given back in the next statement.
			switch sqlscan.FirstWord(st.Query, st.Mode()) {
			case "INSERT", "UPDATE", "DELETE", "REPLACE":
				w.rowCount, w.rowCountSet = int64(out.AffectedRows), true
				if out.ErrCode != 0 {
					w.rowCount = -1
				}
			}
		}
		gtid, ok := s.lastGTID(ctx, be)
		if !ok || gtid == "" || gtid == w.lastGTID {
			return // nothing of the session's in the log: its packet stands
		}
		w.lastGTID = gtid
		s.last.write = &writeResult{source: srcBinlog, claim: c}
		s.p.writes.binlog.ClaimGTID(gtid, c.resolve)
	case binlog.AttributeThread:
		s.last.write = &writeResult{source: srcBinlog, claim: c}
		s.p.writes.binlog.ClaimThread(s.connID, c.resolve)
	}
}

// lastGTID reads the GTID of the last transaction the session committed
// (MariaDB's @@last_gtid; "" before its first). The query changes none of
// the statement's warnings, but ROW_COUNT() then answers -1, as after any
// SELECT (rowCountRewrite gives a DML statement's back), and FOUND_ROWS()
// 1.
func (s *session) lastGTID(ctx context.Context, be mysqlproto.Backend) (string, bool) {
	s.cpu.stale()
	qctx, cancel := context.WithTimeout(ctx, followUpTimeout)
	defer cancel()
	_, rows, err := be.Query(qctx, "SELECT @@last_gtid")
	if err != nil || len(rows) != 1 || len(rows[0]) != 1 {
		s.p.logger.Debug("reading @@last_gtid failed: the statement pays its packet", "err", err)
		return "", false
	}
	if rows[0][0] == nil {
		return "", true
	}
	return *rows[0][0], true
}

// rowCountMention is the Scan.Mentions bit of ROW_COUNT.
var rowCountMention = func() uint64 {
	for i, w := range ScanWords() {
		if w == "row_count" {
			return 1 << i
		}
	}
	return 0
}()

// rowCountRewrite gives back the ROW_COUNT() the @@last_gtid query took
// from the statement before: in a COM_QUERY right after an INSERT, UPDATE,
// DELETE or REPLACE that FollowUp asked about, each ROW_COUNT() becomes
// that statement's count (a bare select item keeps its column name); in a
// multi-statement, whose Binlog_bytes_written query took it too, each of
// its first statement (the later ones follow their own statements). It
// returns the text to forward ("" = the client's, unchanged); rewrite is
// the text Before would forward so far.
func (s *session) rowCountRewrite(st *mysqlproto.Statement, rewrite string) string {
	w := &s.wr
	if !w.rowCountSet || st.Command != mysql.COM_QUERY || st.Scan.Mentions&rowCountMention == 0 {
		return rewrite
	}
	q := rewrite
	if q == "" {
		q = st.Query
	}
	rest := ""
	if st.Multi {
		n := sqlscan.FirstStatementLen([]byte(q), st.Mode())
		q, rest = q[:n], q[n:]
	}
	if out, ok := sqlscan.ReplaceRowCount(q, st.Mode(), w.rowCount); ok {
		return out + rest
	}
	return rewrite
}

// writeResult is how a statement's written bytes were settled, for SHOW
// LAST STATEMENT RU.
type writeResult struct {
	source wsrc
	claim  *writeClaim // a binary-log claim; nil when settled at once
}

// lastWrite returns what the last statement's write accounting added to
// its cost as After recorded it, and its WRU_SOURCE, waiting up to
// showLastWait for a binary-log claim still pending so that the figure
// shown is final.
func (s *session) lastWrite() (ru.Consumption, string) {
	r := s.last.write
	if r == nil {
		return ru.Consumption{}, srcPacket.String()
	}
	c := r.claim
	if c == nil {
		return ru.Consumption{}, r.source.String()
	}
	select {
	case <-c.done:
	default:
		t := s.p.clk.NewTimer(showLastWait)
		select {
		case <-c.done:
			t.Stop()
		case <-t.C():
			return ru.Consumption{}, "binlog pending"
		}
	}
	if !c.found {
		return ru.Consumption{}, srcPacket.String()
	}
	return c.extra, srcBinlog.String()
}

// showLastWait bounds how long SHOW LAST STATEMENT RU waits for the
// previous statement's binary-log claim.
const showLastWait = 100 * time.Millisecond

// writeClaim is a statement's (or a transaction's) claim of the bytes the
// binary log shows it wrote. resolve runs once, on the reader's goroutine
// or the session's; done closes after it has set found and extra.
type writeClaim struct {
	// led charges what the log shows, to to (stmtLedger.late).
	led *stmtLedger
	to  lateTo
	// charged is the written bytes already charged for the statement (or
	// the transaction's statements).
	charged float64
	done    chan struct{}
	found   bool
	extra   ru.Consumption
}

// resolve charges, as debt, the bytes the log showed beyond those
// charged. A claim the log did not answer charges nothing more: the
// packet stands.
func (c *writeClaim) resolve(r binlog.Result) {
	if r.Found {
		c.found = true
		if more := float64(r.Bytes) - c.charged; more > 0 {
			c.extra = ru.Consumption{WRU: more * c.led.p.cost.WriteCostPerByte, WriteBytes: more}
			c.led.late(&c.to, c.extra, srcBinlog, false)
		}
	}
	close(c.done)
}

// groupRef is a group a statement is charged to, and its series.
type groupRef struct {
	name   string
	series *groupSeries
}

// lateWRU adds WRU a statement was charged after its shape observed it
// (what the binary log or the estimate added) to the shape's summary and,
// when learn is set, its estimate, as if observe had seen them. (A
// transaction's bytes, charged to the statement that ended it, are not
// that statement's cost next time.)
func (t *shapes) lateWRU(k shapeKey, wru float64, learn bool) {
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.m[k]
	if s == nil {
		return
	}
	switch {
	case !learn:
	case s.execCount <= 1:
		s.estWRU += wru
	default:
		s.estWRU += estimateWeight * wru
	}
	s.sumWRU += wru
}

// rowLengths caches tables' average row lengths (information_schema
// TABLES.AVG_ROW_LENGTH, bytes) for a minute, for every session; at most
// maxRowLengths tables. Safe for concurrent use.
type rowLengths struct {
	mu sync.Mutex
	m  map[sqlscan.Table]rowLength
}

type rowLength struct {
	avg float64
	at  time.Time
}

const (
	rowLengthTTL  = time.Minute
	maxRowLengths = 10000
)

func newRowLengths() *rowLengths { return &rowLengths{m: map[sqlscan.Table]rowLength{}} }

func (r *rowLengths) get(t sqlscan.Table, now time.Time) (float64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.m[t]
	if !ok || now.Sub(e.at) >= rowLengthTTL {
		return 0, false
	}
	return e.avg, true
}

func (r *rowLengths) put(t sqlscan.Table, avg float64, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[t]; !ok && len(r.m) >= maxRowLengths {
		for k, e := range r.m {
			if now.Sub(e.at) >= rowLengthTTL || len(r.m) >= maxRowLengths {
				delete(r.m, k)
			}
		}
	}
	r.m[t] = rowLength{avg: avg, at: now}
}

// minTrustedDataLength is the smallest DATA_LENGTH (bytes) whose
// AVG_ROW_LENGTH the estimate uses: InnoDB counts whole 16 KiB pages, so a
// small table's average is mostly page rounding (one 10-byte row reads
// 16,384); from 1 MiB (64 pages) on, the rounding is a few percent.
const minTrustedDataLength = 1 << 20

// rowLength returns the average row length of the table a statement
// writes, from the cache or from the backend: one query on the session's
// connection that also tells the session's current database. Names are
// sent hex-encoded, never as quoted text. 0 when unknown or not trusted
// (no such table, no statistics yet, under minTrustedDataLength, the query
// failed).
func (s *session) rowLength(ctx context.Context, be mysqlproto.Backend, t sqlscan.Table) float64 {
	w := &s.wr
	now := s.p.clk.Now()
	key := t
	if key.Schema == "" && w.dbKnown {
		key.Schema = w.db
	}
	if key.Schema != "" {
		if avg, ok := s.p.writes.rows.get(key, now); ok {
			return avg
		}
	}
	schema := "DATABASE()"
	if t.Schema != "" {
		schema = "X'" + hex.EncodeToString([]byte(t.Schema)) + "'"
	}
	s.cpu.stale()
	qctx, cancel := context.WithTimeout(ctx, followUpTimeout)
	defer cancel()
	_, rows, err := be.Query(qctx, "SELECT DATABASE(), (SELECT IF(DATA_LENGTH >= "+strconv.Itoa(minTrustedDataLength)+
		", AVG_ROW_LENGTH, 0) FROM information_schema.TABLES WHERE TABLE_SCHEMA = "+
		schema+" AND TABLE_NAME = X'"+hex.EncodeToString([]byte(t.Table))+"')")
	if err != nil || len(rows) != 1 || len(rows[0]) != 2 {
		s.p.logger.Debug("reading a table's average row length failed: the statement pays its packet", "err", err)
		return 0
	}
	w.db, w.dbKnown = "", true
	if rows[0][0] != nil {
		w.db = *rows[0][0]
	}
	if t.Schema == "" {
		key.Schema = w.db
	}
	var avg float64
	if rows[0][1] != nil {
		avg, _ = strconv.ParseFloat(*rows[0][1], 64)
	}
	if key.Schema != "" {
		s.p.writes.rows.put(key, avg, now)
	}
	return avg
}
