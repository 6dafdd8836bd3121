package resourcegroup

import (
	"fmt"
	"strings"
	"time"

	"github.com/rgproxy/rgproxy/internal/textcut"
)

// CalibrateResource is CALIBRATE RESOURCE (executed by the proxy): the
// backend's capacity in RU/s, with its basis.
//
//	CALIBRATE RESOURCE
//	CALIBRATE RESOURCE START_TIME 'YYYY-MM-DD HH:MM:SS' [DURATION 'd' | END_TIME 'YYYY-MM-DD HH:MM:SS']
//	CALIBRATE RESOURCE WORKLOAD = name                  (refused: rgproxy measures, it has no workload models)
//	CALIBRATE RESOURCE FOR GROUPS [(g1, g2, ...)] [START_TIME ...]
//
// Without START_TIME the capacity is measured live on this proxy; with it,
// over that window of the usage history, by TiDB's rule. FOR GROUPS is
// rgproxy's own: it suggests each group's RU_PER_SEC from its recorded
// demand over the window (the last hour without START_TIME) and says
// whether the suggestions fit the capacity. Times are UTC, as the usage
// history shows them.
type CalibrateResource struct {
	// Window: START_TIME was given; Start and End bound it.
	Window     bool
	Start, End time.Time
	// ForGroups: FOR GROUPS; Groups the names given (all groups the
	// session may read when empty).
	ForGroups bool
	Groups    []string
}

func (*CalibrateResource) statement() {}

const (
	// CalibrateMinWindow is the shortest window: TiDB's rule needs points
	// to drop and average (a minute holds 60 of the history's seconds).
	CalibrateMinWindow = time.Minute
	// CalibrateMaxWindow is the longest: the usage history keeps 400 days.
	CalibrateMaxWindow = 400 * 24 * time.Hour
	// calibrateMaxGroups bounds FOR GROUPS (...): the usage history
	// answers at most 1,000 names.
	calibrateMaxGroups = 1000
	// calibrateTimeLayout is START_TIME's and END_TIME's form.
	calibrateTimeLayout = "2006-01-02 15:04:05"
)

// calibrate parses CALIBRATE RESOURCE ...; the current token is CALIBRATE.
func (p *parser) calibrate() (Statement, error) {
	if err := p.expectWords("CALIBRATE", "RESOURCE"); err != nil {
		return nil, err
	}
	st := &CalibrateResource{}
	if p.isWord("WORKLOAD") {
		return nil, NewUnsupported("CALIBRATE RESOURCE WORKLOAD: rgproxy measures the backend instead of modelling a workload; use CALIBRATE RESOURCE or CALIBRATE RESOURCE START_TIME ... DURATION ...")
	}
	if p.isWord("FOR") {
		if err := p.advance(); err != nil {
			return nil, err
		}
		if err := p.expectWords("GROUPS"); err != nil {
			return nil, err
		}
		st.ForGroups = true
		if p.isPunct("(") {
			groups, err := p.calibrateGroups()
			if err != nil {
				return nil, err
			}
			st.Groups = groups
		}
	}
	if p.isWord("START_TIME") {
		if err := p.calibrateWindow(st); err != nil {
			return nil, err
		}
	} else if p.isWord("END_TIME") || p.isWord("DURATION") {
		return nil, p.failWhy("CALIBRATE RESOURCE: %s needs START_TIME before it")
	}
	if !p.atEnd() {
		if st.ForGroups {
			return nil, p.failWhy("expected START_TIME or the end of the statement, not %s")
		}
		return nil, p.failWhy("expected START_TIME, FOR GROUPS, WORKLOAD or the end of the statement, not %s")
	}
	return st, nil
}

// calibrateGroups reads "(g1, g2, ...)": names of existing groups, each
// once, at most calibrateMaxGroups.
func (p *parser) calibrateGroups() ([]string, error) {
	if err := p.expectPunct("("); err != nil {
		return nil, err
	}
	var names []string
	seen := map[string]bool{}
	for {
		name, err := p.groupName()
		if err != nil {
			return nil, err
		}
		if !seen[name] {
			if len(names) == calibrateMaxGroups {
				return nil, NewInvalid(fmt.Sprintf("CALIBRATE RESOURCE FOR GROUPS names at most %d groups", calibrateMaxGroups))
			}
			seen[name] = true
			names = append(names, name)
		}
		ok, err := p.acceptPunct(",")
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
	}
	if err := p.expectPunct(")"); err != nil {
		return nil, err
	}
	return names, nil
}

// calibrateWindow reads START_TIME 't' [DURATION 'd' | END_TIME 't'];
// without either the window runs to now (End stays zero).
func (p *parser) calibrateWindow(st *CalibrateResource) error {
	if err := p.advance(); err != nil { // START_TIME
		return err
	}
	if err := p.optionalEq(); err != nil {
		return err
	}
	start, err := p.calibrateTime("START_TIME")
	if err != nil {
		return err
	}
	st.Window, st.Start = true, start
	switch {
	case p.isWord("DURATION"):
		if err := p.advance(); err != nil {
			return err
		}
		if err := p.optionalEq(); err != nil {
			return err
		}
		if p.tok.kind != tkString {
			return p.failWhy("DURATION is a quoted duration such as '10m' or '2h', not %s")
		}
		d, err := time.ParseDuration(p.tok.text)
		if err != nil {
			return NewInvalid(fmt.Sprintf("CALIBRATE RESOURCE: DURATION '%s' is not a duration such as '10m' or '2h'", textCut(p.tok.text)))
		}
		if err := checkCalibrateSpan(d); err != nil {
			return err
		}
		st.End = start.Add(d)
		return p.advance()
	case p.isWord("END_TIME"):
		if err := p.advance(); err != nil {
			return err
		}
		if err := p.optionalEq(); err != nil {
			return err
		}
		end, err := p.calibrateTime("END_TIME")
		if err != nil {
			return err
		}
		if err := checkCalibrateSpan(end.Sub(start)); err != nil {
			return err
		}
		st.End = end
	}
	return nil
}

// checkCalibrateSpan bounds a window's length.
func checkCalibrateSpan(d time.Duration) error {
	switch {
	case d < CalibrateMinWindow:
		return NewInvalid(fmt.Sprintf("CALIBRATE RESOURCE: the window of %s is too short to tell the backend's capacity: make it between 1m and 400 days", d))
	case d > CalibrateMaxWindow:
		return NewInvalid("CALIBRATE RESOURCE: the window is longer than the usage history's 400 days")
	}
	return nil
}

// calibrateTime reads a quoted 'YYYY-MM-DD HH:MM:SS' (UTC).
func (p *parser) calibrateTime(field string) (time.Time, error) {
	if p.tok.kind != tkString {
		return time.Time{}, p.failWhy(field + " is a quoted 'YYYY-MM-DD HH:MM:SS' (UTC), not %s")
	}
	t, err := time.ParseInLocation(calibrateTimeLayout, strings.TrimSpace(p.tok.text), time.UTC)
	if err != nil || t.Year() < 1970 {
		return time.Time{}, NewInvalid(fmt.Sprintf("CALIBRATE RESOURCE: %s '%s' is not a time 'YYYY-MM-DD HH:MM:SS' (UTC) from 1970", field, textCut(p.tok.text)))
	}
	return t, p.advance()
}

// textCut keeps a quoted value in an error message short and valid UTF-8.
func textCut(s string) string { return textcut.Marked(strings.ToValidUTF8(s, "?"), 40) }
