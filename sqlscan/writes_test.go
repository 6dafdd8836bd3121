package sqlscan

import (
	"slices"
	"testing"
)

func TestReadXA(t *testing.T) {
	tests := []struct {
		q        string
		step     XAStep
		onePhase bool
	}{
		{"XA START 'a'", XAStart, false},
		{"xa begin 'a', 'b', 1", XAStart, false},
		{"/* c */ XA END 'a'", XAEnd, false},
		{"XA PREPARE X'6131'", XAPrepare, false},
		{"XA COMMIT 'a'", XACommit, false},
		{"XA COMMIT 'a' ONE PHASE", XACommit, true},
		{"XA COMMIT 'a' one phase;", XACommit, true},
		{"XA COMMIT 'ONE PHASE'", XACommit, false},
		{"XA ROLLBACK 'a'", XARollback, false},
		{"XA RECOVER", XANone, false},
		{"SELECT 'XA PREPARE'", XANone, false},
		{"XA", XANone, false},
		{"", XANone, false},
	}
	for _, tc := range tests {
		step, one := ReadXA(tc.q, Mode{})
		if step != tc.step || one != tc.onePhase {
			t.Errorf("%q: %d %v, want %d %v", tc.q, step, one, tc.step, tc.onePhase)
		}
	}
}

func TestUserVars(t *testing.T) {
	tests := []struct {
		q     string
		names []string
		all   bool
	}{
		{"INSERT INTO t VALUES (@v)", []string{"v"}, false},
		{"INSERT INTO t VALUES (@V, @w, @v, @@max_allowed_packet, @@session.x)", []string{"v", "w"}, false},
		{"INSERT INTO t VALUES ('@v', \"@w\") -- @x", nil, false},
		{"INSERT INTO t VALUES (@`v`)", nil, true},
		{"INSERT INTO t VALUES (@'v')", nil, true},
		{"INSERT INTO t VALUES (@a.b)", nil, true},
		{"INSERT INTO t VALUES (@\xc3\xa9)", nil, true},
		{"INSERT INTO t VALUES (@a1,@a2,@a3,@a4,@a5,@a6,@a7,@a8,@a9,@b1,@b2,@b3,@b4,@b5,@b6,@b7,@b8)", nil, true},
		{"EXECUTE s USING @w, @$x_1", []string{"w", "$x_1"}, false},
	}
	for _, tc := range tests {
		names, all := UserVars(tc.q, Mode{})
		if !slices.Equal(names, tc.names) || all != tc.all {
			t.Errorf("%q: %q %v, want %q %v", tc.q, names, all, tc.names, tc.all)
		}
	}
	// In gbk, a 0x5C second byte is not a backslash: the literal ends
	// where the server's does, and the @v after it is read.
	names, all := UserVars("INSERT INTO t VALUES ('\x81\\', @v)", Mode{Charset: GBK})
	if !slices.Equal(names, []string{"v"}) || all {
		t.Errorf("gbk: %q %v, want [v]", names, all)
	}
}

// FuzzWritesReadings: any text, in any mode, is read without panic; the
// names UserVars returns can be written unquoted.
func FuzzWritesReadings(f *testing.F) {
	for _, s := range []string{"XA COMMIT 'a' ONE PHASE", "INSERT INTO t VALUES (@v, @`w`)", "XA START '\x81\\'", "SET @a.b = 1"} {
		f.Add(s, uint8(0), false)
		f.Add(s, uint8(GBK), true)
	}
	f.Fuzz(func(t *testing.T, q string, cs uint8, nbe bool) {
		m := Mode{Charset: Charset(cs % uint8(GB18030+1)), NoBackslashEscapes: nbe}
		ReadXA(q, m)
		names, all := UserVars(q, m)
		if all && names != nil {
			t.Fatalf("%q: all with names %q", q, names)
		}
		if len(names) > maxUserVars {
			t.Fatalf("%q: %d names", q, len(names))
		}
		for _, n := range names {
			if !plainVarName(n) {
				t.Fatalf("%q: name %q cannot be written unquoted", q, n)
			}
		}
	})
}
