package mysqlproto

import (
	"bytes"
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"
)

func TestReplyPackets(t *testing.T) {
	rows := &Reply{Columns: []string{"a", "b"}, Rows: [][]*string{{str("1"), nil}, {str(""), str("xyz")}}}
	tests := []struct {
		name      string
		caps      uint32
		reply     *Reply
		cmd       byte
		kind      respKind
		packets   int
		errCode   uint16
		last      []byte // prefix of the last packet
		affected  uint64
		deprecate bool
		maria     uint32    // MariaDB's extended capabilities
		flags     respFlags // the state machine's, beyond DEPRECATE_EOF
		first     []byte    // the first packet, when checked
		column    []byte    // the first column definition, when checked
	}{
		{name: "ERR", reply: &Reply{Err: &Error{Code: 8252, Message: "quota"}}, cmd: mysql.COM_QUERY, packets: 1, errCode: 8252,
			last: []byte{0xff, 0x3c, 0x20, '#', 'H', 'Y', '0', '0', '0', 'q'}},
		{name: "OK", reply: &Reply{AffectedRows: 300, Info: "hi"}, cmd: mysql.COM_QUERY, packets: 1, affected: 300,
			last: []byte{0, 0xfc, 0x2c, 0x01, 0, 2, 0, 0, 0, 'h', 'i'}},
		{name: "OK with session track", caps: mysql.CLIENT_SESSION_TRACK, reply: &Reply{Info: "hi"}, cmd: mysql.COM_QUERY, packets: 1,
			last: []byte{0, 0, 0, 2, 0, 0, 0, 2, 'h', 'i'}},
		{name: "result set", reply: rows, cmd: mysql.COM_QUERY, packets: 1 + 2 + 1 + 2 + 1, last: []byte{0xfe, 0, 0, 2, 0}},
		{name: "result set, DEPRECATE_EOF", caps: mysql.CLIENT_DEPRECATE_EOF, deprecate: true, reply: rows, cmd: mysql.COM_QUERY,
			packets: 1 + 2 + 2 + 1, last: []byte{0xfe, 0, 0, 2, 0, 0, 0}},
		{name: "result set, CACHE_METADATA and EXTENDED_TYPE_INFO", maria: mariaCacheMetadata | mariaExtendedTypeInfo,
			flags: rfCacheMetadata, reply: rows, cmd: mysql.COM_QUERY, packets: 1 + 2 + 1 + 2 + 1, first: []byte{2, 1},
			column: []byte{3, 'd', 'e', 'f', 0, 0, 0, 1, 'a', 1, 'a', 0, 0x0c}},
		{name: "result set, CACHE_METADATA only", maria: mariaCacheMetadata, flags: rfCacheMetadata, reply: rows,
			cmd: mysql.COM_QUERY, packets: 1 + 2 + 1 + 2 + 1, first: []byte{2, 1}, column: []byte{3, 'd', 'e', 'f', 0, 0, 0, 1, 'a', 1, 'a', 0x0c}},
		{name: "result set for EXECUTE", reply: rows, cmd: mysql.COM_STMT_EXECUTE, packets: 1, errCode: mysql.ER_NOT_SUPPORTED_YET},
		{name: "OK for PREPARE", reply: &Reply{}, cmd: mysql.COM_STMT_PREPARE, packets: 1, errCode: mysql.ER_NOT_SUPPORTED_YET},
		{name: "OK for PING", reply: &Reply{}, cmd: mysql.COM_PING, packets: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := replyWriter{caps: tt.caps, maria: tt.maria, status: mysql.SERVER_STATUS_AUTOCOMMIT | mysql.SERVER_MORE_RESULTS_EXISTS}
			var got [][]byte
			err := w.packets(tt.reply, tt.cmd, func(p []byte) error {
				got = append(got, bytes.Clone(p))
				return nil
			})
			if err != nil || len(got) != tt.packets {
				t.Fatalf("%d packets, err %v: %q", len(got), err, got)
			}
			if tt.first != nil && !bytes.Equal(got[0], tt.first) {
				t.Errorf("first packet %x, want %x", got[0], tt.first)
			}
			if tt.column != nil && (!bytes.HasPrefix(got[1], tt.column) || columnName(got[1]) != "a") {
				t.Errorf("column definition %x, want prefix %x", got[1], tt.column)
			}
			if tt.last != nil && !bytes.HasPrefix(got[len(got)-1], tt.last) {
				t.Errorf("last packet %x, want prefix %x", got[len(got)-1], tt.last)
			}
			// The state machine the relay uses agrees on where it ends.
			var m respMachine
			m.reset(tt.kind, depFlag(tt.deprecate)|tt.flags, false)
			for i, p := range got {
				ev, err := m.feed(p, len(p))
				if err != nil {
					t.Fatalf("packet %d: %v", i, err)
				}
				if (ev == evDone) != (i == len(got)-1) {
					t.Fatalf("packet %d: event %d", i, ev)
				}
			}
			if m.ErrCode != tt.errCode || m.Affected != tt.affected {
				t.Errorf("err %d affected %d", m.ErrCode, m.Affected)
			}
			if tt.errCode == 0 && m.Status&mysql.SERVER_MORE_RESULTS_EXISTS != 0 {
				t.Error("a local reply claims more results")
			}
		})
	}
}

func TestTextRowAndColumnName(t *testing.T) {
	row, err := textRow([]byte{1, 'a', 0xfb, 0}, 3)
	if err != nil || *row[0] != "a" || row[1] != nil || *row[2] != "" {
		t.Fatalf("%v %v", row, err)
	}
	if _, err := textRow([]byte{5, 'a'}, 1); err == nil {
		t.Error("truncated row accepted")
	}
	if n := columnName(colPkt("price")); n != "price" {
		t.Errorf("column name %q", n)
	}
}
