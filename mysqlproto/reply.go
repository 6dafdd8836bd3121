package mysqlproto

import (
	"fmt"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// appendErr appends an ERR packet payload.
func appendErr(b []byte, e *Error) []byte {
	state := e.State
	if len(state) != 5 {
		state = "HY000"
	}
	b = append(b, mysql.ERR_HEADER, byte(e.Code), byte(e.Code>>8), '#')
	b = append(b, state...)
	return append(b, e.Message...)
}

// appendOK appends an OK packet payload (header is 0x00, or 0xfe for the
// end of a result set under DEPRECATE_EOF).
func appendOK(b []byte, header byte, affected uint64, status uint16, info string, caps uint32) []byte {
	b = append(b, header)
	b = appendLenenc(b, affected)
	b = appendLenenc(b, 0) // last insert id
	b = append(b, byte(status), byte(status>>8), 0, 0)
	if caps&mysql.CLIENT_SESSION_TRACK != 0 {
		if info != "" {
			b = appendLenencString(b, info)
		}
		return b
	}
	return append(b, info...)
}

// appendEOF appends an EOF packet payload.
func appendEOF(b []byte, status uint16) []byte {
	return append(b, mysql.EOF_HEADER, 0, 0, byte(status), byte(status>>8))
}

// appendColumnDef appends a text column definition (protocol 4.1) for a
// VARCHAR column in utf8mb4; with MariaDB's EXTENDED_TYPE_INFO (maria) it
// carries an empty block of extended type information.
func appendColumnDef(b []byte, name string, maria uint32) []byte {
	b = appendLenencString(b, "def")
	b = appendLenencString(b, "") // schema
	b = appendLenencString(b, "") // table
	b = appendLenencString(b, "") // original table
	b = appendLenencString(b, name)
	b = appendLenencString(b, name)
	if maria&mariaExtendedTypeInfo != 0 {
		b = append(b, 0) // no data type name, no format
	}
	b = append(b, 0x0c,
		45, 0, // utf8mb4_general_ci
		0, 0, 1, 0, // column length 65536
		0xfd, // MYSQL_TYPE_VAR_STRING
		0, 0, // flags
		0x1f, // decimals: not a fixed-point value
		0, 0) // filler
	return b
}

// replyWriter writes locally made responses with correct sequence ids.
type replyWriter struct {
	caps   uint32
	maria  uint32 // MariaDB's extended capabilities
	status uint16
	buf    []byte
}

// okAnswers reports whether an OK packet is a valid answer to cmd; the
// others expect a PREPARE OK, rows, a string or an EOF.
func okAnswers(cmd byte) bool {
	switch cmd {
	case mysql.COM_STMT_PREPARE, mysql.COM_STMT_FETCH, mysql.COM_FIELD_LIST, mysql.COM_STATISTICS, mysql.COM_SET_OPTION, mysql.COM_DEBUG:
		return false
	}
	return true
}

// packets emits the payloads of a reply in order. Only an ERR answers
// every command: a result set answers only COM_QUERY (the one command
// whose response may be a text result set), an OK only the commands whose
// response may be an OK; anything else becomes ERR 1235.
func (w *replyWriter) packets(r *Reply, cmd byte, emit func(p []byte) error) error {
	status := w.status &^ mysql.SERVER_MORE_RESULTS_EXISTS
	switch {
	case r.Err != nil:
		return emit(appendErr(w.buf[:0], r.Err))
	case r.Columns == nil && okAnswers(cmd), r.Columns != nil && cmd == mysql.COM_QUERY:
	default:
		return emit(appendErr(w.buf[:0], &Error{Code: mysql.ER_NOT_SUPPORTED_YET, State: "HY000",
			Message: fmt.Sprintf("rgproxy: the policy's reply cannot answer command 0x%02x", cmd)}))
	}
	if r.Columns == nil {
		b := appendOK(w.buf[:0], mysql.OK_HEADER, r.AffectedRows, status, r.Info, w.caps)
		if r.Warnings > 0 {
			// The warning count follows the header, the affected rows, the
			// last insert id (0: one byte) and the status flags.
			i := 1 + len(appendLenenc(nil, r.AffectedRows)) + 1 + 2
			b[i], b[i+1] = byte(r.Warnings), byte(r.Warnings>>8)
		}
		return emit(b)
	}
	count := appendLenenc(w.buf[:0], uint64(len(r.Columns)))
	if w.maria&mariaCacheMetadata != 0 {
		count = append(count, 1) // the definitions follow
	}
	if err := emit(count); err != nil {
		return err
	}
	for _, c := range r.Columns {
		if err := emit(appendColumnDef(w.buf[:0], c, w.maria)); err != nil {
			return err
		}
	}
	deprecate := w.caps&mysql.CLIENT_DEPRECATE_EOF != 0
	if !deprecate {
		if err := emit(appendEOF(w.buf[:0], status)); err != nil {
			return err
		}
	}
	for _, row := range r.Rows {
		b := w.buf[:0]
		for i := range r.Columns {
			if i >= len(row) || row[i] == nil {
				b = append(b, 0xfb)
			} else {
				b = appendLenencString(b, *row[i])
			}
		}
		if err := emit(b); err != nil {
			return err
		}
	}
	if deprecate {
		return emit(appendOK(w.buf[:0], mysql.EOF_HEADER, 0, status, "", w.caps))
	}
	return emit(appendEOF(w.buf[:0], status))
}
