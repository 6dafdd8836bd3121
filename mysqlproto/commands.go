package mysqlproto

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/pingcap/failpoint"
	"github.com/rgproxy/rgproxy/sqlscan"
)

// command reads one client command and handles it to the end of its
// response. A nil error means the session goes on.
func (ss *session) command() error {
	if ss.enterIdle() {
		return ss.backendGone()
	}
	n, seq, err := readHeader(ss.crd)
	if ss.leaveIdle() {
		// The client's command, if one came, is dropped with the
		// connection: the backend that would run it is gone.
		return ss.backendGone()
	}
	if err != nil {
		if errors.Is(err, net.ErrClosed) && ss.isClosing() {
			return io.EOF
		}
		return err
	}
	if !ss.beginCommand() {
		return errQuit
	}
	// From here the client has started a command: each wait for the rest
	// of it is bounded (Config.NetReadTimeout).
	ss.armRead()
	ss.seq = 0
	if seq != 0 {
		return errOutOfOrder("command packet", seq, 0)
	}
	if n == 0 {
		ss.acquire()
		return ss.malformed(1, &Error{Code: mysql.ER_UNKNOWN_COM_ERROR, State: "08S01", Message: "Unknown command"},
			fmt.Errorf("%w: empty command packet", ErrMalformedPacket))
	}
	if int64(n) > ss.srv.cfg.MaxPacketPayload {
		return newClientError(ProtoTooLarge, 1, fmt.Errorf("%w: %d bytes, limit %d", ErrPacketTooLarge, n, ss.srv.cfg.MaxPacketPayload))
	}
	read := n
	if n > streamFrom {
		if b, err := ss.crd.Peek(1); err == nil && streamed(b[0]) {
			// Only the statement id matters here: the parameters (a bulk's
			// rows, long data) go to the backend as they arrive.
			read = streamPrefix
		}
	}
	// The buffer grows as the bytes arrive, not to what the header says.
	ss.buf, err = readPayload(ss.crd, ss.buf[:0], read, &ss.acct)
	if err != nil {
		return asClientError(err, 1, ProtoMalformed)
	}
	// The command is here: the session works, with its pooled buffers.
	ss.acquire()
	ss.unread = n - read
	p := ss.buf
	if ss.csStale && (p[0] == mysql.COM_QUERY || p[0] == mysql.COM_STMT_PREPARE) {
		// A statement may have changed character_set_client: ask before
		// this text is scanned.
		if err := ss.refreshCharset(); err != nil {
			return err
		}
	}
	ss.st = Statement{Command: p[0], PayloadBytes: int64(n), InTransaction: ss.status&mysql.SERVER_STATUS_IN_TRANS != 0,
		NoBackslashEscapes: ss.status&mysql.SERVER_STATUS_NO_BACKSLASH_ESCAPED != 0, Charset: ss.charset}
	st := &ss.st
	switch p[0] {
	case mysql.COM_QUIT:
		return errQuit
	case mysql.COM_QUERY:
		text := p[1:]
		ss.attrLen = 0
		if ss.caps&mysql.CLIENT_QUERY_ATTRIBUTES != 0 {
			// The statement's text follows its attributes.
			k, err := queryAttributesLen(text)
			if err != nil {
				if _, err := ss.drainContinuations(n); err != nil {
					return err
				}
				return ss.malformed(ss.seq+1, protoReply(ProtoMalformed, err.Error()), err)
			}
			ss.attrLen, text = k, text[k:]
		}
		st.Query = string(text)
		st.Class, st.Multi = ss.scan(text, st)
		return ss.statement(st, n, respGeneric, false, nil)
	case mysql.COM_STMT_PREPARE:
		st.Query = string(p[1:])
		ss.prepClass, _ = ss.scan(p[1:], st)
		st.Class = sqlscan.ClassOther
		return ss.statement(st, n, respPrepare, false, nil)
	case mysql.COM_STMT_EXECUTE, mysql.COM_STMT_FETCH, mysql.COM_STMT_RESET, mysql.COM_STMT_SEND_LONG_DATA, mysql.COM_STMT_CLOSE,
		comStmtBulkExecute:
		return ss.stmtCommand(st, n)
	case mysql.COM_INIT_DB, mysql.COM_PROCESS_KILL, mysql.COM_RESET_CONNECTION, mysql.COM_REFRESH:
		st.Class = sqlscan.ClassOther
		return ss.statement(st, n, respGeneric, false, nil)
	case mysql.COM_STATISTICS, mysql.COM_SET_OPTION, mysql.COM_DEBUG:
		// One packet: a string (STATISTICS) or an EOF, or an ERR.
		st.Class = sqlscan.ClassOther
		return ss.statement(st, n, respSingle, false, nil)
	case mysql.COM_FIELD_LIST:
		st.Class = sqlscan.ClassRead
		return ss.statement(st, n, respFieldList, false, nil)
	case mysql.COM_PING:
		st.Class = sqlscan.ClassFree
		return ss.statement(st, n, respGeneric, false, nil)
	case mysql.COM_CHANGE_USER:
		return ss.changeUser(n)
	}
	// COM_BINLOG_DUMP, COM_REGISTER_SLAVE, COM_DAEMON, COM_TABLE_DUMP, ...:
	// not relayed, and the session goes on.
	if _, err := ss.drainContinuations(n); err != nil {
		return err
	}
	return ss.sendError(ss.seq+1, &Error{Code: mysql.ER_UNKNOWN_COM_ERROR, State: "08S01", Message: "Unknown command"})
}

// streamFrom is the size from which a command whose payload rgproxy reads
// only the start of (streamed) is relayed as it arrives rather than read
// whole first.
const streamFrom = 16 << 10

// streamPrefix is how much of a streamed command's first packet is read
// before forwarding: the command byte and the statement id.
const streamPrefix = 16

// streamed reports whether rgproxy needs only the start of a command's
// payload: the commands that carry parameter values after a statement id.
func streamed(cmd byte) bool {
	switch cmd {
	case mysql.COM_STMT_EXECUTE, comStmtBulkExecute, mysql.COM_STMT_SEND_LONG_DATA:
		return true
	}
	return false
}

// scan makes the single pass over a statement's text q (st.Query's bytes)
// into st.Scan, and returns its class and whether it holds several
// statements. The digest, for a policy only, goes to the session's buffer.
func (ss *session) scan(q []byte, st *Statement) (sqlscan.Class, bool) {
	mode := st.Mode()
	if ss.srv.passThrough {
		c, m, _ := sqlscan.Text(q, st.Query, mode, ss.srv.words, &st.Scan, nil, false)
		return c, m
	}
	c, m, d := sqlscan.Text(q, st.Query, mode, ss.srv.words, &st.Scan, ss.digest, true)
	ss.digest = d
	return c, m
}

// stmtCommand handles the commands that name a prepared statement.
func (ss *session) stmtCommand(st *Statement, n int) error {
	p := ss.buf
	if len(p) < 5 {
		// No statement id (the payload is all here: it is shorter than
		// streamFrom). MariaDB ignores such a CLOSE or SEND_LONG_DATA,
		// which have no answer, and answers the others with 1835.
		err := fmt.Errorf("%w: command 0x%02x too short", ErrMalformedPacket, p[0])
		if p[0] == mysql.COM_STMT_CLOSE || p[0] == mysql.COM_STMT_SEND_LONG_DATA {
			return ss.malformed(0, nil, err)
		}
		return ss.malformed(1, protoReply(ProtoMalformed, ""), err)
	}
	id := uint32(p[1]) | uint32(p[2])<<8 | uint32(p[3])<<16 | uint32(p[4])<<24
	if id == lastStmtID && ss.lastStmt != 0 {
		id = ss.lastStmt
	}
	ps := ss.stmts[id]
	if ps != nil {
		st.Query = ps.query
		st.Scan = ps.scan
		st.Charset = ps.charset
	}
	switch p[0] {
	case mysql.COM_STMT_SEND_LONG_DATA, mysql.COM_STMT_CLOSE:
		// No response: forward, and charge long data to the next EXECUTE.
		total, err := ss.forward(n)
		if err != nil {
			return err
		}
		if err := ss.bwr.Flush(); err != nil {
			return ss.backendFailed(1, err)
		}
		if p[0] == mysql.COM_STMT_CLOSE {
			delete(ss.stmts, id)
			if id == ss.lastStmt {
				ss.lastStmt = 0
			}
		} else if ps != nil {
			ps.longData += total
		}
		return nil
	case mysql.COM_STMT_RESET:
		st.Class = sqlscan.ClassFree
		if ps != nil {
			ps.longData = 0
		}
		return ss.statement(st, n, respGeneric, false, nil)
	case mysql.COM_STMT_FETCH:
		st.Class = sqlscan.ClassRead
		return ss.statement(st, n, respFetch, true, nil)
	case comStmtBulkExecute:
		// MariaDB runs bulk operations for INSERT, UPDATE, DELETE and
		// REPLACE only: a write, whose parameter rows are written bytes.
		st.Class = sqlscan.ClassWrite
		return ss.statement(st, n, respGeneric, true, ps)
	}
	st.Class = sqlscan.ClassOther
	if ps != nil {
		st.Class = ps.class
	}
	return ss.statement(st, n, respGeneric, true, ps)
}

// statement asks the policy, forwards the command, relays its response
// and reports the outcome.
func (ss *session) statement(st *Statement, n int, kind respKind, binary bool, ps *prepared) error {
	var v Verdict
	if ss.srv.passThrough {
		v = ss.pol.Before(ss.ctx, st, sessionBackend{ss})
	} else {
		// the hangup check reads the client while Before waits, as long
		// as it waits: not under the bound of a command's rest.
		ss.disarmRead()
		ss.beginBefore()
		v = ss.pol.Before(ss.ctx, st, sessionBackend{ss})
		ss.endBefore()
		ss.armRead()
	}
	if v.Reply != nil {
		if _, err := ss.drainContinuations(n); err != nil {
			return err
		}
		ss.rw.status = ss.status
		if err := ss.rw.packets(v.Reply, st.Command, func(p []byte) error {
			return ss.sendClient(ss.seq+1, p)
		}); err != nil {
			return err
		}
		if err := ss.cwr.Flush(); err != nil {
			return err
		}
		return ss.keepBackendAlive()
	}
	if err := ss.ctx.Err(); err != nil {
		// The session ended while the policy let the statement through:
		// it never runs, but After must still release what Before holds.
		ss.out = Outcome{ErrCode: mysql.ER_QUERY_INTERRUPTED, NotForwarded: true}
		ss.pol.After(st, &ss.out)
		return err
	}
	ss.out = Outcome{}
	out := &ss.out
	ss.seq = 0
	var req int64
	var err error
	if v.Rewrite != "" && st.Command == mysql.COM_QUERY {
		req, err = ss.forwardRewritten(n, v.Rewrite)
	} else {
		req, err = ss.forward(n)
	}
	out.RequestBytes = req
	if ps != nil {
		out.RequestBytes += ps.longData
		ps.longData = 0
	}
	if err == nil {
		if err = ss.flushCommand(); err != nil {
			err = ss.backendFailed(1, err)
		}
	}
	if err != nil {
		out.ErrCode = errCodeBackendLost
		ss.pol.After(st, out)
		return err
	}
	start := ss.srv.now()
	blocked := ss.rawClient.blocked
	err = ss.relayResponse(kind, binary, out)
	out.BackendTime = max(0, ss.srv.now().Sub(start)-(ss.rawClient.blocked-blocked)-out.BackendTime)
	out.InTransaction = ss.status&mysql.SERVER_STATUS_IN_TRANS != 0
	if err == nil {
		switch {
		case st.Command == mysql.COM_STMT_PREPARE && ss.m.Prepared:
			ps := &prepared{query: st.Query, class: ss.prepClass, scan: st.Scan, charset: st.Charset}
			if st.Scan.Digest != nil {
				ps.digest = bytes.Clone(st.Scan.Digest)
				ps.scan.Digest = ps.digest
			}
			ss.stmts[ss.m.StmtID] = ps
			ss.lastStmt = ss.m.StmtID
		case st.Command == mysql.COM_STMT_PREPARE:
			ss.lastStmt = 0 // as MariaDB forgets it after a failed PREPARE
		case st.Command == mysql.COM_RESET_CONNECTION && out.ErrCode == 0:
			clear(ss.stmts)
			ss.lastStmt = 0
			ss.charsetReset(0, false)
			ss.pol.Event(EventResetConnection, ss.info)
		case st.Scan.Charset.Kind != sqlscan.CharsetNone && (st.Command == mysql.COM_QUERY || st.Command == mysql.COM_STMT_EXECUTE):
			ss.charsetAfter(st, out)
		}
	}
	ss.pol.After(st, out)
	if err == nil && !ss.srv.passThrough {
		err = ss.followUp(st, out)
	}
	return err
}

// followUp calls the policy's FollowUp, if it has one, with the session's
// backend connection; an I/O failure of a query it ran ends the session.
func (ss *session) followUp(st *Statement, out *Outcome) error {
	if ss.follow == nil {
		return nil
	}
	be := &ss.followBe
	be.sessionBackend, be.err = sessionBackend{ss}, nil
	ss.follow.FollowUp(ss.ctx, st, out, be)
	return be.err
}

// followBackend is the Backend a FollowUp gets: it remembers an I/O failure
// (the session's backend connection is closed by then) so that the session
// ends after the call, rather than at the client's next command.
type followBackend struct {
	sessionBackend
	err error
}

// Query implements Backend.
func (b *followBackend) Query(ctx context.Context, sql string) ([]string, [][]*string, error) {
	cols, rows, err := b.sessionBackend.Query(ctx, sql)
	if err != nil && errors.Is(err, ErrBackendLost) && b.err == nil {
		b.err = err
	}
	return cols, rows, err
}

// forward sends the command in ss.buf (first packet of n bytes, of which
// ss.unread are still to be read from the client) to the backend,
// streaming the rest and any continuation packets from the client, and
// returns the payload bytes sent. A backend failure has already been
// reported.
func (ss *session) forward(n int) (int64, error) {
	ss.lastBackend = ss.srv.now()
	if err := writeHeader(ss.bwr, n, 0); err != nil {
		return 0, ss.backendFailed(1, err)
	}
	if _, err := ss.bwr.Write(ss.buf); err != nil {
		return 0, ss.backendFailed(1, err)
	}
	if k := ss.unread; k > 0 {
		ss.unread = 0
		if err := copyN(ss.bwr, ss.crd, k); err != nil {
			var werr *writeError
			if errors.As(err, &werr) {
				return 0, ss.backendFailed(1, err)
			}
			return 0, err // the client is gone: no one to tell
		}
	}
	total := int64(n)
	seq := byte(0)
	for n == mysql.MaxPayloadLen {
		var err error
		var s byte
		if n, s, err = readHeader(ss.crd); err != nil {
			return total, err
		}
		seq++
		if s != seq {
			return total, errOutOfOrder("continuation", s, seq)
		}
		total += int64(n)
		if total > ss.srv.cfg.MaxPacketPayload {
			return total, newClientError(ProtoTooLarge, seq+1, fmt.Errorf("%w: more than %d bytes", ErrPacketTooLarge, ss.srv.cfg.MaxPacketPayload))
		}
		if err := writeHeader(ss.bwr, n, seq); err != nil {
			return total, ss.backendFailed(seq+1, err)
		}
		if err := copyN(ss.bwr, ss.crd, n); err != nil {
			var werr *writeError
			if errors.As(err, &werr) {
				return total, ss.backendFailed(seq+1, err)
			}
			return total, err // the client is gone: no one to tell
		}
	}
	return total, nil
}

// flushCommand sends the command buffered for the backend, whose answer
// is read next. On a plain TCP backend with nothing left to read, the
// bytes leave with the read that waits for the answer
// (rawSock.sendThenRead), which saves that read a system call.
func (ss *session) flushCommand() error {
	rb := ss.rawBackend
	if rb == nil || rb.raw == nil || ss.backend != net.Conn(rb) || ss.brd.Buffered() > 0 {
		return ss.bwr.Flush()
	}
	rb.raw.setDeferNext(true)
	err := ss.bwr.Flush()
	rb.raw.setDeferNext(false) // Flush had nothing to write
	return err
}

// keepAliveAfter: a session whose commands the policy answers itself (a
// client refused again and again, or sending only rgproxy's own
// statements) pings its backend when it has not used it for this long, so
// that the backend's wait_timeout does not close the connection of a
// client that is busy all along.
const keepAliveAfter = time.Second

// keepBackendAlive pings the backend after a locally answered command if
// the backend has been left alone for keepAliveAfter. A backend that does
// not answer ends the session, as a lost backend does.
func (ss *session) keepBackendAlive() error {
	now := ss.srv.now()
	if now.Sub(ss.lastBackend) < keepAliveAfter {
		return nil
	}
	ss.lastBackend = now
	// A backend that hangs must not hang the session: the ping gets the
	// dial's bound.
	_ = ss.backend.SetDeadline(time.Now().Add(ss.srv.cfg.DialTimeout))
	defer ss.backend.SetDeadline(time.Time{})
	if _, err := writeMessage(ss.bwr, 0, []byte{mysql.COM_PING}); err != nil {
		return fmt.Errorf("%w: keep-alive ping: %w", ErrBackendLost, err)
	}
	if err := ss.bwr.Flush(); err != nil {
		return fmt.Errorf("%w: keep-alive ping: %w", ErrBackendLost, err)
	}
	p, _, err := readMessage(ss.brd, nil, authLimit)
	switch {
	case err != nil:
		return fmt.Errorf("%w: keep-alive ping: %w", ErrBackendLost, err)
	case len(p) > 0 && p[0] == mysql.ERR_HEADER:
		return fmt.Errorf("%w: keep-alive ping: %w", ErrBackendLost, parseErrPacket(p))
	case len(p) == 0 || p[0] != mysql.OK_HEADER:
		return fmt.Errorf("%w: keep-alive ping: unexpected answer %q", ErrBackendLost, p[:min(len(p), 8)])
	}
	var m respMachine
	if err := m.parseOK(p); err == nil {
		ss.status = m.Status
	}
	return nil
}

// forwardRewritten sends the policy's text instead of the client's
// COM_QUERY (first packet of n bytes, continuations drained), after the
// client's query attributes when they are in force, and returns the
// client's payload bytes.
func (ss *session) forwardRewritten(n int, text string) (int64, error) {
	attrs := ss.buf[1 : 1+ss.attrLen]
	p := make([]byte, 0, 1+len(attrs)+len(text))
	p = append(append(append(p, mysql.COM_QUERY), attrs...), text...)
	total, err := ss.drainContinuations(n)
	if err != nil {
		return total, err
	}
	ss.seq = 0
	if _, err := writeMessage(ss.bwr, 0, p); err != nil {
		return total, ss.backendFailed(1, err)
	}
	return total, nil
}

// drainContinuations skips the rest of a multi-packet command that is
// answered locally.
func (ss *session) drainContinuations(n int) (int64, error) {
	if k := ss.unread; k > 0 {
		ss.unread = 0
		if err := discardN(ss.crd, k); err != nil {
			return int64(n), err
		}
	}
	var total = int64(n)
	seq := byte(0)
	for n == mysql.MaxPayloadLen {
		var s byte
		var err error
		if n, s, err = readHeader(ss.crd); err != nil {
			return total, err
		}
		seq++
		if s != seq {
			return total, errOutOfOrder("continuation", s, seq)
		}
		if total += int64(n); total > ss.srv.cfg.MaxPacketPayload {
			return total, newClientError(ProtoTooLarge, seq+1, fmt.Errorf("%w: more than %d bytes", ErrPacketTooLarge, ss.srv.cfg.MaxPacketPayload))
		}
		if err := discardN(ss.crd, n); err != nil {
			return total, err
		}
	}
	ss.seq = seq
	return total, nil
}

// relayResponse copies the backend's response to the client packet by
// packet until the state machine says it is over. It fills out's
// ResponseBytes, AffectedRows, ErrCode and (temporarily) BackendTime with
// the time spent waiting for the client's LOCAL INFILE data.
func (ss *session) relayResponse(kind respKind, binary bool, out *Outcome) error {
	m := &ss.m
	m.reset(kind, ss.rflags, binary)
	nextProgress := int64(progressEvery)
	for {
		n, seq, err := readHeader(ss.brd)
		failpoint.Inject("backendReadError", func(val failpoint.Value) {
			// The backend goes away once val bytes of the response passed.
			if after, ok := val.(int); ok && out.ResponseBytes >= int64(after) {
				err = errFailpoint
			}
		})
		if err != nil {
			out.ErrCode = errCodeBackendLost
			return ss.backendFailed(ss.seq+1, err)
		}
		p, err := ss.brd.Peek(min(n, inspectLen))
		if err != nil {
			out.ErrCode = errCodeBackendLost
			return ss.backendFailed(ss.seq+1, err)
		}
		ev, merr := m.feed(p, n)
		var rewritten *Error
		if ev == evDone && merr == nil && m.ErrCode != 0 && ss.rewriter != nil {
			rewritten = ss.rewriter.RewriteError(&ss.st, m.ErrCode)
		}
		if rewritten != nil {
			// The policy answers for the backend's ERR (same sequence id).
			if err := discardN(ss.brd, n); err != nil {
				out.ErrCode = errCodeBackendLost
				return ss.backendFailed(ss.seq+1, err)
			}
			out.ResponseBytes += int64(n)
			if err := ss.sendClient(seq, appendErr(ss.buf[:0], rewritten)); err != nil {
				return err
			}
		} else if err := ss.relayPacket(n, seq, out); err != nil {
			return err
		}
		if ss.progress != nil && out.ResponseBytes >= nextProgress {
			ss.progress.Progress(&ss.st, out.ResponseBytes)
			nextProgress = out.ResponseBytes + progressEvery
		}
		if merr != nil {
			out.ErrCode = errCodeBackendLost
			return ss.backendFailed(ss.seq+1, merr)
		}
		switch ev {
		case evDone:
			out.AffectedRows = m.Affected
			out.Warnings = m.Warnings
			out.ErrCode = m.ErrCode
			if m.HasStatus {
				ss.status = m.Status
			}
			if err := ss.cwr.Flush(); err != nil {
				return err
			}
			return nil
		case evInfile:
			if err := ss.relayInfile(out); err != nil {
				return err
			}
			m.state = stFirst
		case evProgress:
			if err := ss.cwr.Flush(); err != nil {
				return err
			}
		}
	}
}

// progressEvery is how much response payload passes between two calls of
// a ProgressObserver.
const progressEvery = 64 << 10

// relayPacket copies one logical packet whose first header (n, seq) has
// been read, continuations included.
func (ss *session) relayPacket(n int, seq byte, out *Outcome) error {
	for {
		if err := writeHeader(ss.cwr, n, seq); err != nil {
			return err
		}
		if err := copyN(ss.cwr, ss.brd, n); err != nil {
			var werr *writeError
			if errors.As(err, &werr) {
				return err
			}
			out.ErrCode = errCodeBackendLost
			return ss.backendFailed(seq+1, err)
		}
		ss.seq = seq
		out.ResponseBytes += int64(n)
		if n < mysql.MaxPayloadLen {
			return nil
		}
		var err error
		if n, seq, err = readHeader(ss.brd); err != nil {
			out.ErrCode = errCodeBackendLost
			return ss.backendFailed(ss.seq+1, err)
		}
	}
}

// relayInfile streams the client's LOCAL INFILE packets to the backend
// until the empty packet that ends them.
func (ss *session) relayInfile(out *Outcome) error {
	if err := ss.cwr.Flush(); err != nil {
		return err
	}
	start := ss.srv.now()
	defer func() { out.BackendTime += ss.srv.now().Sub(start) }()
	for {
		n, seq, err := readHeader(ss.crd)
		if err != nil {
			return fmt.Errorf("reading LOCAL INFILE data: %w", err)
		}
		if seq != ss.seq+1 {
			return errOutOfOrder("LOCAL INFILE packet", seq, ss.seq+1)
		}
		ss.seq = seq
		if err := writeHeader(ss.bwr, n, seq); err != nil {
			return ss.backendFailed(seq+1, err)
		}
		if err := copyN(ss.bwr, ss.crd, n); err != nil {
			var werr *writeError
			if errors.As(err, &werr) {
				return ss.backendFailed(seq+1, err)
			}
			return err
		}
		out.RequestBytes += int64(n)
		if n == 0 {
			if err := ss.bwr.Flush(); err != nil {
				return ss.backendFailed(seq+1, err)
			}
			return nil
		}
	}
}

// changeUser relays COM_CHANGE_USER and its authentication exchange.
func (ss *session) changeUser(n int) error {
	cu, err := parseChangeUser(ss.buf, ss.caps)
	if err != nil {
		return newClientError(ProtoBadHandshake, 1, err)
	}
	if n == mysql.MaxPayloadLen {
		return newClientError(ProtoBadHandshake, 1, fmt.Errorf("%w: COM_CHANGE_USER too large", ErrMalformedPacket))
	}
	if clearTextPlugin(cu.Plugin) && !ss.bothTLS() {
		return ss.refuseClearText(1, cu.Plugin)
	}
	if _, err := ss.forward(n); err != nil {
		return err
	}
	if err := ss.bwr.Flush(); err != nil {
		return ss.backendFailed(1, err)
	}
	plugin := cu.Plugin
	if plugin == "" {
		plugin = "mysql_native_password"
	}
	ok, err := ss.relayAuth(plugin, 0)
	if err != nil {
		return err
	}
	clear(ss.stmts)
	ss.lastStmt = 0
	ss.charsetReset(cu.Collation, cu.HasCollation)
	if ok {
		ss.info.User = cu.User
		ss.pol.Event(EventChangeUser, ss.info)
	}
	return nil
}

// sessionBackend runs a policy's queries on the session's backend
// connection, between statements.
type sessionBackend struct{ ss *session }

// Query implements Backend with the text protocol. A backend error is
// returned as *Error; an I/O failure breaks the session.
func (b sessionBackend) Query(ctx context.Context, sql string) ([]string, [][]*string, error) {
	ss := b.ss
	ss.lastBackend = ss.srv.now()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = ss.backend.SetDeadline(dl)
		defer ss.backend.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { _ = ss.backend.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	q := make([]byte, 0, 3+len(sql))
	q = append(q, mysql.COM_QUERY)
	if ss.caps&mysql.CLIENT_QUERY_ATTRIBUTES != 0 {
		q = append(q, 0, 1) // no attributes, one set
	}
	q = append(q, sql...)
	if _, err := writeMessage(ss.bwr, 0, q); err != nil {
		return nil, nil, b.broken(err)
	}
	if err := ss.bwr.Flush(); err != nil {
		return nil, nil, b.broken(err)
	}
	var cols []string
	var rows [][]*string
	var qerr error
	first := true
	for {
		p, _, err := readMessage(ss.brd, nil, ss.srv.cfg.MaxPacketPayload)
		if err != nil {
			return nil, nil, b.broken(err)
		}
		if len(p) == 0 {
			return nil, nil, b.broken(fmt.Errorf("%w: empty packet", ErrMalformedPacket))
		}
		var m respMachine
		switch {
		case ss.rflags&rfProgress != 0 && isProgress(p):
			continue
		case p[0] == mysql.ERR_HEADER:
			if qerr == nil {
				qerr = parseErrPacket(p)
			}
			return cols, rows, qerr
		case p[0] == mysql.OK_HEADER:
			if err := m.parseOK(p); err != nil {
				return nil, nil, b.broken(err)
			}
			ss.status = m.Status
			if m.Status&mysql.SERVER_MORE_RESULTS_EXISTS == 0 {
				return cols, rows, qerr
			}
			continue
		case p[0] == mysql.LocalInFile_HEADER:
			return nil, nil, b.broken(fmt.Errorf("%w: LOCAL INFILE in a policy query", ErrMalformedPacket))
		}
		cnt, k, ok := lenenc(p)
		if !ok {
			return nil, nil, b.broken(fmt.Errorf("%w: column count", ErrMalformedPacket))
		}
		var names []string
		// CACHE_METADATA: a text result set always carries its
		// definitions, but a 0 would say none follow.
		defs := ss.rflags&rfCacheMetadata == 0 || len(p) <= k || p[k] != 0
		for i := uint64(0); i < cnt; i++ {
			if !defs {
				names = append(names, "")
				continue
			}
			d, _, err := readMessage(ss.brd, nil, 1<<20)
			if err != nil {
				return nil, nil, b.broken(err)
			}
			names = append(names, columnName(d))
		}
		if ss.caps&mysql.CLIENT_DEPRECATE_EOF == 0 {
			if _, _, err := readMessage(ss.brd, nil, 1<<20); err != nil {
				return nil, nil, b.broken(err)
			}
		}
		var set [][]*string
		for {
			r, _, err := readMessage(ss.brd, nil, ss.srv.cfg.MaxPacketPayload)
			if err != nil {
				return nil, nil, b.broken(err)
			}
			if ss.rflags&rfProgress != 0 && isProgress(r) {
				continue
			}
			if len(r) > 0 && r[0] == mysql.ERR_HEADER {
				return cols, rows, parseErrPacket(r)
			}
			if isEOFPacket(r, len(r)) {
				if ss.caps&mysql.CLIENT_DEPRECATE_EOF != 0 {
					_ = m.parseOK(r)
				} else {
					m.parseEOF(r)
				}
				ss.status = m.Status
				break
			}
			row, err := textRow(r, len(names))
			if err != nil {
				return nil, nil, b.broken(err)
			}
			set = append(set, row)
		}
		if first {
			cols, rows, first = names, set, false
		}
		if m.Status&mysql.SERVER_MORE_RESULTS_EXISTS == 0 {
			return cols, rows, qerr
		}
	}
}

// broken ends the session after a failed policy query: the backend
// connection is in an unknown state.
func (b sessionBackend) broken(err error) error {
	b.ss.srv.backendErrors.Add(1)
	_ = b.ss.backend.Close()
	return fmt.Errorf("%w: policy query: %w", ErrBackendLost, err)
}

// columnName reads the name from a column definition (catalog, schema,
// table, original table, name).
func columnName(d []byte) string {
	for i := 0; i < 4; i++ {
		_, k, ok := lenencString(d)
		if !ok {
			return ""
		}
		d = d[k:]
	}
	name, _, _ := lenencString(d)
	return string(name)
}

// textRow decodes a text-protocol row of n columns.
func textRow(r []byte, n int) ([]*string, error) {
	row := make([]*string, n)
	for i := range row {
		if len(r) > 0 && r[0] == 0xfb {
			r = r[1:]
			continue
		}
		v, k, ok := lenencString(r)
		if !ok {
			return nil, fmt.Errorf("%w: text row", ErrMalformedPacket)
		}
		s := string(v)
		row[i] = &s
		r = r[k:]
	}
	return row, nil
}
