package tokenclient

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// maxDuration is returned as the wait of a reservation the fill can never pay.
const maxDuration = time.Duration(math.MaxInt64)

// maxAmount bounds every token amount, rate, burst and threshold passed in:
// far more RU than any grant or statement, it keeps the arithmetic finite.
const maxAmount = 1e15

// Bucket is a group's local token bucket on one proxy. It is plain state: it
// starts no goroutine and takes no lock (the caller serializes access), and
// every method takes the current time, so tests drive it with a fake clock.
// The zero value is an empty bucket that does not fill.
//
// Tokens may go negative: that is debt, taken by post-charges (Take) and by
// reservations that must wait; it is paid back by the fill and by grants
// before later reservations run.
//
// Fill: tokens grow at FillRate per second up to the burst, a standing
// fill and a trickle alike: a proxy that does not spend what it is sent
// must not pile up more than the group's capacity, or a burst after an
// idle spell would spend several capacities at once. Grants
// (Reconfigure's tokens) and refunds are delivered whole, even past the
// burst: a grant is sized by what the proxy asked for, and a refund gives
// back what a statement took.
//
// Low-tokens signal: after Take or Reserve leaves fewer tokens than the
// notify threshold, or a reservation has to wait or is refused, NeedsTokens
// reports true once; it stays false until the next Reconfigure or Trickle
// re-arms it. So a burst of statements makes the caller ask rgserver for
// tokens once per grant, not once per statement.
type Bucket struct {
	tokens    float64   // at last; negative is debt
	last      time.Time // when tokens was last brought up to date
	fillRate  float64   // tokens per second
	fillUntil time.Time // zero: the fill does not end
	burst     float64   // > 0: the fill stops at this many tokens
	threshold float64   // notify threshold
	unlimited bool

	fired   bool // the low-tokens signal fired since it was last re-armed
	pending bool // it fired and NeedsTokens has not reported it yet
}

// Reconfigure applies a grant at now: tokens is added to the bucket (a grant;
// it may exceed burst), fillRate (tokens per second, negative counts as 0)
// and burst (the most tokens the fill accumulates to; 0 or negative: no cap)
// replace the previous ones, and notifyThreshold becomes the level under
// which the low-tokens signal fires. Any trickle in progress ends. The
// caller maps BURSTABLE to burst: OFF is fillRate×1 s, MODERATED
// fillRate×10 s; UNLIMITED is SetUnlimited. NaN counts as 0, and every
// amount is clamped to ±1e15.
func (b *Bucket) Reconfigure(now time.Time, tokens, fillRate, burst, notifyThreshold float64) {
	b.reconfigure(now, tokens, fillRate, burst, notifyThreshold, time.Time{})
}

// Trickle applies a trickle grant at now: n tokens delivered evenly over d,
// that is a fill of n/d per second that stops after d, and that stops
// adding tokens while the bucket holds burst or more (0 or less: no cap).
// What the cap holds back is lost, as a standing fill's would be: it is
// capacity the proxy did not use. A d of 0 or less adds the n tokens at
// once.
func (b *Bucket) Trickle(now time.Time, n float64, d time.Duration, burst, notifyThreshold float64) {
	b.Grant(now, 0, n, d, burst, notifyThreshold)
}

// Grant applies a grant of atOnce tokens added whole (as Reconfigure's:
// they may exceed burst) and n tokens delivered as Trickle delivers them.
func (b *Bucket) Grant(now time.Time, atOnce, n float64, d time.Duration, burst, notifyThreshold float64) {
	if d <= 0 {
		b.reconfigure(now, sane(atOnce)+sane(n), 0, burst, notifyThreshold, time.Time{})
		return
	}
	b.reconfigure(now, atOnce, sane(n)/d.Seconds(), burst, notifyThreshold, now.Add(d))
}

func (b *Bucket) reconfigure(now time.Time, tokens, fillRate, burst, threshold float64, until time.Time) {
	b.advance(now)
	b.tokens += sane(tokens)
	b.fillRate = max(sane(fillRate), 0)
	b.burst = sane(burst)
	b.threshold = sane(threshold)
	b.fillUntil = until
	b.fired = false
	b.pending = false
}

// SetUnlimited switches the BURSTABLE=UNLIMITED mode on or off. While on,
// Reserve always succeeds at once and Take and Reserve leave the tokens as
// they are: the group is only metered (by the caller's consumption reports),
// so switching back to a limit does not start in a debt run up while no
// limit applied.
func (b *Bucket) SetUnlimited(on bool) { b.unlimited = on }

// Unlimited reports whether SetUnlimited is on.
func (b *Bucket) Unlimited() bool { return b.unlimited }

// Take post-charges n tokens at now: it never waits and may leave the bucket
// in debt. A negative n gives tokens back (a failed write's refund).
func (b *Bucket) Take(now time.Time, n float64) {
	b.advance(now)
	if b.unlimited {
		return
	}
	b.tokens -= sane(n)
	b.checkLow()
}

// Release gives up the tokens the bucket holds at now (debt stays) and
// lowers its notify threshold to 0: an idle group that gave its saved
// tokens back asks again when a statement needs some, not at once.
func (b *Bucket) Release(now time.Time) {
	b.advance(now)
	if b.unlimited {
		return
	}
	b.tokens = min(b.tokens, 0)
	b.threshold = 0
}

// Refund gives back n tokens at now, e.g. those of a reservation whose
// statement never ran. It is Take(now, -n).
func (b *Bucket) Refund(now time.Time, n float64) { b.Take(now, -n) }

// Reserve pre-charges n tokens at now. When the bucket holds n tokens it
// takes them and returns (0, true). Otherwise it takes them into debt and
// returns how long the fill needs to pay that debt off, after which the
// statement may run; but when that wait would exceed maxWait, or the fill
// stops (no fill, or a trickle that ends) before the debt is paid, it takes
// nothing and returns ok=false at once: the wait it would need at the
// current rate, or the maximum Duration when nothing fills. A negative n
// counts as 0, which still waits for any debt to be paid.
func (b *Bucket) Reserve(now time.Time, n float64, maxWait time.Duration) (wait time.Duration, ok bool) {
	b.advance(now)
	if b.unlimited {
		return 0, true
	}
	n = max(sane(n), 0)
	if n <= b.tokens {
		b.tokens -= n
		b.checkLow()
		return 0, true
	}
	b.signal() // short of tokens: ask for more whatever happens next
	if b.fillRate <= 0 {
		return maxDuration, false
	}
	wait = durationOf((n - b.tokens) / b.fillRate)
	if wait > maxWait || (!b.fillUntil.IsZero() && now.Add(wait).After(b.fillUntil)) {
		return wait, false
	}
	b.tokens -= n
	return wait, true
}

// CanReserve reports whether Reserve(now, n, maxWait) would succeed,
// without taking anything.
func (b *Bucket) CanReserve(now time.Time, n float64, maxWait time.Duration) bool {
	t := b.tokensAt(now)
	n = max(sane(n), 0)
	if b.unlimited || n <= t {
		return true
	}
	rate := b.FillRate(now)
	if rate <= 0 {
		return false
	}
	wait := durationOf((n - t) / rate)
	return wait <= maxWait && (b.fillUntil.IsZero() || !now.Add(wait).After(b.fillUntil))
}

// NeedsTokens reports, once, that the low-tokens signal fired since the last
// Reconfigure or Trickle; see Bucket.
func (b *Bucket) NeedsTokens() bool {
	p := b.pending
	b.pending = false
	return p
}

// Tokens returns the tokens the bucket holds at now, negative when in debt.
func (b *Bucket) Tokens(now time.Time) float64 { return b.tokensAt(now) }

// FillRate returns the fill in tokens per second; 0 once a trickle has ended.
func (b *Bucket) FillRate(now time.Time) float64 {
	if !b.fillUntil.IsZero() && !now.Before(b.fillUntil) {
		return 0
	}
	return b.fillRate
}

// LowTokens reports whether the bucket holds fewer tokens than the notify
// threshold at now. It is the level the one-shot NeedsTokens signal
// watches, for a caller that polls; it is false in unlimited mode.
func (b *Bucket) LowTokens(now time.Time) bool {
	return !b.unlimited && b.tokensAt(now) < b.threshold
}

// String prints the state at now on one line, e.g.
// "tokens=12.50 rate=100.0/s burst=100 threshold=20 debt=0".
func (b *Bucket) String(now time.Time) string {
	t := b.tokensAt(now)
	burst := "none"
	if b.burst > 0 {
		burst = short(b.burst)
	}
	s := fmt.Sprintf("tokens=%.2f rate=%.1f/s burst=%s threshold=%s debt=%s",
		t, b.FillRate(now), burst, short(b.threshold), short(max(-t, 0)))
	if !b.fillUntil.IsZero() && now.Before(b.fillUntil) {
		s += " trickle=" + b.fillUntil.Sub(now).String()
	}
	if b.unlimited {
		s += " unlimited"
	}
	return s
}

// tokensAt is the token count at now without changing the bucket. A clock
// that went backwards fills nothing.
func (b *Bucket) tokensAt(now time.Time) float64 {
	end := now
	if !b.fillUntil.IsZero() && end.After(b.fillUntil) {
		end = b.fillUntil
	}
	if b.fillRate <= 0 || !end.After(b.last) {
		return b.tokens
	}
	capped := b.burst > 0
	if capped && b.tokens >= b.burst {
		return b.tokens // above the burst through a grant: no fill, but no loss
	}
	t := b.tokens + b.fillRate*end.Sub(b.last).Seconds()
	if capped {
		t = min(t, b.burst)
	}
	return t
}

func (b *Bucket) advance(now time.Time) {
	if now.After(b.last) {
		b.tokens = b.tokensAt(now)
		b.last = now
	}
}

func (b *Bucket) checkLow() {
	if b.tokens < b.threshold {
		b.signal()
	}
}

func (b *Bucket) signal() {
	if !b.fired {
		b.fired = true
		b.pending = true
	}
}

// durationOf converts seconds to a Duration, rounding up so that a
// reservation's wait is never short of paying its debt, and saturating.
func durationOf(secs float64) time.Duration {
	ns := math.Ceil(secs * 1e9)
	if ns >= math.MaxInt64 {
		return maxDuration
	}
	return time.Duration(ns)
}

// sane maps NaN to 0 and clamps x to ±maxAmount.
func sane(x float64) float64 {
	if math.IsNaN(x) {
		return 0
	}
	return min(max(x, -maxAmount), maxAmount)
}

// short formats x with at most two decimals and no trailing zeros.
func short(x float64) string {
	return strconv.FormatFloat(math.Round(x*100)/100, 'f', -1, 64)
}
