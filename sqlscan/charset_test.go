package sqlscan

import (
	"testing"

	"github.com/rgproxy/rgproxy/sqltext"
)

// What a statement's text says about character_set_client: the scan's
// verdict, which the session follows after the statement.
func TestCharsetEffect(t *testing.T) {
	to := func(cs sqltext.Charset) CharsetEffect { return CharsetEffect{Kind: CharsetTo, To: cs} }
	ask := CharsetEffect{Kind: CharsetAsk}
	prep := CharsetEffect{Kind: CharsetPrepared}
	tests := []struct {
		q    string
		want CharsetEffect
	}{
		{"SELECT 1", CharsetEffect{}},
		{"SET NAMES gbk", to(sqltext.GBK)},
		{"set names 'GBK' collate 'gbk_bin'", to(sqltext.GBK)},
		{"SET NAMES `big5`", to(sqltext.Big5)},
		{"SET NAMES utf8mb4", to(sqltext.ASCIISafe)},
		{"SET NAMES DEFAULT", ask},
		{"SET CHARACTER SET sjis", to(sqltext.SJIS)},
		{"SET CHARSET \"cp932\"", to(sqltext.SJIS)},
		{"SET character_set_client = gbk", to(sqltext.GBK)},
		{"SET SESSION character_set_client := 'big5'", to(sqltext.Big5)},
		{"SET @@character_set_client = gbk", to(sqltext.GBK)},
		{"SET @@session.character_set_client = gbk, @x = 1", to(sqltext.GBK)},
		{"SET @@local.character_set_client = 28", to(sqltext.GBK)},
		{"SET character_set_client = @v", ask},
		{"SET character_set_client = DEFAULT", ask},
		{"SET character_set_client = concat('g', 'bk')", ask},
		{"SET GLOBAL character_set_client = gbk", ask},
		{"SET @@global.character_set_client = gbk", ask},
		{"SET @x = 1, NAMES latin1", to(sqltext.ASCIISafe)},
		{"SET @x = (SELECT 'a, NAMES gbk'), @y = 2", CharsetEffect{}},
		{"SET character_set_connection = gbk", CharsetEffect{}},
		{"SET autocommit = 0", CharsetEffect{}},
		{"SET STATEMENT max_statement_time = 1 FOR SELECT 1", CharsetEffect{}},
		{"SET NAMES gbk; SELECT 1", to(sqltext.GBK)},
		{"SELECT 1; SET NAMES gbk", to(sqltext.GBK)},
		{"PREPARE s FROM 'SET NAMES gbk'", prep},
		{"EXECUTE s", prep},
		{"EXECUTE IMMEDIATE 'SET NAMES gbk'", prep},
		{"DEALLOCATE PREPARE s", prep},
		{"DROP PREPARE s", prep},
		{"DROP TABLE t", CharsetEffect{}},
		{"SELECT 1; EXECUTE s", ask},
		{"CALL p()", CharsetEffect{}},
	}
	for _, tt := range tests {
		var res Scan
		Query([]byte(tt.q), sqltext.Mode{}, nil, &res, nil, false)
		if res.Charset != tt.want {
			t.Errorf("%q: effect %+v, want %+v", tt.q, res.Charset, tt.want)
		}
	}
}

// After a SET NAMES of a known character set, the server reads the rest
// of a multi-statement in it, and so does the scan.
func TestScanSwitchesCharsetInMulti(t *testing.T) {
	// In gbk the string ends after 0x81 0x5C and the DELETE is a statement.
	q := "SET NAMES gbk; SELECT '\x81\\'; DELETE FROM t; -- '"
	if c, multi := ClassifyQueryMode([]byte(q), sqltext.Mode{}); c != ClassWrite || !multi {
		t.Errorf("ClassifyQueryMode(%q) = %v, %v; want write, multi", q, c, multi)
	}
	q = "SET NAMES latin1; SELECT '\x81\\'; DELETE FROM t; -- '"
	if c, _ := ClassifyQueryMode([]byte(q), sqltext.Mode{Charset: sqltext.GBK}); c != ClassRead {
		t.Errorf("ClassifyQueryMode(%q) in gbk = %v; want read", q, c)
	}
	parts := SplitStatements([]byte("SET NAMES gbk; SELECT '\x81\\'; SELECT 2"), sqltext.Mode{})
	if len(parts) != 3 {
		t.Errorf("SplitStatements: %q", parts)
	}
}

func TestReadPrepared(t *testing.T) {
	gbk := CharsetEffect{Kind: CharsetTo, To: GBK}
	ask := CharsetEffect{Kind: CharsetAsk}
	for _, tc := range []struct {
		q    string
		want Prepared
	}{
		{"PREPARE s FROM 'SET NAMES gbk'", Prepared{Op: PreparedPrepare, Name: "s", Named: true, HasFrom: true, Effect: gbk}},
		{"prepare `S``x` from @q", Prepared{Op: PreparedPrepare, Name: "s`x", Named: true, HasFrom: true, Effect: ask}},
		{"PREPARE s", Prepared{Op: PreparedPrepare, Name: "s", Named: true}},
		{"PREPARE 's' FROM 'SELECT 1'", Prepared{Op: PreparedPrepare}},
		{"EXECUTE S USING @a", Prepared{Op: PreparedExecute, Name: "s", Named: true}},
		{"EXECUTE IMMEDIATE 'SET NAMES gbk'", Prepared{Op: PreparedExecuteImmediate, Name: "immediate", Named: true, Effect: gbk}},
		{"EXECUTE IMMEDIATE CONCAT('SET NAMES ', 'gbk')", Prepared{Op: PreparedExecuteImmediate, Name: "immediate", Named: true, Effect: ask}},
		{"DEALLOCATE PREPARE s", Prepared{Op: PreparedDeallocate, Name: "s", Named: true}},
		{"(DROP PREPARE s)", Prepared{Op: PreparedDeallocate, Name: "s", Named: true}},
		{"SELECT 1", Prepared{}},
	} {
		if got := ReadPrepared(tc.q, Mode{}); got != tc.want {
			t.Errorf("%q: %+v, want %+v", tc.q, got, tc.want)
		}
	}
}

// FuzzReadPrepared: any text, in any mode, is read without panic, and a
// name is no longer than the text lowered (an invalid UTF-8 byte lowers
// to U+FFFD, three bytes).
func FuzzReadPrepared(f *testing.F) {
	for _, s := range []string{"PREPARE s FROM 'SET NAMES gbk'", "EXECUTE IMMEDIATE '", "DROP PREPARE `x", "EXECUTE s"} {
		f.Add(s, uint8(0), false)
		f.Add(s, uint8(SJIS), true)
	}
	f.Fuzz(func(t *testing.T, q string, cs uint8, nbe bool) {
		m := Mode{Charset: Charset(cs % uint8(GB18030+1)), NoBackslashEscapes: nbe}
		p := ReadPrepared(q, m)
		if len(p.Name) > 3*len(q) || p.Op > PreparedDeallocate || p.Effect.Kind > CharsetPrepared {
			t.Fatalf("%q: %+v", q, p)
		}
	})
}
