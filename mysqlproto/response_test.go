package mysqlproto

import (
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// Packet builders for synthetic responses.
func okPkt(affected uint64, status uint16) []byte {
	return appendOK(nil, mysql.OK_HEADER, affected, status, "", 0)
}
func eofPkt(status uint16) []byte { return appendEOF(nil, status) }
func errPkt(code uint16) []byte {
	return appendErr(nil, &Error{Code: code, State: "42S02", Message: "no"})
}
func colPkt(name string) []byte { return appendColumnDef(nil, name, 0) }
func countPkt(n uint64) []byte  { return appendLenenc(nil, n) }
func rowPkt(vals ...string) []byte {
	var b []byte
	for _, v := range vals {
		b = appendLenencString(b, v)
	}
	return b
}

// cachedCount is a column count with CACHE_METADATA's metadata-follows byte.
func cachedCount(n uint64, follows bool) []byte {
	b := appendLenenc(nil, n)
	if follows {
		return append(b, 1)
	}
	return append(b, 0)
}

// progressPkt is a MariaDB progress report.
func progressPkt(stage, maxStage byte, info string) []byte {
	b := []byte{mysql.ERR_HEADER, 0xff, 0xff, 1, stage, maxStage, 0x10, 0x27, 0}
	return appendLenencString(b, info)
}

// depFlag is rfDeprecateEOF when deprecate is true.
func depFlag(deprecate bool) respFlags {
	if deprecate {
		return rfDeprecateEOF
	}
	return 0
}

func deprecEnd(status uint16) []byte { return appendOK(nil, mysql.EOF_HEADER, 0, status, "", 0) }
func prepOK(id uint32, cols, params uint16) []byte {
	return []byte{0, byte(id), byte(id >> 8), byte(id >> 16), byte(id >> 24), byte(cols), byte(cols >> 8), byte(params), byte(params >> 8), 0, 0, 0}
}

func TestResponseStateMachine(t *testing.T) {
	type step struct {
		p    []byte
		want respEvent
	}
	M, D, I, P := evMore, evDone, evInfile, evProgress
	tests := []struct {
		name      string
		kind      respKind
		deprecate bool
		flags     respFlags
		binary    bool
		steps     []step
		status    uint16
		affected  uint64
		errCode   uint16
	}{
		{name: "OK", steps: []step{{okPkt(3, mysql.SERVER_STATUS_AUTOCOMMIT), D}}, status: mysql.SERVER_STATUS_AUTOCOMMIT, affected: 3},
		{name: "ERR", steps: []step{{errPkt(1146), D}}, errCode: 1146},
		{name: "result set", steps: []step{{countPkt(2), M}, {colPkt("a"), M}, {colPkt("b"), M}, {eofPkt(0), M},
			{rowPkt("1", "2"), M}, {rowPkt("3", "4"), M}, {eofPkt(mysql.SERVER_STATUS_IN_TRANS), D}}, status: mysql.SERVER_STATUS_IN_TRANS},
		{name: "result set with DEPRECATE_EOF", deprecate: true, steps: []step{{countPkt(1), M}, {colPkt("a"), M},
			{rowPkt("1"), M}, {deprecEnd(mysql.SERVER_STATUS_IN_TRANS | mysql.SERVER_STATUS_AUTOCOMMIT), D}}, status: mysql.SERVER_STATUS_IN_TRANS | mysql.SERVER_STATUS_AUTOCOMMIT},
		{name: "error after rows", steps: []step{{countPkt(1), M}, {colPkt("a"), M}, {eofPkt(0), M},
			{rowPkt("1"), M}, {errPkt(1317), D}}, errCode: 1317},
		{name: "multi results", steps: []step{{okPkt(1, mysql.SERVER_MORE_RESULTS_EXISTS), M}, {countPkt(1), M}, {colPkt("a"), M},
			{eofPkt(mysql.SERVER_MORE_RESULTS_EXISTS), M}, {rowPkt("x"), M}, {eofPkt(mysql.SERVER_MORE_RESULTS_EXISTS), M}, {okPkt(2, 0), D}}, affected: 3},
		{name: "CALL with DEPRECATE_EOF", deprecate: true, steps: []step{{countPkt(1), M}, {colPkt("a"), M}, {rowPkt("1"), M},
			{deprecEnd(mysql.SERVER_MORE_RESULTS_EXISTS), M}, {okPkt(0, mysql.SERVER_STATUS_AUTOCOMMIT), D}}, status: mysql.SERVER_STATUS_AUTOCOMMIT},
		{name: "execute opens cursor", binary: true, steps: []step{{countPkt(1), M}, {colPkt("a"), M},
			{eofPkt(mysql.SERVER_STATUS_CURSOR_EXISTS), D}}, status: mysql.SERVER_STATUS_CURSOR_EXISTS},
		{name: "CALL result set with a leaked cursor flag", binary: true, steps: []step{{countPkt(1), M}, {colPkt("a"), M},
			{eofPkt(mysql.SERVER_STATUS_CURSOR_EXISTS | mysql.SERVER_MORE_RESULTS_EXISTS), M}, {[]byte{0, 0, 2}, M},
			{eofPkt(mysql.SERVER_STATUS_CURSOR_EXISTS | mysql.SERVER_MORE_RESULTS_EXISTS), M}, {okPkt(0, 0), D}}},
		{name: "execute binary rows", binary: true, steps: []step{{countPkt(1), M}, {colPkt("a"), M},
			{eofPkt(0), M}, {[]byte{0, 0, 1}, M}, {eofPkt(0), D}}},
		{name: "text rows ignore cursor flag", steps: []step{{countPkt(1), M}, {colPkt("a"), M},
			{eofPkt(mysql.SERVER_STATUS_CURSOR_EXISTS), M}, {eofPkt(0), D}}},
		{name: "fetch", kind: respFetch, binary: true, steps: []step{{[]byte{0, 0, 1}, M}, {[]byte{0, 0, 2}, M},
			{eofPkt(mysql.SERVER_STATUS_CURSOR_EXISTS | 0x80), D}}, status: mysql.SERVER_STATUS_CURSOR_EXISTS | 0x80},
		{name: "fetch error", kind: respFetch, steps: []step{{errPkt(1421), D}}, errCode: 1421},
		{name: "LOCAL INFILE", steps: []step{{append([]byte{mysql.LocalInFile_HEADER}, "f.csv"...), I}, {okPkt(5, 0), D}}, affected: 5},
		{name: "field list", kind: respFieldList, steps: []step{{colPkt("a"), M}, {colPkt("b"), M}, {eofPkt(2), D}}, status: 2},
		{name: "statistics", kind: respSingle, steps: []step{{[]byte("Uptime: 5  Threads: 1"), D}}},
		{name: "set option", kind: respSingle, steps: []step{{eofPkt(mysql.SERVER_STATUS_AUTOCOMMIT), D}}, status: mysql.SERVER_STATUS_AUTOCOMMIT},
		{name: "prepare", kind: respPrepare, steps: []step{{prepOK(7, 2, 1), M}, {colPkt("?"), M}, {eofPkt(0), M},
			{colPkt("a"), M}, {colPkt("b"), M}, {eofPkt(0), D}}},
		{name: "prepare without params", kind: respPrepare, steps: []step{{prepOK(7, 1, 0), M}, {colPkt("a"), M}, {eofPkt(0), D}}},
		{name: "prepare without columns", kind: respPrepare, steps: []step{{prepOK(7, 0, 2), M}, {colPkt("?"), M}, {colPkt("?"), M}, {eofPkt(0), D}}},
		{name: "prepare nothing", kind: respPrepare, steps: []step{{prepOK(7, 0, 0), D}}},
		{name: "prepare DEPRECATE_EOF", kind: respPrepare, deprecate: true, steps: []step{{prepOK(7, 1, 1), M}, {colPkt("?"), M}, {colPkt("a"), D}}},
		{name: "prepare DEPRECATE_EOF without columns", kind: respPrepare, deprecate: true, steps: []step{{prepOK(7, 0, 2), M},
			{colPkt("?"), M}, {colPkt("?"), D}}},
		{name: "prepare error", kind: respPrepare, steps: []step{{errPkt(1064), D}}, errCode: 1064},
		// MariaDB's CACHE_METADATA: a byte after the column count says
		// whether definitions follow.
		{name: "cached metadata, definitions follow", flags: rfCacheMetadata, binary: true, steps: []step{{cachedCount(2, true), M},
			{colPkt("a"), M}, {colPkt("b"), M}, {eofPkt(0), M}, {[]byte{0, 0, 1, 2}, M}, {eofPkt(2), D}}, status: 2},
		{name: "cached metadata, none follow", flags: rfCacheMetadata, binary: true, steps: []step{{cachedCount(2, false), M},
			{eofPkt(0), M}, {[]byte{0, 0, 1, 2}, M}, {eofPkt(2), D}}, status: 2},
		{name: "cached metadata, cursor opened", flags: rfCacheMetadata, binary: true, steps: []step{{cachedCount(2, false), M},
			{eofPkt(mysql.SERVER_STATUS_CURSOR_EXISTS), D}}, status: mysql.SERVER_STATUS_CURSOR_EXISTS},
		{name: "cached metadata with DEPRECATE_EOF, none follow", deprecate: true, flags: rfCacheMetadata, binary: true,
			steps: []step{{cachedCount(2, false), M}, {[]byte{0, 0, 1, 2}, M}, {deprecEnd(2), D}}, status: 2},
		{name: "cached metadata, text result set", flags: rfCacheMetadata, steps: []step{{cachedCount(1, true), M},
			{colPkt("a"), M}, {eofPkt(0), M}, {rowPkt("1"), M}, {eofPkt(2), D}}, status: 2},
		// DEPRECATE_EOF: a cursor-opening execute sends its definitions
		// and the terminator (CURSOR_EXISTS), a streaming one rows first.
		{name: "DEPRECATE_EOF execute opens cursor", deprecate: true, binary: true, steps: []step{{countPkt(1), M}, {colPkt("a"), M},
			{deprecEnd(mysql.SERVER_STATUS_CURSOR_EXISTS | 2), D}}, status: mysql.SERVER_STATUS_CURSOR_EXISTS | 2},
		{name: "DEPRECATE_EOF execute streams", deprecate: true, binary: true, steps: []step{{countPkt(1), M}, {colPkt("a"), M},
			{[]byte{0, 0, 1}, M}, {deprecEnd(2), D}}, status: 2},
		{name: "DEPRECATE_EOF fetch", kind: respFetch, deprecate: true, binary: true, steps: []step{{[]byte{0, 0, 1}, M},
			{deprecEnd(mysql.SERVER_STATUS_CURSOR_EXISTS | 0x80), D}}, status: mysql.SERVER_STATUS_CURSOR_EXISTS | 0x80},
		{name: "DEPRECATE_EOF field list", kind: respFieldList, deprecate: true, steps: []step{{colPkt("a"), M},
			{appendOK(nil, mysql.EOF_HEADER, 0, 0x4002, "", 0), D}}, status: 0x4002},
		// MariaDB's PROGRESS: reports while the statement runs.
		{name: "progress then OK", flags: rfProgress, steps: []step{{progressPkt(1, 2, "copy to tmp table"), P},
			{progressPkt(2, 2, "Enabling keys"), P}, {okPkt(9, 2), D}}, status: 2, affected: 9},
		{name: "progress then ERR", flags: rfProgress, steps: []step{{progressPkt(1, 1, "x"), P}, {errPkt(1062), D}}, errCode: 1062},
		{name: "progress between results", flags: rfProgress, steps: []step{{okPkt(1, mysql.SERVER_MORE_RESULTS_EXISTS), M},
			{progressPkt(1, 1, "x"), P}, {okPkt(1, 0), D}}, affected: 2},
		{name: "progress before LOCAL INFILE's OK", flags: rfProgress, steps: []step{{append([]byte{mysql.LocalInFile_HEADER}, "f"...), I},
			{progressPkt(1, 1, "x"), P}, {okPkt(5, 0), D}}, affected: 5},
		{name: "0xffff without PROGRESS is an ERR", steps: []step{{progressPkt(1, 1, "x"), D}}, errCode: progressCode},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m respMachine
			m.reset(tt.kind, depFlag(tt.deprecate)|tt.flags, tt.binary)
			for i, s := range tt.steps {
				ev, err := m.feed(s.p, len(s.p))
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if ev != s.want {
					t.Fatalf("step %d: event %d, want %d", i, ev, s.want)
				}
				if ev == evInfile {
					m.state = stFirst
				}
			}
			if m.Status != tt.status || m.Affected != tt.affected || m.ErrCode != tt.errCode {
				t.Errorf("status %#x affected %d err %d", m.Status, m.Affected, m.ErrCode)
			}
			if tt.kind == respPrepare && tt.errCode == 0 && (!m.Prepared || m.StmtID != 7) {
				t.Errorf("prepare: %v id %d", m.Prepared, m.StmtID)
			}
		})
	}
}

func TestResponseStateMachineErrors(t *testing.T) {
	tests := []struct {
		name  string
		kind  respKind
		steps [][]byte
	}{
		{"empty packet", respGeneric, [][]byte{{}}},
		{"zero columns", respGeneric, [][]byte{{0xfc}}},
		{"missing column EOF", respGeneric, [][]byte{countPkt(1), colPkt("a"), rowPkt("x")}},
		{"short OK", respGeneric, [][]byte{{0}}},
		{"short prepare OK", respPrepare, [][]byte{{0, 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m respMachine
			m.reset(tt.kind, 0, false)
			var err error
			for _, p := range tt.steps {
				if _, err = m.feed(p, len(p)); err != nil {
					break
				}
			}
			if err == nil {
				t.Fatal("no error")
			}
		})
	}
}

// A row of 16 MiB - 1 bytes that starts with 0xfe is a row, not an EOF.
func TestHugeRowIsNotEOF(t *testing.T) {
	var m respMachine
	m.reset(respGeneric, 0, false)
	for _, p := range [][]byte{countPkt(1), colPkt("a"), eofPkt(0)} {
		m.feed(p, len(p))
	}
	ev, err := m.feed([]byte{0xfe, 0xff, 0xff}, mysql.MaxPayloadLen)
	if err != nil || ev != evMore {
		t.Fatalf("event %d err %v", ev, err)
	}
}

func FuzzResponseStateMachine(f *testing.F) {
	f.Add(byte(0), byte(0), false, append(append(countPkt(1), colPkt("a")...), eofPkt(0)...))
	f.Add(byte(1), byte(rfDeprecateEOF), false, prepOK(1, 1, 1))
	f.Add(byte(4), byte(0), true, []byte{0, 0, 1, 0xfe, 0, 0, 0, 0})
	f.Add(byte(0), byte(rfCacheMetadata|rfProgress), true, []byte{2, 1, 0, 6, 0xff, 0xff, 0xff, 1, 1, 2, 5, 0xfe, 0, 0, 0x40, 0})
	f.Fuzz(func(t *testing.T, kind, flags byte, binary bool, data []byte) {
		var m respMachine
		m.reset(respKind(kind%5), respFlags(flags&7), binary)
		// Cut data into packets: each starts with a one-byte length.
		for len(data) > 0 {
			n := min(int(data[0]), len(data)-1)
			p := data[1 : 1+n]
			data = data[1+n:]
			ev, err := m.feed(p, n)
			if err != nil || ev == evDone {
				return
			}
			if ev == evInfile {
				m.state = stFirst
			}
		}
	})
}

// TestResponseWarnings: the warning count of the response's last OK or
// EOF is what Outcome.Warnings reports (the policy skips a query that
// would clear the warnings of a statement that has some).
func TestResponseWarnings(t *testing.T) {
	withWarnings := func(p []byte, n uint16) []byte {
		p = append([]byte(nil), p...)
		i := len(p) - 2 // an OK without info, an EOF: the count is last
		if p[0] == mysql.EOF_HEADER && len(p) == 5 {
			i = 1
		}
		p[i], p[i+1] = byte(n), byte(n>>8)
		return p
	}
	for _, tt := range []struct {
		name  string
		steps [][]byte
		want  uint16
	}{
		{"OK without warnings", [][]byte{okPkt(1, 0)}, 0},
		{"OK with 3", [][]byte{withWarnings(okPkt(1, 0), 3)}, 3},
		{"result set ending in an EOF with 2", [][]byte{countPkt(1), colPkt("a"), eofPkt(0), rowPkt("x"), withWarnings(eofPkt(0), 2)}, 2},
		{"the last of several results", [][]byte{withWarnings(okPkt(1, mysql.SERVER_MORE_RESULTS_EXISTS), 5), okPkt(1, 0)}, 0},
	} {
		var m respMachine
		m.reset(respGeneric, 0, false)
		for _, p := range tt.steps {
			if _, err := m.feed(p, len(p)); err != nil {
				t.Fatalf("%s: %v", tt.name, err)
			}
		}
		if m.Warnings != tt.want {
			t.Errorf("%s: %d warnings, want %d", tt.name, m.Warnings, tt.want)
		}
	}
}
