package mysqlproto

import (
	"errors"
	"fmt"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// ProtocolErrorKind classifies the client packets rgproxy refuses
// (Stats.ProtocolErrors, rgproxy_protocol_errors_total{kind}).
type ProtocolErrorKind int

// The kinds of protocol error. Each gets the ERR MariaDB 10.11 sends for
// the same packet.
const (
	// ProtoBadHandshake: a handshake response (or SSLRequest, or
	// COM_CHANGE_USER) rgproxy cannot read: ERR 1043 (08S01) "Bad
	// handshake", then close.
	ProtoBadHandshake ProtocolErrorKind = iota
	// ProtoOutOfOrder: a packet with an unexpected sequence id: ERR 1156
	// (08S01) "Got packets out of order", then close.
	ProtoOutOfOrder
	// ProtoTooLarge: a payload beyond Config.MaxPacketPayload (or a
	// handshake packet beyond 1 MiB): ERR 1153 (08S01) "Got a packet
	// bigger than 'max_allowed_packet' bytes", then close.
	ProtoTooLarge
	// ProtoMalformed: a command too short for its kind (an empty packet,
	// a statement command without its id, a bad query-attribute block):
	// ERR 1047 (08S01) "Unknown command" for an empty packet, ERR 1835
	// (HY000) "Malformed communication packet" otherwise, as MariaDB
	// answers; the session goes on.
	ProtoMalformed
	// ProtoReadTimeout: a client that sent part of a command and then
	// nothing for Config.NetReadTimeout: ERR 1159 (08S01) "Got timeout
	// reading communication packets", then close.
	ProtoReadTimeout
	// ProtoBufferLimit: a command that would take the bytes held for
	// commands being received beyond Config.CommandBufferLimit: ERR 1041
	// (HY000) "Out of memory", then close.
	ProtoBufferLimit
	// NumProtocolErrorKinds is the number of kinds.
	NumProtocolErrorKinds
)

var protoKindNames = [NumProtocolErrorKinds]string{
	"bad_handshake", "out_of_order", "too_large", "malformed", "read_timeout", "buffer_limit",
}

// String is the kind's metric label.
func (k ProtocolErrorKind) String() string {
	if k < 0 || k >= NumProtocolErrorKinds {
		return "unknown"
	}
	return protoKindNames[k]
}

// clientError is a client packet that rgproxy refuses: reply goes to the
// client with sequence id seq, then the connection closes.
type clientError struct {
	kind  ProtocolErrorKind
	seq   byte
	reply *Error
	err   error
}

func (e *clientError) Error() string { return e.kind.String() + ": " + e.err.Error() }
func (e *clientError) Unwrap() error { return e.err }

// newClientError builds the error for a refused packet of the given kind,
// answered with MariaDB's ERR for it and sequence id seq.
func newClientError(kind ProtocolErrorKind, seq byte, err error) *clientError {
	return &clientError{kind: kind, seq: seq, reply: protoReply(kind, ""), err: err}
}

// protoReply is MariaDB's ERR for a kind; detail, when not empty, follows
// MariaDB's message as "(rgproxy: detail)".
func protoReply(kind ProtocolErrorKind, detail string) *Error {
	var e Error
	switch kind {
	case ProtoBadHandshake:
		e = Error{Code: mysql.ER_HANDSHAKE_ERROR, State: "08S01", Message: "Bad handshake"}
	case ProtoOutOfOrder:
		e = Error{Code: mysql.ER_NET_PACKETS_OUT_OF_ORDER, State: "08S01", Message: "Got packets out of order"}
	case ProtoTooLarge:
		e = Error{Code: mysql.ER_NET_PACKET_TOO_LARGE, State: "08S01", Message: "Got a packet bigger than 'max_allowed_packet' bytes"}
	case ProtoReadTimeout:
		e = Error{Code: mysql.ER_NET_READ_INTERRUPTED, State: "08S01", Message: "Got timeout reading communication packets"}
	case ProtoBufferLimit:
		e = Error{Code: mysql.ER_OUT_OF_RESOURCES, State: "HY000", Message: "Out of memory"}
	default:
		e = Error{Code: mysql.ER_MALFORMED_PACKET, State: "HY000", Message: "Malformed communication packet"}
	}
	if detail != "" {
		e.Message += " (rgproxy: " + detail + ")"
	}
	return &e
}

// asClientError turns the framing errors of a client's packet into the
// clientError that answers them (with sequence id seq); malformed is the
// kind an ErrMalformedPacket gets (a bad handshake before login). Other
// errors are returned as they are.
func asClientError(err error, seq byte, malformed ProtocolErrorKind) error {
	var ce *clientError
	switch {
	case err == nil || errors.As(err, &ce):
		return err
	case errors.Is(err, ErrBudget):
		ce = newClientError(ProtoBufferLimit, seq, err)
		ce.reply = protoReply(ProtoBufferLimit, "the proxy holds too many partly received commands; try again")
		return ce
	case errors.Is(err, ErrPacketTooLarge):
		return newClientError(ProtoTooLarge, seq, err)
	case errors.Is(err, ErrSequence):
		return newClientError(ProtoOutOfOrder, seq, err)
	case errors.Is(err, ErrMalformedPacket):
		return newClientError(malformed, seq, err)
	}
	return err
}

// errOutOfOrder is the clientError of a packet with sequence id got where
// want was expected: MariaDB answers with the id it expected.
func errOutOfOrder(what string, got, want byte) *clientError {
	return newClientError(ProtoOutOfOrder, want, fmt.Errorf("%w: %s has sequence id %d, want %d", ErrSequence, what, got, want))
}
