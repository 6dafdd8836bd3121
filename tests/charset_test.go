package tests

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/rgproxy/rgproxy/sqltext"
)

// charsetCases are the client character sets the differential test reads
// in, with the lead bytes it builds characters from (for the identifier
// test, leads whose character with a 0x60 trail the server can name a
// column with).
var charsetCases = []struct {
	name      string
	leads     []byte
	identLead []byte
}{
	{"gbk", []byte{0x81, 0xA1, 0xFE}, []byte{0x81, 0x95}},
	{"big5", []byte{0xA1, 0xA4, 0xF9, 0x81}, []byte{0xA4}},
	{"sjis", []byte{0x81, 0x9F, 0xE0, 0xFC, 0xB0}, []byte{0x81, 0x89}},
	{"cp932", []byte{0x81, 0x9F, 0xE0, 0xFC, 0xB0}, []byte{0x81, 0x89}},
	{"latin1", []byte{0x81, 0xE9}, nil},
	{"utf8mb4", []byte{0xC3, 0xE2, 0x81}, nil},
}

// TestLexerAgreesWithServer is a differential test of sqltext against the
// backend's own lexer: for generated strings and backquoted names full of
// lead bytes followed by '\' and '`', quotes, escapes and doubled quotes,
// in gbk, big5, sjis, cp932, latin1 and utf8mb4, with NO_BACKSLASH_ESCAPES
// off and on (and "..." names under ANSI_QUOTES), the lexer predicts whether "SELECT HEX('...')" (or "SELECT 1
// AS `...`") is one string (one name) that ends where the statement
// does, and its value; the server must agree: the same value (for names,
// which go through utf8 and back, the same outcome), or an error where the
// lexer sees the literal end elsewhere.
func TestLexerAgreesWithServer(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("mysql", dsn(backendAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rng := rand.New(rand.NewPCG(42, 10))
	const perCase = 150
	for _, cc := range charsetCases {
		for _, nbe := range []bool{false, true} {
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			mode := sqltext.Mode{Charset: sqltext.CharsetByName(cc.name), NoBackslashEscapes: nbe}
			sqlMode := "''"
			if nbe {
				sqlMode = "'NO_BACKSLASH_ESCAPES'"
			}
			if _, err := conn.ExecContext(ctx, "SET NAMES "+cc.name+", sql_mode = "+sqlMode); err != nil {
				t.Fatal(err)
			}
			agreed, ends := 0, 0
			// checkAlias runs q and holds the column name the server gives
			// against the one the lexer, in mode, predicts.
			checkAlias := func(q string, mode sqltext.Mode, label string) {
				want, ok := predictAlias(q, mode)
				rows, err := conn.QueryContext(ctx, q)
				var cols []string
				if err == nil {
					cols, err = rows.Columns()
					rows.Close()
				}
				switch {
				case ok && err == nil && len(cols) == 1 && (cols[0] == want || !plainASCII(want)):
					// Column names go through utf8 and back: in sjis '\'
					// is the yen sign, an unmapped character is lost. Only
					// a plain ASCII name keeps its bytes.
					agreed++
				case !ok && err != nil:
					agreed++
					ends++
				case ok && isErr(err, 1300, 1166):
					// An unmapped character, or a name the server refuses.
				default:
					t.Errorf("%s nbe=%v%s: %q: lexer predicts %q (ok %v); server says %q, %v", cc.name, nbe, label, q, want, ok, cols, err)
				}
			}
			alphabet := append([]byte{0x5C, 0x5C, 0x60, 0x27, 0x27, 0x22, 'A', '@', '~', 'n', '0', '%', ' '}, cc.leads...)
			alphabet = append(alphabet, cc.leads...)
			for range perCase {
				payload := randomBytes(rng, alphabet, 1+rng.IntN(8))
				q := "SELECT HEX('" + string(payload) + "')"
				want, ok := predictHex(q, mode)
				var got string
				err := conn.QueryRowContext(ctx, q).Scan(&got)
				switch {
				case ok && err == nil && got == want:
					agreed++
				case !ok && err != nil:
					agreed++
					ends++
				case ok && isErr(err, 1300):
					// An invalid character for the character set: not a
					// lexical question.
				default:
					t.Errorf("%s nbe=%v: %q: lexer predicts %q (ok %v); server says %q, %v", cc.name, nbe, q, want, ok, got, err)
				}
			}
			if cc.identLead != nil {
				idAlphabet := append([]byte{0x60, 0x60, 0x5C, 'a', 'Z'}, cc.identLead...)
				idAlphabet = append(idAlphabet, cc.identLead...)
				for range perCase / 2 {
					name := randomBytes(rng, idAlphabet, 1+rng.IntN(6))
					checkAlias("SELECT 1 AS `"+string(name)+"`", mode, "")
				}
			}
			// Under ANSI_QUOTES "..." is a name, without escapes
			// (sqltext's Mode.ANSIQuotes, which the readers of text shown
			// to another account use).
			ansiMode := mode
			ansiMode.ANSIQuotes = true
			if _, err := conn.ExecContext(ctx, "SET sql_mode = CONCAT("+sqlMode+", ',ANSI_QUOTES')"); err != nil {
				t.Fatal(err)
			}
			dqAlphabet := append([]byte{0x22, 0x22, 0x5C, 0x5C, 0x27, 'a', 'Z'}, cc.identLead...)
			for range perCase / 2 {
				name := randomBytes(rng, dqAlphabet, 1+rng.IntN(6))
				checkAlias(`SELECT 1 AS "`+string(name)+`"`, ansiMode, " ansi_quotes")
			}
			conn.Close()
			t.Logf("%s nbe=%v: %d agreements (%d where the literal does not end the statement)", cc.name, nbe, agreed, ends)
			if ends == 0 || ends == agreed {
				t.Errorf("%s nbe=%v: the generated statements do not exercise both outcomes", cc.name, nbe)
			}
		}
	}
}

func randomBytes(rng *rand.Rand, alphabet []byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return b
}

// predictHex reads q ("SELECT HEX(...)") with the lexer: ok when it is
// SELECT HEX ( string... ) and nothing else (adjacent strings concatenate),
// with the upper-case hex of the strings' value.
func predictHex(q string, m sqltext.Mode) (string, bool) {
	l := sqltext.NewString(q, m)
	var toks []sqltext.Token
	for t := l.Next(); t.Kind != sqltext.EOF; t = l.Next() {
		toks = append(toks, t)
	}
	if l.Unterminated() || len(toks) < 5 || string(l.Text(toks[0])) != "SELECT" || string(l.Text(toks[1])) != "HEX" ||
		!l.IsPunct(toks[2], '(') || !l.IsPunct(toks[len(toks)-1], ')') {
		return "", false
	}
	var v strings.Builder
	for _, t := range toks[3 : len(toks)-1] {
		if t.Kind != sqltext.String {
			return "", false
		}
		s, ok := sqltext.Unquote(string(l.Text(t)), m)
		if !ok {
			return "", false
		}
		v.WriteString(s)
	}
	return strings.ToUpper(hex.EncodeToString([]byte(v.String()))), true
}

// predictAlias reads q ("SELECT 1 AS `...`") with the lexer: ok when the
// backquoted name ends the statement, with the name.
func predictAlias(q string, m sqltext.Mode) (string, bool) {
	l := sqltext.NewString(q, m)
	var toks []sqltext.Token
	for t := l.Next(); t.Kind != sqltext.EOF; t = l.Next() {
		toks = append(toks, t)
	}
	if l.Unterminated() || len(toks) != 4 || toks[3].Kind != sqltext.QuotedIdent {
		return "", false
	}
	return sqltext.Unquote(string(l.Text(toks[3])), m)
}

func plainASCII(s string) bool {
	for i := range len(s) {
		if s[i] >= 0x80 || s[i] == '\\' {
			return false
		}
	}
	return true
}

func isErr(err error, codes ...uint16) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	for _, c := range codes {
		if me.Number == c {
			return true
		}
	}
	return false
}

// TestCharsetSessionReadAsTheBackend: rgproxy reads a session's text in
// its character_set_client, as the backend does. In gbk 0x81 0x5C is one
// character, so "SELECT HEX('\x81\'), CURRENT_RESOURCE_GROUP() -- '" is a
// string and a call of rgproxy's function, which rgproxy answers; read
// byte by byte (as rgproxy did), the backslash escapes the quote, the
// call hides in a string, and the backend refuses the unknown function
// (1305). The character set comes from the handshake, SET NAMES, SET
// character_set_client = @var (asked of the backend) and an SQL prepared
// SET NAMES; in utf8mb4 the same bytes stay one string.
func TestCharsetSessionReadAsTheBackend(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts)
	const gbkQuery = "SELECT HEX('\x81\\') AS a, CURRENT_RESOURCE_GROUP() AS g -- '"
	const utf8Query = "SELECT LENGTH('\x81\\', CURRENT_RESOURCE_GROUP() -- ')"
	utf8Len := int64(len("\x81'" + ", CURRENT_RESOURCE_GROUP() -- "))
	ctx := context.Background()
	checkGBK := func(t *testing.T, conn *sql.Conn, how string) {
		t.Helper()
		var a, g string
		if err := conn.QueryRowContext(ctx, gbkQuery).Scan(&a, &g); err != nil {
			t.Fatalf("%s: %q: %v", how, gbkQuery, err)
		}
		// HEX shows the string in character_set_connection: 815C when it is
		// gbk too; what matters is that the string ended after 0x81 0x5C.
		if a == "" || g != "default" {
			t.Fatalf("%s: got %q, %q; want the string's hex, default", how, a, g)
		}
	}
	checkUTF8 := func(t *testing.T, conn *sql.Conn, how string) {
		t.Helper()
		var n int64
		if err := conn.QueryRowContext(ctx, utf8Query).Scan(&n); err != nil || n != utf8Len {
			t.Fatalf("%s: %q = %d, %v; want %d (one string)", how, utf8Query, n, err, utf8Len)
		}
	}

	t.Run("handshake", func(t *testing.T) {
		cfg, err := mysql.ParseDSN(dsn(px.Addr))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Collation = "gbk_chinese_ci"
		connector, err := mysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(connector)
		defer db.Close()
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		checkGBK(t, conn, "gbk handshake")
	})
	t.Run("statements", func(t *testing.T) {
		conn, err := openDB(t, px.Addr).Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		checkUTF8(t, conn, "utf8mb4 handshake")
		// Questions counts the statements the backend ran for the session,
		// rgproxy's own included (this SHOW counts itself).
		questions := func() int {
			t.Helper()
			var name string
			var n int
			if err := conn.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		steps := []struct {
			how   string
			stmts []string
			gbk   bool
			asks  int // queries rgproxy sends the backend to learn the character set
		}{
			{"SELECT 1", []string{"SELECT 1", "SELECT 2"}, false, 0},
			{"SET NAMES gbk", []string{"SET NAMES gbk"}, true, 0},
			{"SET NAMES utf8mb4", []string{"SET NAMES utf8mb4"}, false, 0},
			{"SET character_set_client = @cs", []string{"SET @cs = 'gbk'", "SET character_set_client = @cs"}, true, 1},
			{"EXECUTE of SET NAMES utf8mb4", []string{"PREPARE s FROM 'SET NAMES utf8mb4'", "EXECUTE s"}, false, 0},
			{"EXECUTE IMMEDIATE of SET CHARSET gbk", []string{"EXECUTE IMMEDIATE 'SET CHARSET gbk'"}, true, 0},
			{"SET NAMES DEFAULT", []string{"SET NAMES DEFAULT"}, false, 1},
		}
		for _, s := range steps {
			before := questions()
			for _, q := range s.stmts {
				if _, err := conn.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if s.gbk {
				checkGBK(t, conn, s.how)
			} else {
				checkUTF8(t, conn, s.how)
			}
			if asks := questions() - before - len(s.stmts) - 2; asks != s.asks {
				t.Errorf("%s: rgproxy asked the backend %d times, want %d", s.how, asks, s.asks)
			}
		}
	})
}
