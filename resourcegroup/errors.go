package resourcegroup

import (
	"errors"
	"fmt"
	"strings"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/internal/textcut"
)

// Sentinel errors. Every error this package returns is an *Error whose Err is
// one of these, so callers test with errors.Is and write the MySQL code and
// SQLSTATE of the *Error (found with errors.As) to the client.
var (
	// ErrExists: 8248, the group already exists.
	ErrExists = errors.New("resourcegroup: group exists")
	// ErrNotFound: 8249, no such group (or no such binding).
	ErrNotFound = errors.New("resourcegroup: group not found")
	// ErrSyntax: 1064, the statement does not parse.
	ErrSyntax = errors.New("resourcegroup: syntax error")
	// ErrAccessDenied: 1227, the statement needs SUPER.
	ErrAccessDenied = errors.New("resourcegroup: access denied")
	// ErrInvalid: 1105, an invalid setting (TiDB's wording in the message).
	ErrInvalid = errors.New("resourcegroup: invalid setting")
	// ErrUnsupported: 1235, a statement shape rgproxy does not implement.
	ErrUnsupported = errors.New("resourcegroup: unsupported")
	// ErrNotAllowedInPrepare: 1295, an admin statement sent through
	// COM_STMT_PREPARE or inside a multi-statement.
	ErrNotAllowedInPrepare = errors.New("resourcegroup: not allowed in prepared statement protocol")
	// ErrConflict: 1105, a Store update lost a race (Version mismatch).
	ErrConflict = errors.New("resourcegroup: concurrent modification")
)

// MySQL error codes used by this package.
const (
	CodeExists            uint16 = 8248
	CodeNotFound          uint16 = 8249
	CodeSyntax            uint16 = mysql.ER_PARSE_ERROR
	CodeAccessDenied      uint16 = mysql.ER_SPECIFIC_ACCESS_DENIED_ERROR
	CodeUnknown           uint16 = mysql.ER_UNKNOWN_ERROR
	CodeUnsupported       uint16 = mysql.ER_NOT_SUPPORTED_YET
	CodeNotAllowedPrepare uint16 = mysql.ER_UNSUPPORTED_PS
	// TiDB's codes for a statement the resource group stopped, which
	// rgproxy sends as TiDB does: 8252 throttled (never reached the
	// backend), 8253 killed by a QUERY_LIMIT, 8254 quarantined by a watch.
	CodeThrottled     uint16 = 8252
	CodeRunawayKilled uint16 = 8253
	CodeQuarantined   uint16 = 8254
	// CodeBudgetRefused is rgproxy's own, next to TiDB's: a statement
	// refused because its group's budget reached a REFUSE trigger; it
	// never reached the backend (docs/budgets.md).
	CodeBudgetRefused uint16 = 8255
)

// Error is an error that carries what a MySQL ERR packet needs.
type Error struct {
	// Code is the MySQL error number.
	Code uint16
	// State is the five-character SQLSTATE.
	State string
	// Message is the text sent to the client.
	Message string
	// Err is the sentinel this error is an instance of.
	Err error
}

// Error returns the client-facing message.
func (e *Error) Error() string { return e.Message }

// Unwrap returns the sentinel, so errors.Is(err, ErrExists) works.
func (e *Error) Unwrap() error { return e.Err }

// NewExists is 8248 for group name.
func NewExists(name string) *Error {
	return &Error{Code: CodeExists, State: "HY000", Message: fmt.Sprintf("Resource group '%s' already exists", name), Err: ErrExists}
}

// NewNotFound is 8249 for group name.
func NewNotFound(name string) *Error {
	return &Error{Code: CodeNotFound, State: "HY000", Message: fmt.Sprintf("Unknown resource group '%s'", name), Err: ErrNotFound}
}

// syntaxNearMax bounds the quoted text in a syntax error, as MySQL does.
const syntaxNearMax = 80

// NewSyntax is 1064 for a parse failure at byte offset pos of sql. The
// message names the text from pos on and its line, as MySQL does.
func NewSyntax(sql string, pos int) *Error { return NewSyntaxWhy(sql, pos, "") }

// NewSyntaxWhy is NewSyntax that also says what was wrong, after MySQL's
// text (which clients match on): "... near ” at line 1: CREATE RESOURCE
// GROUP needs at least one option ...". why is rgproxy's own words; an
// empty why is NewSyntax's text.
func NewSyntaxWhy(sql string, pos int, why string) *Error {
	if pos < 0 {
		pos = 0
	}
	if pos > len(sql) {
		pos = len(sql)
	}
	line := 1 + strings.Count(sql[:pos], "\n")
	near := sql[pos:]
	near = textcut.Prefix(near, syntaxNearMax)
	msg := fmt.Sprintf("You have an error in your SQL syntax; check the manual that corresponds to your rgproxy version for the right syntax to use near '%s' at line %d",
		near, line)
	if why != "" {
		msg += ": " + why
	}
	return &Error{Code: CodeSyntax, State: "42000", Message: msg, Err: ErrSyntax}
}

// NewAccessDenied is 1227: the statement needs SUPER. why, when not
// empty, follows TiDB's text (which clients may match on): what the
// session lacks and why it needs it.
func NewAccessDenied(why string) *Error {
	msg := "Access denied; you need (at least one of) the SUPER privilege(s) for this operation"
	if why != "" {
		msg += ": " + why
	}
	return &Error{Code: CodeAccessDenied, State: "42000", Message: msg, Err: ErrAccessDenied}
}

// NewInvalid is 1105 with msg, which should use TiDB's wording.
func NewInvalid(msg string) *Error {
	return &Error{Code: CodeUnknown, State: "HY000", Message: msg, Err: ErrInvalid}
}

// NewUnsupported is 1235 for the feature named what.
func NewUnsupported(what string) *Error {
	return &Error{Code: CodeUnsupported, State: "42000",
		Message: fmt.Sprintf("This version of rgproxy doesn't yet support '%s'", what), Err: ErrUnsupported}
}

// NewNotAllowedInPrepare is 1295: admin statements must come as COM_QUERY,
// alone.
func NewNotAllowedInPrepare() *Error {
	return &Error{Code: CodeNotAllowedPrepare, State: "HY000",
		Message: "This command is not supported in the prepared statement protocol yet", Err: ErrNotAllowedInPrepare}
}

// NewConflict is 1105: group name changed between read and write.
func NewConflict(name string, want, got int64) *Error {
	return &Error{Code: CodeUnknown, State: "HY000",
		Message: fmt.Sprintf("resource group '%s' was modified concurrently (version %d, expected %d); retry", name, got, want), Err: ErrConflict}
}

// Messages for invalid settings. The leading words are TiDB's, so clients
// matching on TiDB's text keep working; the rest says what to fix.
const (
	msgDropReserved     = "can't drop reserved resource group"
	msgNameTooLong      = "resource group name too long"
	msgNameEmpty        = "resource group name is empty"
	msgUnknownMode      = "unknown resource group mode"
	msgInvalidElapsed   = "invalid exec elapsed time"
	msgUnknownAction    = "unknown resource group runaway action"
	msgSwitchTarget     = "unknown resource group runaway switch group name"
	msgInvalidWatch     = "invalid runaway watch"
	msgInvalidSetting   = "invalid group settings"
	msgDropSwitchTarget = "can't drop resource group"
	msgNoWatch          = "no runaway watch with the specific ID"
	msgInvalidTag       = "invalid tag binding"
	msgInvalidDigest    = "invalid digest binding"
)
