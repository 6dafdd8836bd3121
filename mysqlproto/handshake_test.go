package mysqlproto

import (
	"bytes"
	"net"
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// mariaGreeting builds a MariaDB-like greeting with extended capabilities.
func mariaGreeting(caps uint32, ext uint32, plugin string) []byte {
	b := []byte{10}
	b = append(b, "5.5.5-10.11.19-MariaDB\x00"...)
	b = append(b, 0x2a, 0, 0, 0) // connection id 42
	b = append(b, "abcdefgh"...) // scramble part 1
	b = append(b, 0)             // filler
	b = append(b, byte(caps), byte(caps>>8), 45, 2, 0, byte(caps>>16), byte(caps>>24), 21)
	b = append(b, 0, 0, 0, 0, 0, 0, byte(ext), byte(ext>>8), byte(ext>>16), byte(ext>>24))
	b = append(b, "ijklmnopqrst\x00"...) // scramble part 2
	return append(append(b, plugin...), 0)
}

func TestGreetingRewrite(t *testing.T) {
	all := uint32(0xffffffff) &^ mysql.CLIENT_LONG_PASSWORD // MariaDB clears CLIENT_MYSQL
	g := mariaGreeting(all, 0x1f, "mysql_native_password")
	gr, err := parseGreeting(g)
	if err != nil {
		t.Fatal(err)
	}
	if gr.ConnID != 42 || gr.Plugin != "mysql_native_password" || gr.ServerVersion != "5.5.5-10.11.19-MariaDB" || gr.Caps != all {
		t.Fatalf("parsed %+v", gr)
	}
	if gr.MariaCaps != 0x1f {
		t.Fatalf("extended capabilities %#x, want 0x1f", gr.MariaCaps)
	}
	offer := gr.Caps & supportedCaps
	rewriteGreeting(g, &gr, offer|mysql.CLIENT_SSL, gr.MariaCaps&supportedMariaCaps)
	again, err := parseGreeting(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, bit := range []uint32{mysql.CLIENT_COMPRESS, 1 << 25, 1 << 26, 1 << 29, 1 << 31} {
		if again.Caps&bit != 0 {
			t.Errorf("capability %#x still advertised", bit)
		}
	}
	for _, bit := range []uint32{mysql.CLIENT_SSL, mysql.CLIENT_PLUGIN_AUTH, mysql.CLIENT_MULTI_RESULTS, mysql.CLIENT_DEPRECATE_EOF, mysql.CLIENT_QUERY_ATTRIBUTES} {
		if again.Caps&bit == 0 {
			t.Errorf("wanted capability %#x dropped: %#x", bit, again.Caps)
		}
	}
	want := []byte{0, 0, 0, 0, 0, 0, 0x1d, 0, 0, 0} // COM_MULTI cleared
	if got := g[again.reservedOff : again.reservedOff+10]; !bytes.Equal(got, want) || again.MariaCaps != 0x1d {
		t.Errorf("reserved bytes %x, want %x", got, want)
	}
	// A server that sets CLIENT_MYSQL has filler there, never capabilities.
	mysqlG := mariaGreeting(all|mysql.CLIENT_LONG_PASSWORD, 0x1f, "caching_sha2_password")
	mg, _ := parseGreeting(mysqlG)
	rewriteGreeting(mysqlG, &mg, mg.Caps&supportedCaps, 0x1d)
	if mg.MariaCaps != 0 || !bytes.Equal(mysqlG[mg.reservedOff:mg.reservedOff+10], make([]byte, 10)) {
		t.Errorf("MySQL greeting got extended capabilities: %x", mysqlG[mg.reservedOff:mg.reservedOff+10])
	}
	if again.Plugin != "mysql_native_password" || again.ConnID != 42 {
		t.Errorf("rewrite damaged the greeting: %+v", again)
	}
}

func TestGreetingErrors(t *testing.T) {
	good := mariaGreeting(supportedCaps, 0, "x")
	for name, p := range map[string][]byte{
		"empty":       nil,
		"protocol 9":  append([]byte{9}, good[1:]...),
		"no NUL":      []byte{10, 'a', 'b'},
		"short":       good[:20],
		"no scramble": good[:len(good)-5],
	} {
		if _, err := parseGreeting(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func handshakeResp(caps uint32, user string, auth []byte, db, plugin string, attrs bool) []byte {
	b := []byte{byte(caps), byte(caps >> 8), byte(caps >> 16), byte(caps >> 24), 0, 0, 0, 1, 45}
	b = append(b, make([]byte, 19)...)
	b = append(b, 0x1f, 0, 0, 0) // MariaDB extended client capabilities
	b = append(append(b, user...), 0)
	if caps&mysql.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA != 0 {
		b = appendLenencString(b, string(auth))
	} else {
		b = append(append(b, byte(len(auth))), auth...)
	}
	if caps&mysql.CLIENT_CONNECT_WITH_DB != 0 {
		b = append(append(b, db...), 0)
	}
	if caps&mysql.CLIENT_PLUGIN_AUTH != 0 {
		b = append(append(b, plugin...), 0)
	}
	if attrs {
		b = appendLenencString(b, "\x04_pid\x0212")
	}
	return b
}

func TestHandshakeResponse(t *testing.T) {
	base := mysql.CLIENT_PROTOCOL_41 | mysql.CLIENT_SECURE_CONNECTION | mysql.CLIENT_PLUGIN_AUTH
	tests := []struct {
		name string
		caps uint32
		db   string
	}{
		{"plain", base, ""},
		{"lenenc auth, db, attrs", base | mysql.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA | mysql.CLIENT_CONNECT_WITH_DB | mysql.CLIENT_CONNECT_ATTRS, "shop"},
		{"with compress and optional metadata asked", base | mysql.CLIENT_COMPRESS | mysql.CLIENT_OPTIONAL_RESULTSET_METADATA, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := handshakeResp(tt.caps, "app", []byte("0123456789abcdefghij"), tt.db, "client_ed25519", tt.caps&mysql.CLIENT_CONNECT_ATTRS != 0)
			r, err := parseHandshakeResponse(p)
			if err != nil {
				t.Fatal(err)
			}
			if r.User != "app" || string(r.Auth) != "0123456789abcdefghij" || r.DB != tt.db || r.Plugin != "client_ed25519" {
				t.Fatalf("parsed %+v", r)
			}
			masked := r.Caps & supportedCaps
			rewriteHandshakeResponse(p, masked, 0)
			r2, err := parseHandshakeResponse(p)
			if err != nil || r2.Caps != masked || r2.User != "app" || r2.Plugin != "client_ed25519" {
				t.Fatalf("after rewrite %+v %v", r2, err)
			}
			if r2.Caps&(mysql.CLIENT_COMPRESS|mysql.CLIENT_OPTIONAL_RESULTSET_METADATA) != 0 || !bytes.Equal(p[9:32], make([]byte, 23)) {
				t.Error("unsupported capabilities survive")
			}
		})
	}
	if r, err := parseHandshakeResponse(handshakeResp(base|mysql.CLIENT_SSL, "", nil, "", "", false)[:32]); err != nil || r.Caps&mysql.CLIENT_SSL == 0 {
		t.Errorf("SSLRequest: %+v %v", r, err)
	}
	for name, p := range map[string][]byte{
		"short":        {1, 2},
		"protocol 320": make([]byte, 40),
		"no user NUL":  append(handshakeResp(base, "", nil, "", "", false)[:32], 'a'),
		"auth overrun": append(handshakeResp(base, "", nil, "", "", false)[:32], 'a', 0, 50, 1),
	} {
		if _, err := parseHandshakeResponse(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestNeedsClearPassword(t *testing.T) {
	tests := []struct {
		p      []byte
		plugin string
		want   string
		clear  bool
	}{
		{append([]byte{mysql.EOF_HEADER}, "mysql_clear_password\x00"...), "mysql_native_password", "mysql_clear_password", true},
		{append([]byte{mysql.EOF_HEADER}, "dialog\x00\x04Password: "...), "x", "dialog", true},
		{append([]byte{mysql.EOF_HEADER}, "client_ed25519\x00salt"...), "mysql_native_password", "client_ed25519", false},
		{[]byte{mysql.MORE_DATE_HEADER, 4}, "caching_sha2_password", "caching_sha2_password", true},
		{[]byte{mysql.MORE_DATE_HEADER, 3}, "caching_sha2_password", "caching_sha2_password", false},
		{[]byte{mysql.MORE_DATE_HEADER, 4}, "client_ed25519", "client_ed25519", false},
	}
	for _, tt := range tests {
		got, clear := needsClearPassword(tt.p, tt.plugin)
		if got != tt.want || clear != tt.clear {
			t.Errorf("%q under %s: %s %v", tt.p, tt.plugin, got, clear)
		}
	}
}

func TestParseChangeUser(t *testing.T) {
	p := append([]byte{mysql.COM_CHANGE_USER}, "bob\x00\x03abc"...)
	p = append(p, "db\x00"...)
	p = append(p, 45, 0)
	p = append(p, "mysql_clear_password\x00"...)
	c, err := parseChangeUser(p, mysql.CLIENT_SECURE_CONNECTION|mysql.CLIENT_PLUGIN_AUTH)
	if err != nil || c.User != "bob" || c.Plugin != "mysql_clear_password" {
		t.Fatalf("%+v %v", c, err)
	}
	if _, err := parseChangeUser([]byte{mysql.COM_CHANGE_USER, 'b', 0, 9}, mysql.CLIENT_SECURE_CONNECTION); err == nil {
		t.Error("auth overrun accepted")
	}
}

func TestProxyHeader(t *testing.T) {
	tcp := func(s string) *net.TCPAddr { a, _ := net.ResolveTCPAddr("tcp", s); return a }
	tests := []struct {
		src, dst net.Addr
		want     string
	}{
		{tcp("10.1.2.3:5000"), tcp("127.0.0.1:4000"), "PROXY TCP4 10.1.2.3 127.0.0.1 5000 4000\r\n"},
		{tcp("[::1]:5000"), tcp("[::1]:4000"), "PROXY TCP6 ::1 ::1 5000 4000\r\n"},
		{tcp("10.1.2.3:5000"), tcp("[::1]:4000"), "PROXY UNKNOWN\r\n"},
		{&net.UnixAddr{Name: "x"}, tcp("127.0.0.1:1"), "PROXY UNKNOWN\r\n"},
	}
	for _, tt := range tests {
		if got := proxyHeader(tt.src, tt.dst); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
}

func FuzzParseHandshake(f *testing.F) {
	f.Add(mariaGreeting(supportedCaps, 7, "mysql_native_password"), []byte{})
	f.Add([]byte{}, handshakeResp(mysql.CLIENT_PROTOCOL_41|mysql.CLIENT_SECURE_CONNECTION|mysql.CLIENT_PLUGIN_AUTH|mysql.CLIENT_CONNECT_ATTRS|mysql.CLIENT_CONNECT_WITH_DB, "u", []byte("x"), "d", "p", true))
	f.Add([]byte{10, 0}, handshakeResp(mysql.CLIENT_PROTOCOL_41|mysql.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA, "u", nil, "", "", false))
	f.Fuzz(func(t *testing.T, greetingData, respData []byte) {
		if g, err := parseGreeting(greetingData); err == nil {
			cp := bytes.Clone(greetingData)
			rewriteGreeting(cp, &g, g.Caps&supportedCaps, g.MariaCaps&supportedMariaCaps)
			if g2, err := parseGreeting(cp); err != nil || g2.Caps&^supportedCaps != 0 || g2.MariaCaps&^supportedMariaCaps != 0 {
				t.Fatalf("rewritten greeting: %+v %v", g2, err)
			}
		}
		if r, err := parseHandshakeResponse(respData); err == nil {
			cp := bytes.Clone(respData)
			rewriteHandshakeResponse(cp, r.Caps&supportedCaps, r.MariaCaps&supportedMariaCaps)
			if r2, err := parseHandshakeResponse(cp); err == nil && (r2.Caps&^supportedCaps != 0 || r2.MariaCaps&^supportedMariaCaps != 0) {
				t.Fatalf("rewritten response keeps %#x %#x", r2.Caps, r2.MariaCaps)
			}
		}
		parseChangeUser(respData, mysql.CLIENT_SECURE_CONNECTION|mysql.CLIENT_PLUGIN_AUTH)
	})
}

// rgproxy's own greeting (backend unreachable) parses as a server's.
func TestOwnGreeting(t *testing.T) {
	caps := supportedCaps | mysql.CLIENT_SSL
	p := appendGreeting(nil, 0x01020304, caps)
	g, err := parseGreeting(p)
	if err != nil {
		t.Fatal(err)
	}
	if g.ServerVersion != ownServerVersion || g.ConnID != 0x01020304 || g.Caps != caps || g.Plugin != mysql.AUTH_NATIVE_PASSWORD {
		t.Fatalf("parsed %+v", g)
	}
	// The 20-byte scramble: 8 bytes after the connection id, 12 after the
	// reserved bytes, printable.
	i := 1 + len(ownServerVersion) + 1 + 4
	salt := append(append([]byte{}, p[i:i+8]...), p[g.reservedOff+10:g.reservedOff+22]...)
	for _, c := range salt {
		if c < 0x21 || c > 0x7e {
			t.Fatalf("scramble %q is not printable", salt)
		}
	}
	if p[g.reservedOff+22] != 0 {
		t.Fatal("scramble not NUL-terminated")
	}
	if bytes.Equal(salt[:8], appendGreeting(nil, 1, caps)[i:i+8]) {
		t.Fatal("two greetings share a scramble")
	}
}
