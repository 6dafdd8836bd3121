package resourcegroup

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// ErrWatchNotFound: 1105, QUERY WATCH REMOVE of an id that is not (or no
// longer) in the watch list.
var ErrWatchNotFound = errors.New("resourcegroup: runaway watch not found")

// WatchSourceManual is the Source of a watch added by QUERY WATCH ADD.
const WatchSourceManual = "manual"

// Watch is one entry of the runaway watch list: statements matching it are
// acted on as soon as they arrive.
type Watch struct {
	// ID is global, assigned by the store (rgserver); 0 before AddWatch.
	ID uint64
	// Group is the watched resource group (normalized).
	Group string
	// Action is taken on matching statements; ActionNone = the group's
	// QUERY_LIMIT action.
	Action Action
	// SwitchGroup is the target of ActionSwitchGroup.
	SwitchGroup string
	// Match is WatchExact (Text is the SQL text) or WatchSimilar (Text is
	// the normalized digest).
	Match WatchType
	// Text is the SQL text (EXACT) or the digest (SIMILAR).
	Text string
	// Source is WatchSourceManual or the id of the proxy that caught the
	// runaway statement.
	Source string
	// Created is when the entry was added; set by the store when zero.
	Created time.Time
	// Expires is when the entry stops matching; zero = never.
	Expires time.Time
}

// Live reports whether w still matches at now.
func (w Watch) Live(now time.Time) bool { return w.Expires.IsZero() || now.Before(w.Expires) }

// SameTarget reports whether w and o watch the same statements of the same
// group (the key AddWatch deduplicates on).
func (w Watch) SameTarget(o Watch) bool {
	return w.Group == o.Group && w.Match == o.Match && w.Text == o.Text
}

// Validate checks a watch before it is stored; the error is ErrInvalid.
func (w Watch) Validate() error {
	if err := ValidateName(w.Group); err != nil {
		return err
	}
	switch w.Match {
	case WatchExact, WatchSimilar:
	default:
		return NewInvalid(msgInvalidWatch + ": the match type must be EXACT or SIMILAR")
	}
	if w.Text == "" {
		return NewInvalid(msgInvalidWatch + ": empty SQL text or digest")
	}
	if w.Action > ActionSwitchGroup {
		return NewInvalid(fmt.Sprintf("%s: %d", msgUnknownAction, w.Action))
	}
	if w.Action == ActionSwitchGroup {
		if err := ValidateName(w.SwitchGroup); err != nil {
			return NewInvalid(msgSwitchTarget + ": " + err.Error())
		}
		if w.SwitchGroup == w.Group {
			return NewInvalid(msgSwitchTarget + ": SWITCH_GROUP target must differ from the watched group")
		}
	} else if w.SwitchGroup != "" {
		return NewInvalid(msgSwitchTarget + ": a switch group needs ACTION = SWITCH_GROUP")
	}
	if !w.Expires.IsZero() && !w.Created.IsZero() && !w.Expires.After(w.Created) {
		return NewInvalid(msgInvalidWatch + ": it expires before it is created")
	}
	return nil
}

// NewWatchNotFound is the error of removing watch id that does not exist.
// TiDB answers this with 1105 and these words.
func NewWatchNotFound(id uint64) *Error {
	return &Error{Code: CodeUnknown, State: "HY000",
		Message: fmt.Sprintf("no runaway watch with the specific ID %d", id), Err: ErrWatchNotFound}
}

// WatchStore holds the runaway watch list. tokenclient implements it over
// gRPC, rgserver over etcd, MemStore in memory.
type WatchStore interface {
	// AddWatch stores w (Group is normalized, Created set when zero) and
	// returns it with its ID. While a live watch with the same Group,
	// Match and Text exists, that one is returned instead. ErrInvalid for
	// a bad watch, ErrNotFound when its group or SWITCH_GROUP target does
	// not exist.
	AddWatch(ctx context.Context, w Watch) (Watch, error)
	// RemoveWatch deletes watch id; ErrWatchNotFound if there is none.
	RemoveWatch(ctx context.Context, id uint64) error
	// ListWatches returns the live watches sorted by ID.
	ListWatches(ctx context.Context) ([]Watch, error)
}

var _ WatchStore = (*MemStore)(nil)

// SortWatches sorts ws by ID.
func SortWatches(ws []Watch) {
	sort.Slice(ws, func(i, j int) bool { return ws[i].ID < ws[j].ID })
}

// SetClock sets the clock MemStore uses for watch creation and expiry;
// default time.Now.
func (s *MemStore) SetClock(now func() time.Time) {
	s.mu.Lock()
	s.now = now
	s.mu.Unlock()
}

func (s *MemStore) nowLocked() time.Time {
	if s.now == nil {
		return time.Now()
	}
	return s.now()
}

// AddWatch implements WatchStore. Expired entries are dropped on the way.
func (s *MemStore) AddWatch(ctx context.Context, w Watch) (Watch, error) {
	if err := ctx.Err(); err != nil {
		return Watch{}, fmt.Errorf("add runaway watch: %w", err)
	}
	w.Group = NormalizeName(w.Group)
	if w.SwitchGroup != "" {
		w.SwitchGroup = NormalizeName(w.SwitchGroup)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.nowLocked()
	if w.Created.IsZero() {
		w.Created = now
	}
	if err := w.Validate(); err != nil {
		return Watch{}, err
	}
	s.expireWatchesLocked(now)
	for _, old := range s.watches {
		if old.SameTarget(w) {
			return old, nil
		}
	}
	for _, g := range []string{w.Group, w.SwitchGroup} {
		if _, ok := s.groups[g]; g != "" && !ok {
			return Watch{}, NewNotFound(g)
		}
	}
	if s.watches == nil {
		s.watches = map[uint64]Watch{}
	}
	s.watchSeq++
	w.ID = s.watchSeq
	s.watches[w.ID] = w
	return w, nil
}

// RemoveWatch implements WatchStore.
func (s *MemStore) RemoveWatch(ctx context.Context, id uint64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("remove runaway watch: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireWatchesLocked(s.nowLocked())
	if _, ok := s.watches[id]; !ok {
		return NewWatchNotFound(id)
	}
	delete(s.watches, id)
	return nil
}

// ListWatches implements WatchStore.
func (s *MemStore) ListWatches(ctx context.Context) ([]Watch, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list runaway watches: %w", err)
	}
	s.mu.Lock()
	s.expireWatchesLocked(s.nowLocked())
	out := make([]Watch, 0, len(s.watches))
	for _, w := range s.watches {
		out = append(out, w)
	}
	s.mu.Unlock()
	SortWatches(out)
	return out, nil
}

func (s *MemStore) expireWatchesLocked(now time.Time) {
	for id, w := range s.watches {
		if !w.Live(now) {
			delete(s.watches, id)
		}
	}
}
