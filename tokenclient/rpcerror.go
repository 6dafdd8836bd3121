package tokenclient

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// rpcFailure is a ResourceGroupService call that failed, with the rgserver
// addresses it was tried against (in order), so that the client's error
// can name them.
type rpcFailure struct {
	addrs []string
	err   error
}

func (f *rpcFailure) Error() string { return f.err.Error() }
func (f *rpcFailure) Unwrap() error { return f.err }

// where names the rgserver(s) a failure came from: "rgserver at A", or
// "rgserver (tried A, B)".
func (f *rpcFailure) where() string {
	switch len(f.addrs) {
	case 0:
		return "rgserver"
	case 1:
		return "rgserver at " + f.addrs[0]
	}
	return "rgserver (tried " + strings.Join(f.addrs, ", ") + ")"
}

// last is the address that gave the error.
func (f *rpcFailure) last() string {
	if len(f.addrs) == 0 {
		return "rgserver"
	}
	return "rgserver at " + f.addrs[len(f.addrs)-1]
}

// Sentences that end every readable RPC error, saying what became of the
// statement.
const (
	notApplied   = "the statement was not applied"
	maybeApplied = "the statement may or may not have been applied (SHOW CREATE RESOURCE GROUP, SHOW RESOURCE GROUPS and QUERY WATCH's views tell)"
)

// mapError turns a ResourceGroupService error into resourcegroup's; name
// is the group (or user) the operation was about. Every error the client
// sees from here is a *resourcegroup.Error with readable text: gRPC's
// ("rpc error: code = ... desc = ...") never reaches a MySQL client.
// Unreachable rgservers (Unavailable, DeadlineExceeded) also wrap
// ErrUnavailable.
func mapError(op, name string, err error) error {
	var f *rpcFailure
	if !errors.As(err, &f) {
		f = &rpcFailure{err: err}
	}
	st, ok := status.FromError(f.err)
	if !ok {
		switch {
		case errors.Is(err, context.Canceled):
			return unknownErr(fmt.Sprintf("%s: canceled before rgserver answered; %s", op, maybeApplied), err)
		case errors.Is(err, context.DeadlineExceeded):
			return unknownErr(fmt.Sprintf("%s: %s did not answer in time; %s", op, f.where(), maybeApplied),
				fmt.Errorf("%w: %w", ErrUnavailable, err))
		case errors.Is(err, ErrClosed):
			return unknownErr(fmt.Sprintf("%s: this proxy is shutting down; %s", op, notApplied), err)
		}
		return unknownErr(fmt.Sprintf("%s: %s: %v; %s", op, f.where(), err, notApplied), err)
	}
	msg := st.Message()
	switch st.Code() {
	case codes.AlreadyExists:
		return resourcegroup.NewExists(name)
	case codes.NotFound:
		return resourcegroup.NewNotFound(name)
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		// rgserver's own words (TiDB's wording, validate.go's reasons).
		return resourcegroup.NewInvalid(msg)
	case codes.Aborted:
		return &resourcegroup.Error{Code: resourcegroup.CodeUnknown, State: "HY000",
			Message: msg, Err: resourcegroup.ErrConflict}
	case codes.Unavailable:
		return unknownErr(fmt.Sprintf("%s is unreachable: %s; %s", f.where(), unreachableReason(msg), notApplied),
			fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err))
	case codes.DeadlineExceeded:
		return unknownErr(fmt.Sprintf("%s did not answer in time; %s", f.where(), maybeApplied),
			fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err))
	case codes.Canceled:
		return unknownErr(fmt.Sprintf("%s: canceled before rgserver answered; %s", op, maybeApplied), err)
	case codes.Unauthenticated:
		return unknownErr(fmt.Sprintf("%s refused this proxy's credential (%s); check --token-server-token-file: it must hold a token of rgserver's --admin-token-file; %s",
			f.last(), msg, notApplied), err)
	case codes.PermissionDenied:
		return unknownErr(fmt.Sprintf("%s does not let this proxy's credential change resource groups (%s); set --token-server-token-file to a token of rgserver's --admin-token-file; %s",
			f.last(), msg, notApplied), err)
	case codes.ResourceExhausted:
		return unknownErr(fmt.Sprintf("%s is busy (%s); try again in a moment; %s", f.last(), msg, notApplied), err)
	case codes.Unimplemented:
		return unknownErr(fmt.Sprintf("%s does not implement %s: it is older than this proxy; %s", f.last(), op, notApplied), err)
	}
	return unknownErr(fmt.Sprintf("%s: %s failed (%s: %s); %s", op, f.last(), st.Code(), msg, maybeApplied), err)
}

// unknownErr is 1105 with msg.
func unknownErr(msg string, err error) *resourcegroup.Error {
	return &resourcegroup.Error{Code: resourcegroup.CodeUnknown, State: "HY000", Message: msg, Err: err}
}

// unreachableReasons are the causes of an Unavailable worth naming alone,
// in the words of Go's net and crypto/tls errors.
var unreachableReasons = []string{
	"connection refused", "no such host", "i/o timeout", "network is unreachable",
	"no route to host", "connection reset by peer", "connection closed",
	"certificate", "first record does not look like a TLS handshake", "handshake failure",
}

// unreachableReason shortens an Unavailable status message (`connection
// error: desc = "transport: Error while dialing: dial tcp ...: connect:
// connection refused"`) to its cause.
func unreachableReason(msg string) string {
	for _, r := range unreachableReasons {
		if i := strings.Index(msg, r); i >= 0 {
			if r == "certificate" || strings.Contains(r, "TLS") || r == "handshake failure" {
				// A TLS failure's whole sentence says which check failed.
				s := msg[strings.LastIndex(msg[:i], ": ")+2:]
				return "TLS: " + strings.Trim(s, `"`)
			}
			return r
		}
	}
	s := msg
	for _, p := range []string{"connection error: desc = ", `"`, "transport: ", "Error while dialing: "} {
		s = strings.TrimPrefix(s, p)
	}
	s = strings.Trim(s, `" `)
	if s == "" {
		return "no connection"
	}
	return s
}
