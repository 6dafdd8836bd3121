package mysqlproto

import (
	"fmt"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// respKind is the shape of the response a command expects.
type respKind uint8

const (
	// respGeneric: OK, ERR, LOCAL INFILE request or result sets, possibly
	// several (SERVER_MORE_RESULTS_EXISTS). COM_QUERY, COM_STMT_EXECUTE,
	// COM_PING, COM_INIT_DB, COM_RESET_CONNECTION, ...
	respGeneric respKind = iota
	// respPrepare: the COM_STMT_PREPARE OK with its parameter and column
	// definitions, or ERR.
	respPrepare
	// respFieldList: column definitions ended by EOF, or ERR.
	respFieldList
	// respSingle: exactly one packet of any shape (COM_STATISTICS's
	// string, COM_SET_OPTION's EOF or ERR).
	respSingle
	// respFetch: binary rows ended by EOF, or ERR (COM_STMT_FETCH).
	respFetch
)

// respEvent is what the state machine says after a packet.
type respEvent uint8

const (
	// evMore: the response continues with another backend packet.
	evMore respEvent = iota
	// evDone: that packet was the response's last.
	evDone
	// evInfile: the backend asks for a LOCAL INFILE; the client's file
	// packets follow, then the backend's packets resume.
	evInfile
	// evProgress: a progress report; the response goes on, and the
	// report is for the client now, not at the response's end.
	evProgress
)

type respState uint8

const (
	stFirst      respState = iota // OK / ERR / INFILE / column count
	stColumns                     // column definitions
	stColumnEOF                   // EOF after the column definitions
	stRows                        // rows until EOF or ERR
	stPrepOK                      // COM_STMT_PREPARE's OK
	stPrepParams                  // its parameter definitions
	stPrepParamEOF
	stPrepColumns
	stPrepColumnEOF
	stFieldList
	stSingle
	stFetch
)

// respFlags are the negotiated capabilities that change a response's shape.
type respFlags uint8

const (
	// rfDeprecateEOF: no EOF after column definitions; a result set ends
	// with an OK packet whose header is 0xfe (CLIENT_DEPRECATE_EOF).
	rfDeprecateEOF respFlags = 1 << iota
	// rfCacheMetadata: a result set's column count is followed by a byte,
	// 0 when the column definitions are left out (MariaDB's CACHE_METADATA).
	rfCacheMetadata
	// rfProgress: ERR packets with code 0xffff are progress reports, not
	// the end of the response (MariaDB's PROGRESS).
	rfProgress
)

// respFlagsFor returns the response flags of a session's capabilities.
func respFlagsFor(caps, maria uint32) respFlags {
	var f respFlags
	if caps&mysql.CLIENT_DEPRECATE_EOF != 0 {
		f |= rfDeprecateEOF
	}
	if maria&mariaCacheMetadata != 0 {
		f |= rfCacheMetadata
	}
	if maria&mariaProgress != 0 {
		f |= rfProgress
	}
	return f
}

// isProgress tells a MariaDB progress report (ERR header, code 0xffff,
// then stage, maximum stage, progress and the stage's name) from an ERR.
func isProgress(p []byte) bool {
	return len(p) >= 3 && p[0] == mysql.ERR_HEADER && p[1] == byte(progressCode&0xff) && p[2] == byte(progressCode>>8)
}

// respMachine follows a response's shape packet by packet without decoding
// rows, so that the relay knows where the response ends. Its zero value is
// not ready: call reset for each command.
type respMachine struct {
	deprecateEOF bool
	flags        respFlags
	binary       bool // result-set rows use the binary protocol (COM_STMT_EXECUTE)

	state   respState
	pending uint64 // definitions left in the current block
	cols    uint16 // prepare: columns still to come after parameters

	// Facts gathered along the way.
	Status    uint16 // last status flags seen in an OK or EOF
	HasStatus bool
	Affected  uint64
	// Warnings is the warning count of the last OK or EOF seen.
	Warnings uint16
	ErrCode  uint16
	StmtID   uint32 // prepare: statement id from the PREPARE OK
	Prepared bool   // prepare: an OK was received
}

// reset prepares the machine for the response to one command.
func (m *respMachine) reset(kind respKind, flags respFlags, binary bool) {
	*m = respMachine{deprecateEOF: flags&rfDeprecateEOF != 0, flags: flags, binary: binary}
	switch kind {
	case respPrepare:
		m.state = stPrepOK
	case respFieldList:
		m.state = stFieldList
	case respSingle:
		m.state = stSingle
	case respFetch:
		m.state = stFetch
	default:
		m.state = stFirst
	}
}

// isEOFPacket tells an EOF (or DEPRECATE_EOF's OK with an 0xfe header)
// from a row or definition that happens to start with 0xfe: the latter is
// at least 16 MiB - 1 bytes long.
func isEOFPacket(p []byte, n int) bool {
	return len(p) > 0 && p[0] == mysql.EOF_HEADER && n < mysql.MaxPayloadLen
}

// feed consumes the start of one logical packet (p holds at least its
// first 64 bytes or all of it) whose full payload length is n.
func (m *respMachine) feed(p []byte, n int) (respEvent, error) {
	if len(p) == 0 {
		if m.state == stSingle {
			return evDone, nil
		}
		return evDone, fmt.Errorf("%w: empty response packet", ErrMalformedPacket)
	}
	// No definition or row starts with 0xff (not a valid length-encoded
	// value, and binary rows start with 0x00), so 0xff is always an ERR,
	// or a progress report while the statement runs.
	if p[0] == mysql.ERR_HEADER && m.state != stSingle {
		if m.flags&rfProgress != 0 && isProgress(p) {
			return evProgress, nil
		}
		m.parseErr(p)
		return evDone, nil
	}
	switch m.state {
	case stFirst:
		switch p[0] {
		case mysql.OK_HEADER:
			if err := m.parseOK(p); err != nil {
				return evDone, err
			}
			return m.afterEnd(), nil
		case mysql.LocalInFile_HEADER:
			return evInfile, nil // the OK/ERR after the file comes in stFirst
		}
		cnt, k, ok := lenenc(p)
		if !ok || cnt == 0 {
			return evDone, fmt.Errorf("%w: bad column count", ErrMalformedPacket)
		}
		if m.flags&rfCacheMetadata != 0 && len(p) > k && p[k] == 0 {
			// The client has the definitions from the PREPARE: none follow.
			m.endColumns()
			return evMore, nil
		}
		m.pending = cnt
		m.state = stColumns
		return evMore, nil
	case stColumns:
		m.pending--
		if m.pending == 0 {
			m.endColumns()
		}
		return evMore, nil
	case stColumnEOF:
		if !isEOFPacket(p, n) {
			return evDone, fmt.Errorf("%w: expected EOF after column definitions", ErrMalformedPacket)
		}
		m.parseEOF(p)
		if m.binary && m.Status&mysql.SERVER_STATUS_CURSOR_EXISTS != 0 && m.Status&mysql.SERVER_MORE_RESULTS_EXISTS == 0 {
			// A cursor was opened: rows come later through COM_STMT_FETCH.
			// Not so in a CALL's result set (MORE_RESULTS): MariaDB leaks
			// the CURSOR_EXISTS flag of a cursor the procedure opened, and
			// the rows follow.
			return evDone, nil
		}
		m.state = stRows
		return evMore, nil
	case stRows, stFetch:
		if isEOFPacket(p, n) {
			if err := m.parseEnd(p, n); err != nil {
				return evDone, err
			}
			if m.state == stFetch {
				return evDone, nil
			}
			return m.afterEnd(), nil
		}
		return evMore, nil
	case stPrepOK:
		return m.prepareOK(p)
	case stPrepParams:
		m.pending--
		if m.pending == 0 {
			return m.endPrepParams(), nil
		}
		return evMore, nil
	case stPrepParamEOF:
		if !isEOFPacket(p, n) {
			return evDone, fmt.Errorf("%w: expected EOF after parameter definitions", ErrMalformedPacket)
		}
		m.parseEOF(p)
		return m.startPrepColumns(), nil
	case stPrepColumns:
		m.pending--
		if m.pending == 0 {
			if m.deprecateEOF {
				return evDone, nil
			}
			m.state = stPrepColumnEOF
		}
		return evMore, nil
	case stPrepColumnEOF:
		if !isEOFPacket(p, n) {
			return evDone, fmt.Errorf("%w: expected EOF after column definitions", ErrMalformedPacket)
		}
		m.parseEOF(p)
		return evDone, nil
	case stFieldList:
		if isEOFPacket(p, n) {
			return evDone, m.parseEnd(p, n)
		}
		return evMore, nil
	case stSingle:
		switch {
		case p[0] == mysql.ERR_HEADER:
			m.parseErr(p)
		case p[0] == mysql.OK_HEADER && n >= 7:
			_ = m.parseOK(p)
		case isEOFPacket(p, n):
			m.parseEOF(p)
		}
		return evDone, nil
	}
	return evDone, fmt.Errorf("%w: bad response state %d", ErrMalformedPacket, m.state)
}

// endColumns follows the last column definition (or their absence):
// the EOF that carries the status flags, or with DEPRECATE_EOF the rows.
// With DEPRECATE_EOF a COM_STMT_EXECUTE that opened a cursor sends no row:
// the result set's terminator, CURSOR_EXISTS in its status, comes next and
// ends the response as an empty result set's would.
func (m *respMachine) endColumns() {
	if m.deprecateEOF {
		m.state = stRows
	} else {
		m.state = stColumnEOF
	}
}

// parseEnd reads the status of the packet that ends rows or definitions:
// an EOF, or with DEPRECATE_EOF an OK with the 0xfe header (a 5-byte
// packet is an EOF even then).
func (m *respMachine) parseEnd(p []byte, n int) error {
	if m.deprecateEOF && n >= 7 {
		return m.parseOK(p)
	}
	m.parseEOF(p)
	return nil
}

// afterEnd decides, after a final OK or EOF, whether another result follows.
func (m *respMachine) afterEnd() respEvent {
	if m.Status&mysql.SERVER_MORE_RESULTS_EXISTS != 0 {
		m.state = stFirst
		return evMore
	}
	return evDone
}

func (m *respMachine) prepareOK(p []byte) (respEvent, error) {
	if p[0] != mysql.OK_HEADER || len(p) < 12 {
		return evDone, fmt.Errorf("%w: bad PREPARE OK", ErrMalformedPacket)
	}
	m.Prepared = true
	m.StmtID = uint32(p[1]) | uint32(p[2])<<8 | uint32(p[3])<<16 | uint32(p[4])<<24
	m.cols = uint16(p[5]) | uint16(p[6])<<8
	params := uint16(p[7]) | uint16(p[8])<<8
	if params == 0 {
		return m.startPrepColumns(), nil
	}
	m.pending = uint64(params)
	m.state = stPrepParams
	return evMore, nil
}

// endPrepParams follows the last parameter definition: their EOF, or
// with DEPRECATE_EOF the column definitions, if any.
func (m *respMachine) endPrepParams() respEvent {
	if m.deprecateEOF {
		return m.startPrepColumns()
	}
	m.state = stPrepParamEOF
	return evMore
}

func (m *respMachine) startPrepColumns() respEvent {
	if m.cols == 0 {
		m.state = stPrepColumnEOF // unused: the response is over
		return evDone
	}
	m.pending = uint64(m.cols)
	m.state = stPrepColumns
	return evMore
}

func (m *respMachine) parseErr(p []byte) {
	if len(p) >= 3 {
		m.ErrCode = uint16(p[1]) | uint16(p[2])<<8
	} else {
		m.ErrCode = 0xffff
	}
}

// parseOK reads affected rows and status from an OK packet (header 0x00,
// or 0xfe for DEPRECATE_EOF's end of result set).
func (m *respMachine) parseOK(p []byte) error {
	b := p[1:]
	aff, k, ok := lenenc(b)
	if !ok {
		return fmt.Errorf("%w: bad OK packet", ErrMalformedPacket)
	}
	b = b[k:]
	_, k, ok = lenenc(b)
	if !ok || len(b) < k+2 {
		return fmt.Errorf("%w: bad OK packet", ErrMalformedPacket)
	}
	b = b[k:]
	m.Affected += aff
	m.Status = uint16(b[0]) | uint16(b[1])<<8
	m.HasStatus = true
	m.Warnings = 0
	if len(b) >= 4 {
		m.Warnings = uint16(b[2]) | uint16(b[3])<<8
	}
	return nil
}

// parseEOF reads the status flags of an EOF packet (0xfe, warnings, status).
func (m *respMachine) parseEOF(p []byte) {
	if len(p) >= 5 {
		m.Warnings = uint16(p[1]) | uint16(p[2])<<8
		m.Status = uint16(p[3]) | uint16(p[4])<<8
		m.HasStatus = true
	}
}
