package sqltext

import "strings"

// Charset is how the lexer reads the bytes of a client character set: the
// zero value, ASCIISafe, is every character set whose multi-byte characters
// hold no byte below 0x80 (utf8mb4, utf8mb3, latin1, binary, ujis,
// eucjpms, euckr, gb2312, ...), which the lexer reads byte by byte; the
// others name the character sets whose trail bytes may be ASCII (0x40 to
// 0x7E: '@', '\', '`', letters...).
type Charset uint8

const (
	// ASCIISafe: no multi-byte character holds an ASCII byte.
	ASCIISafe Charset = iota
	// GBK: lead 0x81..0xFE, trail 0x40..0x7E or 0x80..0xFE.
	GBK
	// Big5: lead 0xA1..0xF9, trail 0x40..0x7E or 0xA1..0xFE.
	Big5
	// SJIS is sjis and cp932: lead 0x81..0x9F or 0xE0..0xFC, trail
	// 0x40..0x7E or 0x80..0xFC.
	SJIS
	// GB18030 (MySQL only): GBK's two-byte characters, and four-byte ones
	// lead 0x81..0xFE, 0x30..0x39, 0x81..0xFE, 0x30..0x39.
	GB18030
)

// String returns the family's name (cp932 reads as sjis).
func (c Charset) String() string {
	switch c {
	case GBK:
		return "gbk"
	case Big5:
		return "big5"
	case SJIS:
		return "sjis"
	case GB18030:
		return "gb18030"
	}
	return "ascii-safe"
}

// CharsetByName returns how the lexer reads the client character set
// named name (a character set name as @@character_set_client reports it,
// any case). Every name but gbk, big5, sjis, cp932 and gb18030 is
// ASCIISafe: every other character set a server accepts as a client
// character set keeps its multi-byte characters above 0x7F (ucs2, utf16
// and utf32 are refused as client character sets).
func CharsetByName(name string) Charset {
	switch strings.ToLower(name) {
	case "gbk":
		return GBK
	case "big5":
		return Big5
	case "sjis", "cp932":
		return SJIS
	case "gb18030":
		return GB18030
	}
	return ASCIISafe
}

// CharsetByCollationID returns how the lexer reads the character set of a
// collation id, as a client sends it in its handshake response or
// COM_CHANGE_USER; known is false for an id this table does not hold
// (the server may know it, or fall back to its default: ask it). The ids
// of the five character sets that need care are listed (MariaDB's and
// MySQL's, PAD and NOPAD); every other id below 256 that MariaDB 10.11 or
// MySQL 8 define is ASCIISafe.
func CharsetByCollationID(id uint16) (cs Charset, known bool) {
	switch id {
	case 28, 87, 1052, 1111:
		return GBK, true
	case 1, 84, 1025, 1108:
		return Big5, true
	case 13, 88, 1037, 1112, 95, 96, 1119, 1120:
		return SJIS, true
	case 248, 249, 250:
		return GB18030, true
	}
	switch {
	case id >= 1 && id <= 16, id >= 18 && id <= 75, id >= 77 && id <= 99, id >= 101 && id <= 124,
		id >= 128 && id <= 151, id >= 159 && id <= 183, id >= 192 && id <= 215, id >= 223 && id <= 247, id == 255:
		// MariaDB 10.11's ids below 256 and MySQL 8's utf8mb4_0900_ai_ci:
		// character sets whose multi-byte characters (if any) keep above
		// 0x7F, or ones the server refuses for a client (ucs2, utf16, utf32).
		return ASCIISafe, true
	}
	return ASCIISafe, false
}

// charLen returns the length of the character that starts at q[p], a
// byte >= 0x80, in a multi-byte Charset: 2 (or 4 for GB18030) when the
// bytes form a character whose trail bytes are all present, else 1, as
// the server's my_ismbchar / charlen do.
func (c Charset) charLen(q []byte, p int) int {
	if p+1 >= len(q) {
		return 1
	}
	b0, b1 := q[p], q[p+1]
	switch c {
	case GBK:
		if b0 >= 0x81 && b0 <= 0xFE && gbkTrail(b1) {
			return 2
		}
	case Big5:
		if b0 >= 0xA1 && b0 <= 0xF9 && (b1 >= 0x40 && b1 <= 0x7E || b1 >= 0xA1 && b1 <= 0xFE) {
			return 2
		}
	case SJIS:
		if (b0 >= 0x81 && b0 <= 0x9F || b0 >= 0xE0 && b0 <= 0xFC) && (b1 >= 0x40 && b1 <= 0x7E || b1 >= 0x80 && b1 <= 0xFC) {
			return 2
		}
	case GB18030:
		if b0 < 0x81 || b0 > 0xFE {
			return 1
		}
		if gbkTrail(b1) {
			return 2
		}
		if b1 >= 0x30 && b1 <= 0x39 && p+3 < len(q) && q[p+2] >= 0x81 && q[p+2] <= 0xFE && q[p+3] >= 0x30 && q[p+3] <= 0x39 {
			return 4
		}
	}
	return 1
}

func gbkTrail(b byte) bool { return b >= 0x40 && b <= 0x7E || b >= 0x80 && b <= 0xFE }

// CharLen returns the length of the character that starts at s[p] as
// the lexer reads it in cs: 1 for an ASCII byte, for every byte of an
// ASCIISafe text and for a byte that starts no whole character of cs.
func CharLen(s string, p int, cs Charset) int {
	if s[p] < 0x80 || cs == ASCIISafe {
		return 1
	}
	return cs.charLen(bytesOf(s), p)
}
