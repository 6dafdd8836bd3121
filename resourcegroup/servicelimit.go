package resourcegroup

import (
	"context"
	"fmt"
	"strconv"
)

// The service limit caps the RU/s of every MODE ENFORCE group together
// (rgserver shares it by PRIORITY: docs/design.md §7.6). It is set with
// ALTER RESOURCE CONTROL SERVICE LIMIT = n | UNLIMITED and shown by SHOW
// RESOURCE CONTROL.

// AlterServiceLimit is ALTER RESOURCE CONTROL SERVICE LIMIT = n | UNLIMITED.
// RUPerSec is 0 for UNLIMITED (no limit).
type AlterServiceLimit struct{ RUPerSec uint64 }

// ShowResourceControl is SHOW RESOURCE CONTROL.
type ShowResourceControl struct{}

func (*AlterServiceLimit) statement()   {}
func (*ShowResourceControl) statement() {}

// ServiceLimit is the service limit as a store knows it.
type ServiceLimit struct {
	// RUPerSec is the limit; 0 = none.
	RUPerSec uint64
	// FromFlag: no limit was stored by SQL: rgserver's --service-limit
	// is in force.
	FromFlag bool
	// RUPerSecSum is the sum of the MODE ENFORCE groups' RU_PER_SEC.
	RUPerSecSum float64
	// Groups, Demand and Allocated are what rgserver's leader counted
	// when it last shared the limit: the groups with demand, their
	// demand and the RU/s it gave them (0 from elsewhere).
	Groups            int
	Demand, Allocated float64
}

// ServiceLimitStore is a Store that keeps the service limit (rgserver's
// over etcd, tokenclient's over gRPC, MemStore).
type ServiceLimitStore interface {
	ServiceLimit(ctx context.Context) (ServiceLimit, error)
	// SetServiceLimit stores the limit (0: none); ErrInvalid beyond MaxRU.
	SetServiceLimit(ctx context.Context, ruPerSec uint64) error
}

// ValidateServiceLimit checks a service limit: 0 (none) or 1 to MaxRU.
func ValidateServiceLimit(v uint64) error {
	if v > MaxRU {
		return errRU("SERVICE LIMIT", strconv.FormatUint(v, 10), true)
	}
	return nil
}

// serviceLimitColumns are SHOW RESOURCE CONTROL's columns.
var serviceLimitColumns = []string{"SERVICE_LIMIT", "SOURCE", "RU_PER_SEC_SUM", "GROUPS_WITH_DEMAND", "DEMAND_RU_PER_SEC", "ALLOCATED_RU_PER_SEC"}

func executeServiceLimit(ctx context.Context, st Statement, store Store) (*Result, error) {
	ss, ok := store.(ServiceLimitStore)
	if !ok {
		return nil, NewUnsupported("the service limit on this store (it needs rgserver)")
	}
	switch s := st.(type) {
	case *AlterServiceLimit:
		if err := ValidateServiceLimit(s.RUPerSec); err != nil {
			return nil, err
		}
		if err := ss.SetServiceLimit(ctx, s.RUPerSec); err != nil {
			return nil, err
		}
		return &Result{}, nil
	case *ShowResourceControl:
		l, err := ss.ServiceLimit(ctx)
		if err != nil {
			return nil, err
		}
		limit, source := "UNLIMITED", "SQL"
		if l.RUPerSec > 0 {
			limit = strconv.FormatUint(l.RUPerSec, 10)
		}
		if l.FromFlag {
			source = "FLAG"
		}
		vals := []string{limit, source, fmtRU(l.RUPerSecSum), strconv.Itoa(l.Groups), fmtRU(l.Demand), fmtRU(l.Allocated)}
		row := make([]*string, len(vals))
		for i := range vals {
			row[i] = &vals[i]
		}
		return &Result{Columns: serviceLimitColumns, Rows: [][]*string{row}}, nil
	}
	return nil, fmt.Errorf("resourcegroup: execute: %w", ErrUnsupported)
}

func fmtRU(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// ServiceLimit implements ServiceLimitStore: MemStore keeps the limit
// and shares nothing.
func (s *MemStore) ServiceLimit(_ context.Context) (ServiceLimit, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := ServiceLimit{RUPerSec: s.serviceLimit, FromFlag: !s.serviceLimitSet}
	for _, g := range s.groups {
		if g.Mode == ModeEnforce && g.RUPerSec != Unlimited {
			l.RUPerSecSum += float64(g.RUPerSec)
		}
	}
	return l, nil
}

// SetServiceLimit implements ServiceLimitStore.
func (s *MemStore) SetServiceLimit(_ context.Context, v uint64) error {
	if err := ValidateServiceLimit(v); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.serviceLimit, s.serviceLimitSet = v, true
	return nil
}
