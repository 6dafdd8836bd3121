package tokenserver

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// toStatus maps a store error to a gRPC status: resourcegroup errors keep
// their message and carry their MySQL code in an ErrorInfo; anything else is
// Unavailable (etcd unreachable) or Internal.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	var rgErr *resourcegroup.Error
	if errors.As(err, &rgErr) {
		code, reason := codes.Internal, "UNKNOWN"
		switch {
		case errors.Is(err, resourcegroup.ErrExists):
			code, reason = codes.AlreadyExists, pb.ReasonExists
		case errors.Is(err, resourcegroup.ErrNotFound):
			code, reason = codes.NotFound, pb.ReasonNotFound
		case errors.Is(err, resourcegroup.ErrWatchNotFound):
			code, reason = codes.NotFound, pb.ReasonWatchNotFound
		case errors.Is(err, resourcegroup.ErrConflict):
			code, reason = codes.Aborted, pb.ReasonConflict
		case errors.Is(err, resourcegroup.ErrInvalid):
			code, reason = codes.InvalidArgument, pb.ReasonInvalid
			if rgErr.Message == resourcegroup.NewDropReserved().Message {
				code, reason = codes.FailedPrecondition, pb.ReasonReserved
			}
		}
		st := status.New(code, rgErr.Message)
		if d, derr := st.WithDetails(pb.ErrorInfo(rgErr, reason)); derr == nil {
			st = d
		}
		return st.Err()
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, ErrEtcd):
		// Also a deadline: etcd did not answer within etcdCallTimeout.
		return status.Error(codes.Unavailable, etcdMessage(err))
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, fmt.Sprintf("internal error: %v", err))
}
