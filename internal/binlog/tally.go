package binlog

import (
	"bytes"
	"strconv"
	"sync"

	"github.com/go-mysql-org/go-mysql/replication"
)

// Txn is one transaction as the binary log showed it: how it is named and
// how many bytes it wrote to tables.
type Txn struct {
	// GTID is the transaction's MariaDB GTID (domain-server-sequence), ""
	// on MySQL.
	GTID string
	// Thread is the id of the connection that ran it, from its BEGIN (or
	// DDL) Query event; 0 when the log does not say (MariaDB DML).
	Thread uint32
	// Bytes is what it wrote to tables (see rowBytes).
	Bytes int64
}

// tally turns a stream of binary-log events into transactions. It keeps
// only the running sums of the transaction being read, so a transaction of
// any size costs the same few words. Not safe for concurrent use: the
// reader's one event goroutine owns it.
type tally struct {
	cur  Txn
	open bool
	// begun: the transaction opened with a BEGIN (MySQL) or a MariaDB
	// GTID event without the standalone flag, so it ends at its XID or
	// COMMIT; otherwise (DDL) it ends with its one Query event.
	begun bool
	// undecoded holds the row-data length of rows events whose rows
	// go-mysql could not decode (see decodeRows), by event.
	undecoded *sync.Map
}

func newTally() *tally { return &tally{undecoded: &sync.Map{}} }

// reset drops a transaction read in part (the connection broke).
func (t *tally) reset() { t.cur, t.open, t.begun = Txn{}, false, false }

// event feeds one event; it returns the transaction the event completed.
func (t *tally) event(ev *replication.BinlogEvent) (Txn, bool) {
	switch e := ev.Event.(type) {
	case *replication.MariadbGTIDEvent:
		t.cur = Txn{GTID: e.GTID.String()}
		t.open, t.begun = true, !e.IsStandalone()
	case *replication.GTIDEvent:
		// MySQL (ANONYMOUS_GTID_EVENT too): the thread comes with BEGIN.
		t.cur, t.open, t.begun = Txn{}, true, false
	case *replication.QueryEvent:
		return t.query(e)
	case *replication.RowsEvent:
		if n := t.rowBytes(ev.Header.EventType, e); t.open {
			t.cur.Bytes += n
		}
	case *replication.XIDEvent:
		return t.end()
	case *replication.TransactionPayloadEvent:
		// MySQL's compressed transaction: its events, decoded.
		var done Txn
		var ok bool
		for _, in := range e.Events {
			if d, k := t.event(in); k {
				done, ok = d, k
			}
		}
		return done, ok
	default:
		if ev.Header != nil && ev.Header.EventType == replication.XA_PREPARE_LOG_EVENT {
			return t.end() // XA PREPARE ends the group that wrote the rows
		}
	}
	return Txn{}, false
}

// query handles a Query event: BEGIN (or XA START) opens a transaction
// (and names its thread), COMMIT and XA COMMIT/ROLLBACK end one, any other statement is
// DDL (or statement-based DML) that is a transaction of its own unless a
// BEGIN came first.
func (t *tally) query(e *replication.QueryEvent) (Txn, bool) {
	q := bytes.TrimSpace(e.Query)
	switch {
	case bytes.EqualFold(q, []byte("BEGIN")), hasFoldPrefix(q, "XA START"), hasFoldPrefix(q, "XA BEGIN"):
		if !t.open {
			t.cur = Txn{}
		}
		t.open, t.begun, t.cur.Thread = true, true, e.SlaveProxyID
		return Txn{}, false
	case bytes.EqualFold(q, []byte("COMMIT")), hasFoldPrefix(q, "XA COMMIT"), hasFoldPrefix(q, "XA ROLLBACK"):
		if t.cur.Thread == 0 {
			t.cur.Thread = e.SlaveProxyID
		}
		return t.end()
	}
	if !t.open {
		t.cur, t.open = Txn{}, true
	}
	if t.cur.Thread == 0 {
		t.cur.Thread = e.SlaveProxyID
	}
	if !t.begun {
		return t.end()
	}
	return Txn{}, false
}

func (t *tally) end() (Txn, bool) {
	if !t.open {
		return Txn{}, false
	}
	done := t.cur
	t.reset()
	return done, true
}

func hasFoldPrefix(q []byte, p string) bool {
	return len(q) >= len(p) && bytes.EqualFold(q[:len(p)], []byte(p))
}

// rowBytes is what a rows event wrote to tables: the values of the rows
// an insert wrote and of the after images of the rows an update changed;
// a delete writes no row data and counts nothing. A value counts its
// length when it is a string, a blob or JSON, else its binary size (1, 2,
// 4 or 8 bytes; 8 for decimals and temporal types). Rows go-mysql could
// not decode count their row data as the event carries it: all of it for
// an insert, half of it (the after images' share with full row images)
// for an update.
func (t *tally) rowBytes(typ replication.EventType, e *replication.RowsEvent) int64 {
	var update bool
	switch typ {
	case replication.WRITE_ROWS_EVENTv0, replication.WRITE_ROWS_EVENTv1, replication.WRITE_ROWS_EVENTv2,
		replication.MARIADB_WRITE_ROWS_COMPRESSED_EVENT_V1:
	case replication.UPDATE_ROWS_EVENTv0, replication.UPDATE_ROWS_EVENTv1, replication.UPDATE_ROWS_EVENTv2,
		replication.MARIADB_UPDATE_ROWS_COMPRESSED_EVENT_V1, replication.PARTIAL_UPDATE_ROWS_EVENT:
		update = true
	default:
		t.undecoded.Delete(e)
		return 0
	}
	if v, ok := t.undecoded.LoadAndDelete(e); ok {
		n := v.(int64)
		if update {
			n /= 2
		}
		return n
	}
	var n int64
	for i, row := range e.Rows {
		if update && i%2 == 0 {
			continue // the before image
		}
		for _, v := range row {
			n += valueBytes(v)
		}
	}
	return n
}

// valueBytes is the size of one decoded column value (see rowBytes).
func valueBytes(v any) int64 {
	switch x := v.(type) {
	case nil:
		return 0
	case string:
		return int64(len(x))
	case []byte:
		return int64(len(x))
	case *replication.JsonDiff:
		return int64(len(x.Value))
	case int8, uint8:
		return 1
	case int16, uint16:
		return 2
	case int32, uint32, float32:
		return 4
	}
	return 8
}

// decodeRows decodes a rows event as go-mysql would, but never fails on
// its rows: when they cannot be decoded (a column type go-mysql does not
// know) the event is counted by its row-data length instead (rowBytes),
// so one odd event neither stops the reader nor loops it on reconnect.
// An event whose table map is unknown is an error, as in go-mysql.
func (t *tally) decodeRows(e *replication.RowsEvent, data []byte) error {
	pos, err := e.DecodeHeader(data)
	if err != nil {
		return err
	}
	if err := e.DecodeData(pos, data); err != nil {
		e.Rows = nil
		t.undecoded.Store(e, int64(len(data)-pos))
	}
	return nil
}

// key names a completed transaction for a claim: its GTID on MariaDB,
// its thread on MySQL.
func (x Txn) key() string {
	if x.GTID != "" {
		return x.GTID
	}
	if x.Thread != 0 {
		return threadKey(x.Thread)
	}
	return ""
}

// threadKey is the claim key of the transactions of a connection (MySQL).
func threadKey(id uint32) string { return "t" + strconv.FormatUint(uint64(id), 10) }
