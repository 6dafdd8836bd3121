package mysqlproto

import (
	"crypto/rand"
	"fmt"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// greeting is the parts of a backend's Initial Handshake (protocol 10) that
// rgproxy reads or rewrites. Offsets point into the payload it was parsed from.
type greeting struct {
	ServerVersion string
	ConnID        uint32
	Caps          uint32
	// MariaCaps is MariaDB's extended capabilities, 0 from a server that
	// sets CLIENT_MYSQL (MySQL) or has no reserved bytes.
	MariaCaps   uint32
	Plugin      string
	capLowOff   int // offset of the lower 2 capability bytes
	capHighOff  int // offset of the upper 2 capability bytes (-1 if absent)
	reservedOff int // offset of the 10 reserved bytes (-1 if absent)
}

// parseGreeting parses a backend's Initial Handshake packet payload.
func parseGreeting(p []byte) (greeting, error) {
	var g greeting
	if len(p) < 1 || p[0] != 10 {
		return g, fmt.Errorf("%w: greeting is not protocol 10", ErrMalformedPacket)
	}
	ver, k, ok := nulString(p[1:])
	if !ok {
		return g, fmt.Errorf("%w: greeting server version", ErrMalformedPacket)
	}
	g.ServerVersion = string(ver)
	i := 1 + k
	// conn id (4), scramble part 1 (8), filler (1), caps low (2)
	if len(p) < i+15 {
		return g, fmt.Errorf("%w: greeting too short", ErrMalformedPacket)
	}
	g.ConnID = uint32(p[i]) | uint32(p[i+1])<<8 | uint32(p[i+2])<<16 | uint32(p[i+3])<<24
	i += 13
	g.capLowOff = i
	g.Caps = uint32(p[i]) | uint32(p[i+1])<<8
	i += 2
	g.capHighOff, g.reservedOff = -1, -1
	// charset (1), status (2), caps high (2), auth data length (1), reserved (10)
	if len(p) < i+16 {
		return g, nil // an old server: no upper flags, no plugin
	}
	g.capHighOff = i + 3
	g.Caps |= (uint32(p[i+3]) | uint32(p[i+4])<<8) << 16
	authLen := int(p[i+5])
	g.reservedOff = i + 6
	if g.Caps&mysql.CLIENT_LONG_PASSWORD == 0 {
		g.MariaCaps = uint32(p[i+12]) | uint32(p[i+13])<<8 | uint32(p[i+14])<<16 | uint32(p[i+15])<<24
	}
	i += 16
	if g.Caps&mysql.CLIENT_SECURE_CONNECTION != 0 {
		n := max(13, authLen-8)
		if len(p) < i+n {
			return g, fmt.Errorf("%w: greeting scramble", ErrMalformedPacket)
		}
		i += n
	}
	if g.Caps&mysql.CLIENT_PLUGIN_AUTH != 0 && i < len(p) {
		name, _, ok := nulString(p[i:])
		if !ok {
			name = p[i:] // some servers omit the final NUL
		}
		g.Plugin = string(name)
	}
	return g, nil
}

// ownServerVersion is the server version of rgproxy's own greeting, sent
// only when the backend cannot be reached. The "5.5.5-" prefix is MariaDB's,
// which clients know to skip.
const ownServerVersion = "5.5.5-rgproxy"

// appendGreeting appends an Initial Handshake (protocol 10) of rgproxy's
// own, with a random scramble for mysql_native_password. It lets a client
// whose backend cannot be reached get its error after the handshake (and
// TLS), like any other error.
func appendGreeting(b []byte, connID, caps uint32) []byte {
	var salt [20]byte
	_, _ = rand.Read(salt[:])
	for i, c := range salt { // printable, never NUL, as servers make them
		salt[i] = 0x21 + c%94
	}
	b = append(b, 10)
	b = append(b, ownServerVersion...)
	b = append(b, 0, byte(connID), byte(connID>>8), byte(connID>>16), byte(connID>>24))
	b = append(b, salt[:8]...)
	b = append(b, 0, byte(caps), byte(caps>>8),
		45, // utf8mb4_general_ci
		byte(mysql.SERVER_STATUS_AUTOCOMMIT), 0,
		byte(caps>>16), byte(caps>>24),
		byte(len(salt)+1))
	b = append(b, make([]byte, 10)...)
	b = append(b, salt[8:]...)
	b = append(b, 0)
	b = append(b, mysql.AUTH_NATIVE_PASSWORD...)
	return append(b, 0)
}

// rewriteGreeting sets the capability flags of a parsed greeting's payload
// to caps and MariaDB's extended capabilities to maria (kept only where
// caps leaves CLIENT_MYSQL out, as MariaDB does); the other reserved bytes
// become zero.
func rewriteGreeting(p []byte, g *greeting, caps, maria uint32) {
	p[g.capLowOff], p[g.capLowOff+1] = byte(caps), byte(caps>>8)
	if g.capHighOff >= 0 {
		p[g.capHighOff], p[g.capHighOff+1] = byte(caps>>16), byte(caps>>24)
	}
	if caps&mysql.CLIENT_LONG_PASSWORD != 0 || g.capHighOff < 0 {
		maria = 0
	}
	if g.reservedOff >= 0 {
		r := p[g.reservedOff : g.reservedOff+10]
		clear(r)
		r[6], r[7], r[8], r[9] = byte(maria), byte(maria>>8), byte(maria>>16), byte(maria>>24)
	}
	g.Caps, g.MariaCaps = caps, maria
}

// handshakeResponse is the parts of a client's HandshakeResponse41 (or
// SSLRequest, which is its first 32 bytes) that rgproxy reads.
type handshakeResponse struct {
	Caps uint32
	// MariaCaps is MariaDB's extended capabilities the client asks for, 0
	// when it sets CLIENT_MYSQL.
	MariaCaps uint32
	User      string
	Auth      []byte // the auth response, aliasing the payload
	DB        string
	Plugin    string
	// Collation is the client's collation id (its character set).
	Collation uint8
}

// sslRequestLen is the payload size of an SSLRequest.
const sslRequestLen = 32

// parseHandshakeResponse parses a HandshakeResponse41 payload. An
// SSLRequest parses with only Caps set.
func parseHandshakeResponse(p []byte) (handshakeResponse, error) {
	var r handshakeResponse
	if len(p) < 4 {
		return r, fmt.Errorf("%w: handshake response too short", ErrMalformedPacket)
	}
	r.Caps = uint32(p[0]) | uint32(p[1])<<8 | uint32(p[2])<<16 | uint32(p[3])<<24
	if r.Caps&mysql.CLIENT_PROTOCOL_41 == 0 {
		return r, fmt.Errorf("%w: client does not speak protocol 4.1", ErrMalformedPacket)
	}
	if len(p) < sslRequestLen {
		return r, fmt.Errorf("%w: handshake response too short", ErrMalformedPacket)
	}
	r.Collation = p[8]
	if r.Caps&mysql.CLIENT_LONG_PASSWORD == 0 {
		r.MariaCaps = uint32(p[28]) | uint32(p[29])<<8 | uint32(p[30])<<16 | uint32(p[31])<<24
	}
	if len(p) == sslRequestLen {
		return r, nil
	}
	b := p[sslRequestLen:]
	user, k, ok := nulString(b)
	if !ok {
		return r, fmt.Errorf("%w: handshake response user", ErrMalformedPacket)
	}
	r.User = string(user)
	b = b[k:]
	switch {
	case r.Caps&mysql.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA != 0:
		r.Auth, k, ok = lenencString(b)
	case r.Caps&mysql.CLIENT_SECURE_CONNECTION != 0:
		if ok = len(b) > 0 && len(b) > int(b[0]); ok {
			r.Auth, k = b[1:1+int(b[0])], 1+int(b[0])
		}
	default:
		r.Auth, k, ok = nulString(b)
	}
	if !ok {
		return r, fmt.Errorf("%w: handshake response auth data", ErrMalformedPacket)
	}
	b = b[k:]
	if r.Caps&mysql.CLIENT_CONNECT_WITH_DB != 0 && len(b) > 0 {
		db, k, ok := nulString(b)
		if !ok {
			return r, fmt.Errorf("%w: handshake response database", ErrMalformedPacket)
		}
		r.DB = string(db)
		b = b[k:]
	}
	if r.Caps&mysql.CLIENT_PLUGIN_AUTH != 0 && len(b) > 0 {
		name, k, ok := nulString(b)
		if !ok {
			name, k = b, len(b)
		}
		r.Plugin = string(name)
		b = b[k:]
	}
	if r.Caps&mysql.CLIENT_CONNECT_ATTRS != 0 && len(b) > 0 {
		if _, _, ok := lenencString(b); !ok {
			return r, fmt.Errorf("%w: handshake response attributes", ErrMalformedPacket)
		}
	}
	return r, nil
}

// rewriteHandshakeResponse sets the capability flags of a handshake
// response (or SSLRequest) payload to caps and the last 4 bytes of its
// 23-byte filler, MariaDB's extended client capabilities, to maria (zero
// where caps has CLIENT_MYSQL); the rest of the filler becomes zero.
func rewriteHandshakeResponse(p []byte, caps, maria uint32) {
	p[0], p[1], p[2], p[3] = byte(caps), byte(caps>>8), byte(caps>>16), byte(caps>>24)
	clear(p[9:sslRequestLen])
	if caps&mysql.CLIENT_LONG_PASSWORD == 0 {
		p[28], p[29], p[30], p[31] = byte(maria), byte(maria>>8), byte(maria>>16), byte(maria>>24)
	}
}

// changeUser is the part of a COM_CHANGE_USER payload rgproxy reads.
type changeUser struct {
	User   string
	Plugin string
	// Collation is the collation id the packet carries, when HasCollation.
	Collation    uint16
	HasCollation bool
}

// parseChangeUser parses a COM_CHANGE_USER payload (command byte included).
func parseChangeUser(p []byte, caps uint32) (changeUser, error) {
	var c changeUser
	if len(p) < 2 || p[0] != mysql.COM_CHANGE_USER {
		return c, fmt.Errorf("%w: COM_CHANGE_USER", ErrMalformedPacket)
	}
	b := p[1:]
	user, k, ok := nulString(b)
	if !ok {
		return c, fmt.Errorf("%w: COM_CHANGE_USER user", ErrMalformedPacket)
	}
	c.User = string(user)
	b = b[k:]
	if caps&mysql.CLIENT_SECURE_CONNECTION != 0 {
		if len(b) == 0 || len(b) <= int(b[0]) {
			return c, fmt.Errorf("%w: COM_CHANGE_USER auth data", ErrMalformedPacket)
		}
		b = b[1+int(b[0]):]
	} else {
		_, k, ok := nulString(b)
		if !ok {
			return c, fmt.Errorf("%w: COM_CHANGE_USER auth data", ErrMalformedPacket)
		}
		b = b[k:]
	}
	_, k, ok = nulString(b) // database
	if !ok {
		return c, nil // the rest is optional
	}
	b = b[k:]
	if len(b) >= 2 {
		c.Collation, c.HasCollation = uint16(b[0])|uint16(b[1])<<8, true
		b = b[2:]
		if caps&mysql.CLIENT_PLUGIN_AUTH != 0 && len(b) > 0 {
			name, _, ok := nulString(b)
			if !ok {
				name = b
			}
			c.Plugin = string(name)
		}
	}
	return c, nil
}

// clearTextPlugin reports whether an auth plugin may send the password in
// clear (so rgproxy relays it only with TLS on both legs). sha256_password
// sends it in clear whenever the client's link is TLS, so it counts.
func clearTextPlugin(name string) bool {
	switch name {
	case "mysql_clear_password", "dialog", "sha256_password":
		return true
	}
	return false
}

// needsClearPassword inspects a backend auth packet under the current
// plugin. It returns the plugin in force afterwards and whether the client
// is now asked for its password in clear: an auth switch to a clear-text
// plugin, or caching_sha2_password's "perform full authentication".
func needsClearPassword(p []byte, plugin string) (newPlugin string, clear bool) {
	switch {
	case len(p) > 0 && p[0] == mysql.EOF_HEADER:
		name, _, ok := nulString(p[1:])
		if !ok {
			name = p[1:]
		}
		return string(name), clearTextPlugin(string(name))
	case len(p) == 2 && p[0] == mysql.MORE_DATE_HEADER && p[1] == mysql.CACHE_SHA2_FULL_AUTH && plugin == "caching_sha2_password":
		return plugin, true
	}
	return plugin, false
}
