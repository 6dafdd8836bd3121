package tokenclient

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// The usage history (docs/design.md §7.10): rgserver's leader keeps what
// every group spent, from the proxies' consumption reports (the counts
// that ride with them: stream.go's reportCounts); UsageHistory reads it.

// Bounds of the usage history, this side.
const (
	// usageHistoryTimeout bounds UsageHistory.
	usageHistoryTimeout = 3 * time.Second
	// UsageHistoryMaxRows is the most rows one UsageHistory asks for and
	// takes (rgserver's own bound).
	UsageHistoryMaxRows = 100_000
	// usageGroupsMax is the most group names one request carries.
	usageGroupsMax = 1000
)

// ErrNoUsageHistory: rgserver does not serve the usage history (it is
// older than this proxy).
var ErrNoUsageHistory = errors.New("tokenclient: rgserver does not keep a usage history")

// UsageRowHistory is what one group spent in one interval of the usage
// history.
type UsageRowHistory struct {
	Group string
	Start time.Time
	// Granularity is the interval's length: a second, a minute or an hour.
	Granularity        time.Duration
	RRU, WRU           float64
	Statements         uint64
	Throttled, Refused uint64
	WaitedRU, DeniedRU float64
	// CPUSeconds is the backend CPU-seconds of the interval's CPU-true
	// statements (0 from an rgserver older than the figure).
	CPUSeconds float64
}

// UsageHistory asks rgserver's leader for the usage history req names
// (following NOT_LEADER, within 3 s) and returns its rows, newest first,
// and whether rgserver left rows out. Rows of a group, a granularity or
// a time req did not ask for (or of a granularity other than 1 s, 1 min
// or 1 h), or beyond req's limit, are dropped; figures that are not
// finite and non-negative are 0.
// An unreachable rgserver gives an error wrapping ErrUnavailable, one
// older than the usage history ErrNoUsageHistory.
func (c *Client) UsageHistory(ctx context.Context, req *tokenpb.UsageHistoryRequest) ([]UsageRowHistory, bool, error) {
	if !req.GetAllGroups() && len(req.GetGroups()) > usageGroupsMax {
		return nil, false, fmt.Errorf("tokenclient: usage history of %d groups: at most %d", len(req.GetGroups()), usageGroupsMax)
	}
	limit := int(req.GetLimit())
	if limit <= 0 || limit > UsageHistoryMaxRows {
		limit = UsageHistoryMaxRows
	}
	resp, err := askUsage(ctx, c, func(ctx context.Context, us tokenpb.UsageServiceClient) (*tokenpb.UsageHistoryResponse, error) {
		return us.UsageHistory(ctx, req)
	})
	if err != nil {
		return nil, false, err
	}
	asked := askedGroups(req.GetAllGroups(), req.GetGroups())
	truncated := resp.GetTruncated()
	rows := resp.GetRows()
	out := make([]UsageRowHistory, 0, min(len(rows), limit))
	for _, r := range rows {
		g := r.GetResourceGroup()
		if asked != nil && !asked[g] {
			continue
		}
		gran := r.GetGranularityS()
		if (gran != 1 && gran != 60 && gran != 3600) || (req.GetGranularityS() != 0 && gran != req.GetGranularityS()) {
			continue
		}
		if at := r.GetStartUnixMs(); at < req.GetFromUnixMs() || (req.GetToUnixMs() > 0 && at >= req.GetToUnixMs()) {
			continue
		}
		if len(out) == limit {
			truncated = true
			break
		}
		out = append(out, UsageRowHistory{Group: g, Start: time.UnixMilli(r.GetStartUnixMs()),
			Granularity: time.Duration(gran) * time.Second, RRU: figure(r.GetRru()), WRU: figure(r.GetWru()),
			Statements: r.GetStatements(), Throttled: r.GetThrottled(), Refused: r.GetRefused(),
			WaitedRU: figure(r.GetWaitedRu()), DeniedRU: figure(r.GetDeniedRu()), CPUSeconds: figure(r.GetBackendCpuSeconds())})
	}
	return out, truncated, nil
}

// figure is an RU figure from rgserver: 0 unless finite and non-negative.
func figure(v float64) float64 {
	if !(v >= 0) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// askUsage makes one UsageService call at rgserver's leader, bounded by
// usageHistoryTimeout; an rgserver without the service (or the call) is
// ErrNoUsageHistory.
func askUsage[R interface{ GetNotLeader() *tokenpb.NotLeader }](ctx context.Context, c *Client,
	call func(context.Context, tokenpb.UsageServiceClient) (R, error)) (R, error) {
	ctx, cancel := context.WithTimeout(ctx, usageHistoryTimeout)
	defer cancel()
	var resp R
	err := c.atLeaderConn(ctx, func(ctx context.Context, cc grpc.ClientConnInterface) (*tokenpb.NotLeader, error) {
		r, err := call(ctx, tokenpb.NewUsageServiceClient(cc))
		resp = r
		if err != nil {
			return nil, err
		}
		return r.GetNotLeader(), nil
	})
	if st, ok := status.FromError(errors.Unwrap(err)); ok && st.Code() == codes.Unimplemented {
		return resp, fmt.Errorf("%w: %w", ErrNoUsageHistory, err)
	}
	return resp, err
}

// askedGroups is the set of the groups a request names; nil when it asks
// for all: an answer's rows of other groups are left out.
func askedGroups(all bool, groups []string) map[string]bool {
	if all {
		return nil
	}
	asked := make(map[string]bool, len(groups))
	for _, g := range groups {
		asked[g] = true
	}
	return asked
}
