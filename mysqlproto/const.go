// The protocol constants below are declared here rather than imported from
// go-mysql's mysql package: that package pulls in github.com/pingcap/errors,
// which this module does not otherwise need (nor is it in the module cache).

package mysqlproto

// Capability flags (protocol 4.1).
const (
	capLongPassword         uint32 = 1 << 0 // CLIENT_MYSQL in MariaDB
	capFoundRows            uint32 = 1 << 1
	capLongFlag             uint32 = 1 << 2
	capConnectWithDB        uint32 = 1 << 3
	capNoSchema             uint32 = 1 << 4
	capCompress             uint32 = 1 << 5
	capODBC                 uint32 = 1 << 6
	capLocalFiles           uint32 = 1 << 7
	capIgnoreSpace          uint32 = 1 << 8
	capProtocol41           uint32 = 1 << 9
	capInteractive          uint32 = 1 << 10
	capSSL                  uint32 = 1 << 11
	capIgnoreSigpipe        uint32 = 1 << 12
	capTransactions         uint32 = 1 << 13
	capReserved             uint32 = 1 << 14
	capSecureConnection     uint32 = 1 << 15
	capMultiStatements      uint32 = 1 << 16
	capMultiResults         uint32 = 1 << 17
	capPSMultiResults       uint32 = 1 << 18
	capPluginAuth           uint32 = 1 << 19
	capConnectAttrs         uint32 = 1 << 20
	capPluginAuthLenenc     uint32 = 1 << 21
	capCanHandleExpiredPwds uint32 = 1 << 22
	capSessionTrack         uint32 = 1 << 23
	capDeprecateEOF         uint32 = 1 << 24
)

// supportedCaps is every capability rgproxy implements. Everything else
// the backend offers is cleared from the greeting and from the client's
// answer: COMPRESS (rgproxy does not compress), SSL (decided per leg),
// QUERY_ATTRIBUTES, OPTIONAL_RESULTSET_METADATA, and MariaDB's extended
// capabilities (PROGRESS, COM_MULTI, STMT_BULK_OPERATIONS,
// EXTENDED_TYPE_INFO, CACHE_METADATA), which live in the greeting's filler
// and are zeroed there.
//
// DEPRECATE_EOF is deliberately not offered: without it every result set's
// column definitions end with an EOF packet that carries the status flags,
// which is how a COM_STMT_EXECUTE that opened a cursor is told apart from
// one that streams rows. The state machine still understands the
// DEPRECATE_EOF framing, so offering it later is a one-line change.
const supportedCaps = capLongPassword | capFoundRows | capLongFlag | capConnectWithDB |
	capNoSchema | capODBC | capLocalFiles | capIgnoreSpace | capProtocol41 |
	capInteractive | capIgnoreSigpipe | capTransactions | capReserved |
	capSecureConnection | capMultiStatements | capMultiResults | capPSMultiResults |
	capPluginAuth | capConnectAttrs | capPluginAuthLenenc | capCanHandleExpiredPwds |
	capSessionTrack

// Server status flags.
const (
	statusInTrans      uint16 = 0x0001
	statusAutocommit   uint16 = 0x0002
	statusMoreResults  uint16 = 0x0008
	statusCursorExists uint16 = 0x0040
	statusNoBackslash  uint16 = 0x0200
)

// Command codes.
const (
	comQuit             byte = 0x01
	comInitDB           byte = 0x02
	comQuery            byte = 0x03
	comFieldList        byte = 0x04
	comRefresh          byte = 0x07
	comStatistics       byte = 0x09
	comProcessKill      byte = 0x0c
	comDebug            byte = 0x0d
	comPing             byte = 0x0e
	comChangeUser       byte = 0x11
	comStmtPrepare      byte = 0x16
	comStmtExecute      byte = 0x17
	comStmtSendLongData byte = 0x18
	comStmtClose        byte = 0x19
	comStmtReset        byte = 0x1a
	comSetOption        byte = 0x1b
	comStmtFetch        byte = 0x1c
	comResetConnection  byte = 0x1f
)

// Response packet headers.
const (
	hdrOK     byte = 0x00
	hdrMore   byte = 0x01 // auth more data
	hdrInfile byte = 0xfb
	hdrEOF    byte = 0xfe // also the auth switch request
	hdrERR    byte = 0xff
)

// Error codes rgproxy produces itself.
const (
	errCodeConCount        uint16 = 1040 // ER_CON_COUNT_ERROR
	errCodeUnknownCom      uint16 = 1047 // ER_UNKNOWN_COM_ERROR
	errCodeNotSupported    uint16 = 1251 // ER_NOT_SUPPORTED_AUTH_MODE
	errCodeConnHost        uint16 = 2003 // CR_CONN_HOST_ERROR
	errCodeServerLost      uint16 = 2013 // CR_SERVER_LOST
	errCodeInsecure        uint16 = 3159 // ER_SECURE_TRANSPORT_REQUIRED
	errCodeNotSupportedYet uint16 = 1235 // ER_NOT_SUPPORTED_YET
)

// maxChunk is the largest payload of one packet; a payload of exactly this
// size is continued by the next packet.
const maxChunk = 1<<24 - 1
