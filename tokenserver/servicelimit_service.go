package tokenserver

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// keyServiceLimit holds the service limit set by SQL ({"ru_per_sec": n},
// 0 = none). Absent: the replica's --service-limit (Config.ServiceLimit)
// is in force. Every replica follows it with the settings
// (loadAndFollowSettings); the leader applies it to its allocator.
const keyServiceLimit = "/rg/service/limit"

// storedServiceLimit is keyServiceLimit's value.
type storedServiceLimit struct {
	RUPerSec uint64 `json:"ru_per_sec"`
}

// svcState is what the server knows of the service limit, guarded by mu.
type svcState struct {
	// stored: etcd holds a limit set by SQL, value.
	stored bool
	value  uint64
	// over: the groups' RU_PER_SEC sum was above the limit when last
	// looked at (its rise is logged once).
	over bool
}

// serviceLimitLocked is the limit in force: etcd's, else the flag's.
func (s *Server) serviceLimitLocked() (uint64, bool) {
	if s.svc.stored {
		return s.svc.value, false
	}
	return s.cfg.ServiceLimit, true
}

// applyServiceLimitLocked gives the allocator the limit in force and
// warns when the groups' RU_PER_SEC together exceed it.
func (s *Server) applyServiceLimitLocked(now time.Time) {
	v, _ := s.serviceLimitLocked()
	s.alloc.SetServiceLimit(float64(v), now)
	s.checkOvercommitLocked()
}

// checkOvercommitLocked logs, once per rise, that the groups' RU_PER_SEC
// add up to more than the service limit: not every group can have its
// rate then, and the lower priorities get less.
func (s *Server) checkOvercommitLocked() {
	f := s.alloc.ServiceLimit()
	over := f.Limit > 0 && f.FillRates > f.Limit
	if over && !s.svc.over {
		s.log.Warn("the resource groups' RU_PER_SEC add up to more than the service limit: groups of lower PRIORITY get less than their rate under load",
			"ru_per_sec_sum", f.FillRates, "service_limit", f.Limit)
	}
	s.svc.over = over
}

// setStoredServiceLimitLocked records what etcd says of the limit (ok
// false: nothing stored) and applies it.
func (s *Server) setStoredServiceLimitLocked(v uint64, ok bool, now time.Time) {
	if s.svc.stored == ok && s.svc.value == v {
		return
	}
	s.svc.stored, s.svc.value = ok, v
	lim, flag := s.serviceLimitLocked()
	s.log.Info("service limit", "ru_per_sec", lim, "from_flag", flag)
	s.applyServiceLimitLocked(now)
}

// decodeServiceLimit reads keyServiceLimit's value.
func decodeServiceLimit(data []byte) (uint64, error) {
	var st storedServiceLimit
	if err := json.Unmarshal(data, &st); err != nil {
		return 0, fmt.Errorf("%w: service limit: %w", ErrEtcd, err)
	}
	if err := resourcegroup.ValidateServiceLimit(st.RUPerSec); err != nil {
		return 0, err
	}
	return st.RUPerSec, nil
}

// loadServiceLimit reads the stored limit at revision rev and applies it.
func (s *Server) loadServiceLimit(ctx context.Context, rev int64) error {
	resp, err := s.cli.Get(ctx, keyServiceLimit, clientv3.WithRev(rev))
	if err != nil {
		return fmt.Errorf("%w: load the service limit: %w", ErrEtcd, err)
	}
	var v uint64
	ok := len(resp.Kvs) > 0
	if ok {
		if v, err = decodeServiceLimit(resp.Kvs[0].Value); err != nil {
			s.log.Warn("bad service limit in etcd: the flag's applies", "err", err)
			ok = false
		}
	}
	s.mu.Lock()
	s.setStoredServiceLimitLocked(v, ok, s.now())
	s.mu.Unlock()
	return nil
}

// serviceLimitEvent applies a change of keyServiceLimit.
func (s *Server) serviceLimitEvent(ev *clientv3.Event) {
	var v uint64
	ok := ev.Type != clientv3.EventTypeDelete
	if ok {
		var err error
		if v, err = decodeServiceLimit(ev.Kv.Value); err != nil {
			s.log.Warn("bad service limit in etcd: ignored", "err", err)
			return
		}
	}
	s.mu.Lock()
	s.setStoredServiceLimitLocked(v, ok, s.now())
	s.mu.Unlock()
}

// GetServiceLimit implements tokenpb.ResourceGroupServiceServer.
func (s *Server) GetServiceLimit(ctx context.Context, _ *pb.GetServiceLimitRequest) (*pb.GetServiceLimitResponse, error) {
	ctx, cancel := etcdCall(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, keyServiceLimit)
	if err != nil {
		return nil, toStatus(fmt.Errorf("%w: %w", ErrEtcd, err))
	}
	out := &pb.GetServiceLimitResponse{}
	s.mu.Lock()
	out.RuPerSec, out.FromFlag = s.cfg.ServiceLimit, true
	f := s.alloc.ServiceLimit()
	s.mu.Unlock()
	if len(resp.Kvs) > 0 {
		v, err := decodeServiceLimit(resp.Kvs[0].Value)
		if err != nil {
			return nil, toStatus(err)
		}
		out.RuPerSec, out.FromFlag = v, false
	}
	out.RuPerSecSum = f.FillRates
	if s.IsLeader() {
		out.Groups, out.DemandRuPerSec, out.AllocatedRuPerSec = uint32(f.Groups), f.Demand, f.Allocated
	}
	return out, nil
}

// SetServiceLimit implements tokenpb.ResourceGroupServiceServer (admin).
func (s *Server) SetServiceLimit(ctx context.Context, req *pb.SetServiceLimitRequest) (*pb.SetServiceLimitResponse, error) {
	v := req.GetRuPerSec()
	if err := resourcegroup.ValidateServiceLimit(v); err != nil {
		return nil, toStatus(err)
	}
	data, err := json.Marshal(storedServiceLimit{RUPerSec: v})
	if err != nil {
		return nil, toStatus(err)
	}
	ctx, cancel := etcdCall(ctx)
	defer cancel()
	if _, err := s.cli.Put(ctx, keyServiceLimit, string(data)); err != nil {
		return nil, toStatus(fmt.Errorf("%w: %w", ErrEtcd, err))
	}
	s.log.Info("service limit set", "ru_per_sec", v)
	return &pb.SetServiceLimitResponse{}, nil
}

// serviceLimitCollectors are the service limit's gauges, read under mu at
// each scrape.
func (s *Server) serviceLimitCollectors() []prometheus.Collector {
	read := func(pick func(ServiceLimitFigures) float64) func() float64 {
		return func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return pick(s.alloc.ServiceLimit())
		}
	}
	gauge := func(name, help string, pick func(ServiceLimitFigures) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, read(pick))
	}
	return []prometheus.Collector{
		gauge("rgserver_service_limit_ru_per_second", "The service limit in force: the RU/s of every MODE ENFORCE group together (0: none).",
			func(f ServiceLimitFigures) float64 { return f.Limit }),
		gauge("rgserver_service_limit_allocated_ru_per_second", "What the leader's last sharing of the service limit gave the groups with demand, RU/s (at most the limit; 0 on a follower or without a limit).",
			func(f ServiceLimitFigures) float64 { return f.Allocated }),
		gauge("rgserver_service_limit_demand_ru_per_second", "The demand of the groups the service limit was last shared between, RU/s.",
			func(f ServiceLimitFigures) float64 { return f.Demand }),
		gauge("rgserver_service_limit_groups", "The groups with demand the service limit was last shared between.",
			func(f ServiceLimitFigures) float64 { return float64(f.Groups) }),
		gauge("rgserver_service_limit_promised_ru_per_second", "The sum of the MODE ENFORCE groups' RU_PER_SEC (UNLIMITED counts 0): above the service limit, lower priorities get less than their rate under load.",
			func(f ServiceLimitFigures) float64 { return f.FillRates }),
	}
}
