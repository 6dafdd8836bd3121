package tokenserver

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// etcdHealthInterval is how often every replica checks etcd for /readyz
// and rgserver_etcd_degraded: one linearizable read and one alarm list.
const etcdHealthInterval = 2 * time.Second

// etcdHealth is what the server last saw of etcd.
type etcdHealth struct {
	// noSpace: a NOSPACE alarm is raised; etcd refuses writes.
	noSpace bool
	// noQuorum: etcd did not answer a linearizable read (no quorum, or
	// no member reachable).
	noQuorum bool
	// detail is the error seen.
	detail string
}

// EtcdProblem says why etcd refuses writes, "" when it does not: what
// /readyz reports. The leader keeps granting meanwhile.
func (s *Server) EtcdProblem() string {
	h := s.health.Load()
	switch {
	case h == nil:
		return ""
	case h.noQuorum && s.orphan.Load():
		return "etcd has no quorum (" + h.detail + "): granting from memory; group changes fail until etcd is back"
	case h.noQuorum:
		return "etcd has no quorum (" + h.detail + "); group changes fail until etcd is back"
	case h.noSpace:
		return "etcd is out of space (NOSPACE alarm): group changes and bucket persistence fail until an operator compacts, defragments and disarms it (docs/operating.md); tokens are still granted"
	}
	return ""
}

// etcdDown reports whether the last check found etcd without a quorum.
func (s *Server) etcdDown() bool {
	h := s.health.Load()
	return h != nil && h.noQuorum
}

// monitorEtcd refreshes s.health every etcdHealthInterval until ctx ends.
func (s *Server) monitorEtcd(ctx context.Context) {
	t := time.NewTicker(etcdHealthInterval)
	defer t.Stop()
	for {
		h := s.checkEtcd(ctx)
		if ctx.Err() != nil {
			return
		}
		prev := s.health.Swap(&h)
		if was := prev != nil && (prev.noSpace || prev.noQuorum); was != (h.noSpace || h.noQuorum) {
			if was {
				s.log.Info("etcd accepts writes again")
			} else {
				s.log.Warn("etcd refuses writes", "nospace", h.noSpace, "no_quorum", h.noQuorum, "err", h.detail)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checkEtcd asks etcd for a linearizable read (which needs a quorum) and
// its alarms.
func (s *Server) checkEtcd(ctx context.Context) etcdHealth {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := s.cli.Get(clientv3.WithRequireLeader(cctx), keyElection, clientv3.WithCountOnly()); err != nil {
		return etcdHealth{noQuorum: true, detail: err.Error()}
	}
	alarms, err := s.cli.AlarmList(cctx)
	if err != nil {
		return etcdHealth{noQuorum: true, detail: err.Error()}
	}
	var h etcdHealth
	for _, a := range alarms.Alarms {
		if a.GetAlarm() == etcdserverpb.AlarmType_NOSPACE {
			h.noSpace, h.detail = true, "NOSPACE alarm raised"
		}
	}
	return h
}

// noteEtcdError records what a failed write says about etcd at once,
// before the next check.
func (s *Server) noteEtcdError(err error) {
	switch {
	case errors.Is(err, rpctypes.ErrNoSpace):
		s.health.Store(&etcdHealth{noSpace: true, detail: "NOSPACE alarm raised"})
	case isNoQuorum(err):
		s.health.Store(&etcdHealth{noQuorum: true, detail: err.Error()})
	}
}

// isNoQuorum reports whether err says that etcd could not commit: no
// leader, a proposal that timed out, or no member reachable.
func isNoQuorum(err error) bool {
	for _, e := range []error{rpctypes.ErrNoLeader, rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail,
		rpctypes.ErrTimeoutDueToConnectionLost, rpctypes.ErrTimeoutWaitAppliedIndex, rpctypes.ErrLeaderChanged,
		context.DeadlineExceeded} {
		if errors.Is(err, e) {
			return true
		}
	}
	return status.Code(err) == codes.Unavailable
}

// etcdMessage explains an error from etcd to whoever asked for a write:
// nothing was changed, and why.
func etcdMessage(err error) string {
	switch {
	case errors.Is(err, rpctypes.ErrNoSpace):
		return "etcd is out of space (NOSPACE alarm) and refuses writes, so nothing was changed; an operator must compact, defragment and disarm it (docs/operating.md); tokens are still granted [" + err.Error() + "]"
	case isNoQuorum(err):
		return "etcd has no quorum and refuses writes, so nothing was changed; retry once its members are back; tokens are still granted [" + err.Error() + "]"
	}
	return err.Error()
}
