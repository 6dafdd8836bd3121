package tokenclient

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// at is t0 plus a number of seconds.
func at(secs float64) time.Time { return t0.Add(time.Duration(secs * float64(time.Second))) }

func wantState(t *testing.T, b *Bucket, now time.Time, want string) {
	t.Helper()
	if got := b.String(now); got != want {
		t.Fatalf("at %v:\n got  %s\n want %s", now.Sub(t0), got, want)
	}
}

func wantReserve(t *testing.T, b *Bucket, now time.Time, n float64, maxWait, wantWait time.Duration, wantOK bool) {
	t.Helper()
	wait, ok := b.Reserve(now, n, maxWait)
	if wait != wantWait || ok != wantOK {
		t.Fatalf("Reserve(%v, %v, %v) = (%v, %v), want (%v, %v)", now.Sub(t0), n, maxWait, wait, ok, wantWait, wantOK)
	}
}

func wantNeeds(t *testing.T, b *Bucket, want bool) {
	t.Helper()
	if got := b.NeedsTokens(); got != want {
		t.Fatalf("NeedsTokens() = %v, want %v", got, want)
	}
}

func TestBucketGrantSpendDebtAndWait(t *testing.T) {
	var b Bucket
	b.Reconfigure(t0, 100, 10, 100, 20)
	wantState(t, &b, t0, "tokens=100.00 rate=10.0/s burst=100 threshold=20 debt=0")

	// Enough tokens: no wait, no signal while above the threshold.
	wantReserve(t, &b, t0, 30, 0, 0, true)
	wantNeeds(t, &b, false)
	// Falling under the threshold raises the signal once.
	wantReserve(t, &b, t0, 60, 0, 0, true)
	wantState(t, &b, t0, "tokens=10.00 rate=10.0/s burst=100 threshold=20 debt=0")
	wantNeeds(t, &b, true)
	wantNeeds(t, &b, false)

	// A post-charge goes into debt and does not signal again.
	b.Take(t0, 50)
	wantState(t, &b, t0, "tokens=-40.00 rate=10.0/s burst=100 threshold=20 debt=40")
	wantNeeds(t, &b, false)

	// Two seconds of fill pay back 20.
	wantState(t, &b, at(2), "tokens=-20.00 rate=10.0/s burst=100 threshold=20 debt=20")
	// 10 more tokens behind a debt of 20: wait for 30 at 10/s.
	wantReserve(t, &b, at(2), 10, 5*time.Second, 3*time.Second, true)
	wantState(t, &b, at(2), "tokens=-30.00 rate=10.0/s burst=100 threshold=20 debt=30")
	// The next one would wait 4 s: over 3 s, it fails fast and takes nothing.
	wantReserve(t, &b, at(2), 10, 3*time.Second, 4*time.Second, false)
	wantState(t, &b, at(2), "tokens=-30.00 rate=10.0/s burst=100 threshold=20 debt=30")

	// A grant re-arms the signal.
	b.Reconfigure(at(2), 50, 10, 100, 20)
	wantState(t, &b, at(2), "tokens=20.00 rate=10.0/s burst=100 threshold=20 debt=0")
	wantNeeds(t, &b, false)
	b.Take(at(2), 1)
	wantNeeds(t, &b, true)
	if !b.LowTokens(at(2)) || b.LowTokens(at(3)) {
		t.Fatalf("LowTokens: want true at 19 tokens, false at 29")
	}
}

func TestBucketBurstCapsFillNotGrants(t *testing.T) {
	var b Bucket
	b.Reconfigure(t0, 0, 10, 50, 0)
	// 10 s at 10/s would be 100, the burst keeps 50.
	wantState(t, &b, at(10), "tokens=50.00 rate=10.0/s burst=50 threshold=0 debt=0")
	// A grant goes past the burst, and the fill neither adds to nor trims it.
	b.Reconfigure(at(10), 200, 10, 50, 0)
	wantState(t, &b, at(20), "tokens=250.00 rate=10.0/s burst=50 threshold=0 debt=0")
	b.Take(at(20), 220)
	wantState(t, &b, at(21), "tokens=40.00 rate=10.0/s burst=50 threshold=0 debt=0")
	wantState(t, &b, at(31), "tokens=50.00 rate=10.0/s burst=50 threshold=0 debt=0")
	// A refund is not capped either: a cancelled reservation costs nothing.
	wantReserve(t, &b, at(31), 45, 0, 0, true)
	b.Refund(at(100), 45)
	wantState(t, &b, at(100), "tokens=95.00 rate=10.0/s burst=50 threshold=0 debt=0")
	// Burst 0: the fill is not capped.
	b.Reconfigure(at(100), 0, 1, 0, 0)
	wantState(t, &b, at(1100), "tokens=1095.00 rate=1.0/s burst=none threshold=0 debt=0")
}

func TestBucketWithoutFillFailsFast(t *testing.T) {
	var b Bucket // the zero value: empty, no fill, the signal armed
	wantReserve(t, &b, t0, 1, time.Hour, maxDuration, false)
	wantNeeds(t, &b, true)
	wantState(t, &b, t0, "tokens=0.00 rate=0.0/s burst=none threshold=0 debt=0")
	// Zero tokens cost nothing and pass.
	wantReserve(t, &b, t0, 0, 0, 0, true)

	// A fill so slow that the wait overflows a Duration saturates and fails.
	b.Reconfigure(t0, 0, 1e-300, 0, 0)
	wantReserve(t, &b, t0, 1, time.Hour, maxDuration, false)
}

func TestBucketDebtDelaysEvenFreeReservations(t *testing.T) {
	var b Bucket
	b.Reconfigure(t0, 0, 100, 100, 0)
	b.Take(t0, 50) // a post-charge
	// A statement with no pre-cost (or a nonsensical negative one) still
	// waits for the debt: later statements pay it back.
	wantReserve(t, &b, t0, 0, time.Second, 500*time.Millisecond, true)
	wantReserve(t, &b, t0, -7, 0, 500*time.Millisecond, false)
	// A negative Take is a refund.
	b.Take(t0, -50)
	wantState(t, &b, t0, "tokens=0.00 rate=100.0/s burst=100 threshold=0 debt=0")
}

func TestBucketTrickle(t *testing.T) {
	var b Bucket
	b.Reconfigure(t0, 0, 0, 30, 5)
	b.Trickle(t0, 100, 10*time.Second, 30, 5)
	wantState(t, &b, t0, "tokens=0.00 rate=10.0/s burst=30 threshold=5 debt=0 trickle=10s")
	wantState(t, &b, at(2), "tokens=20.00 rate=10.0/s burst=30 threshold=5 debt=0 trickle=8s")
	// 40 with 20 in hand: 2 s more, well inside the trickle.
	wantReserve(t, &b, at(2), 40, time.Minute, 2*time.Second, true)
	// 70 more would need 9 s: past the trickle's end, so it cannot be promised.
	wantReserve(t, &b, at(2), 70, time.Minute, 9*time.Second, false)
	// The trickle stops at 10 s, and its fill stopped at the burst: of the
	// 80 it sent after the reservation, 20 paid the debt, 30 are in hand,
	// and 30 were capacity nobody used.
	wantState(t, &b, at(60), "tokens=30.00 rate=0.0/s burst=30 threshold=5 debt=0")
	if r := b.FillRate(at(60)); r != 0 {
		t.Fatalf("FillRate after the trickle = %v, want 0", r)
	}
	if r := b.FillRate(at(5)); r != 10 {
		t.Fatalf("FillRate during the trickle = %v, want 10", r)
	}
	// A trickle of no duration is a plain grant without fill: whole, past
	// the burst.
	b.Trickle(at(60), 12, 0, 30, 5)
	wantState(t, &b, at(70), "tokens=42.00 rate=0.0/s burst=30 threshold=5 debt=0")
	// Above the burst a capped trickle adds nothing, and loses nothing.
	b.Trickle(at(70), 100, 100*time.Second, 30, 0)
	wantState(t, &b, at(71), "tokens=42.00 rate=1.0/s burst=30 threshold=0 debt=0 trickle=1m39s")
	// Without a burst a trickle fills on.
	b.Trickle(at(71), 100, 100*time.Second, 0, 0)
	wantState(t, &b, at(72), "tokens=43.00 rate=1.0/s burst=none threshold=0 debt=0 trickle=1m39s")
	// Reconfigure ends a trickle; the burst caps the fill.
	b.Reconfigure(at(72), 0, 1, 100, 0)
	wantState(t, &b, at(272), "tokens=100.00 rate=1.0/s burst=100 threshold=0 debt=0")
}

func TestBucketUnlimitedOnlyMeters(t *testing.T) {
	var b Bucket
	b.Reconfigure(t0, 10, 0, 0, 100)
	b.SetUnlimited(true)
	if !b.Unlimited() {
		t.Fatal("Unlimited() = false after SetUnlimited(true)")
	}
	wantReserve(t, &b, t0, 1e9, 0, 0, true)
	b.Take(t0, 1e9)
	wantState(t, &b, t0, "tokens=10.00 rate=0.0/s burst=none threshold=100 debt=0 unlimited")
	if b.LowTokens(t0) {
		t.Fatal("LowTokens in unlimited mode")
	}
	wantNeeds(t, &b, false)
	// Back under a limit, no debt was run up meanwhile.
	b.SetUnlimited(false)
	wantReserve(t, &b, t0, 10, 0, 0, true)
	wantReserve(t, &b, t0, 1, time.Hour, maxDuration, false)
	wantNeeds(t, &b, true)
}

func TestBucketClockGoingBackFillsNothing(t *testing.T) {
	var b Bucket
	b.Reconfigure(at(10), 0, 10, 0, 0)
	b.Take(at(5), 10) // an earlier timestamp from another goroutine
	wantState(t, &b, at(5), "tokens=-10.00 rate=10.0/s burst=none threshold=0 debt=10")
	wantState(t, &b, at(11), "tokens=0.00 rate=10.0/s burst=none threshold=0 debt=0")
}

func TestBucketSanitizesArguments(t *testing.T) {
	var b Bucket
	b.Reconfigure(t0, math.NaN(), math.NaN(), math.NaN(), math.NaN())
	wantState(t, &b, at(10), "tokens=0.00 rate=0.0/s burst=none threshold=0 debt=0")
	b.Reconfigure(t0, 5, -3, 0, 0) // a negative rate does not drain
	wantState(t, &b, at(10), "tokens=5.00 rate=0.0/s burst=none threshold=0 debt=0")
	wantReserve(t, &b, t0, math.NaN(), 0, 0, true)
	// Infinities are clamped to ±1e15, so the arithmetic stays finite.
	b.Take(t0, math.Inf(1))
	wantState(t, &b, t0, "tokens=-999999999999995.00 rate=0.0/s burst=none threshold=0 debt=999999999999995")
	b.Reconfigure(t0, math.Inf(1), math.Inf(1), math.Inf(-1), math.Inf(-1))
	wantState(t, &b, at(1), "tokens=1000000000000005.00 rate=1000000000000000.0/s burst=none threshold=-1000000000000000 debt=0")
}

// limiter is what the property checker drives: *Bucket, or a broken one.
type limiter interface {
	Reconfigure(now time.Time, tokens, fillRate, burst, notifyThreshold float64)
	Trickle(now time.Time, n float64, d time.Duration, burst, notifyThreshold float64)
	Take(now time.Time, n float64)
	Reserve(now time.Time, n float64, maxWait time.Duration) (time.Duration, bool)
	Tokens(now time.Time) float64
}

// supply is the checker's own account of the most the bucket may hand out:
// initial tokens + grants + refunds + fill × elapsed, with a trickle's fill
// ending when the trickle does. It ignores the burst, which only lowers it.
type supply struct {
	total float64
	at    time.Time
	rate  float64
	until time.Time
}

func (s *supply) advance(now time.Time) {
	end := now
	if !s.until.IsZero() && end.After(s.until) {
		end = s.until
	}
	if end.After(s.at) {
		s.total += s.rate * end.Sub(s.at).Seconds()
	}
	if now.After(s.at) {
		s.at = now
	}
}

var (
	errOverAdmitted  = errors.New("handed out more than the supply")
	errUnderAdmitted = errors.New("under saturating demand handed out less than 99% of the supply")
)

// checkBucket runs seeded random operation sequences against fresh limiters.
// One simulated worker runs statements one after another, so a granted
// reservation's wait moves the clock. Every sequence runs twice: with random
// demand and idle time, checking that at every admission the tokens handed
// out (reservations and post-charges, less refunds) stay within the supply;
// and with saturating demand (no idle time, waits allowed up to an hour, a
// refused statement retried 100 ms later), checking that too and that the
// worker ends with at least 99% of the supply.
func checkBucket(sequences int, newLimiter func() limiter) error {
	for seq := range sequences {
		for _, saturate := range []bool{false, true} {
			if err := runSequence(uint64(seq), saturate, newLimiter()); err != nil {
				return fmt.Errorf("sequence %d (saturating=%v): %w", seq, saturate, err)
			}
		}
	}
	return nil
}

func runSequence(seed uint64, saturate bool, l limiter) error {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	now := t0
	var sup supply
	sup.at = now
	handed := 0.0
	lastReserved := 0.0

	randRate := func() float64 {
		if rng.IntN(5) == 0 {
			return 0
		}
		return rng.Float64() * 200
	}
	randBurst := func(rate float64) float64 {
		switch rng.IntN(4) {
		case 0:
			return 0
		case 1:
			return rate
		case 2:
			return rate * 10
		}
		return rng.Float64() * 100
	}
	grant := func(tokens float64) {
		rate := randRate()
		sup.advance(now)
		sup.total += tokens
		sup.rate, sup.until = rate, time.Time{}
		l.Reconfigure(now, tokens, rate, randBurst(rate), rng.Float64()*50)
	}
	admitted := func() error {
		sup.advance(now)
		if handed > sup.total+1e-6*math.Max(1, sup.total) {
			return fmt.Errorf("%w: %.6f > %.6f at %v", errOverAdmitted, handed, sup.total, now.Sub(t0))
		}
		return nil
	}

	grant(rng.Float64() * 100)
	for range 20 + rng.IntN(60) {
		switch p := rng.IntN(100); {
		case p < 10:
			grant(rng.Float64() * 200)
		case p < 15:
			n := rng.Float64() * 500
			d := time.Duration(rng.IntN(10_000)) * time.Millisecond
			sup.advance(now)
			if d <= 0 {
				sup.total += n
				sup.rate, sup.until = 0, time.Time{}
			} else {
				sup.rate, sup.until = n/d.Seconds(), now.Add(d)
			}
			l.Trickle(now, n, d, 0, rng.Float64()*50) // uncapped: the checker counts every token sent
		case p < 30:
			n := rng.Float64() * 20
			l.Take(now, n)
			handed += n
		case p < 35:
			// The statement of the last reservation never ran.
			l.Take(now, -lastReserved)
			sup.advance(now)
			handed -= lastReserved
			lastReserved = 0
		case p < 45 && !saturate:
			now = now.Add(time.Duration(rng.IntN(5000)) * time.Millisecond)
		default:
			n := rng.Float64() * 50
			maxWait := time.Hour
			if !saturate {
				maxWait = time.Duration(rng.IntN(10_000)) * time.Millisecond
			}
			wait, ok := l.Reserve(now, n, maxWait)
			if !ok {
				if saturate {
					now = now.Add(100 * time.Millisecond)
				}
				continue
			}
			if wait < 0 || wait > maxWait {
				return fmt.Errorf("granted wait %v outside [0, %v]", wait, maxWait)
			}
			now = now.Add(wait)
			handed += n
			lastReserved = n
			if err := admitted(); err != nil {
				return err
			}
		}
	}
	if !saturate {
		return nil
	}
	// Saturating demand ends by asking for whatever the bucket holds.
	if left := l.Tokens(now); left > 0 {
		if wait, ok := l.Reserve(now, left, time.Hour); ok {
			now = now.Add(wait)
			handed += left
			if err := admitted(); err != nil {
				return err
			}
		}
	}
	sup.advance(now)
	if handed < 0.99*sup.total-1e-6 {
		return fmt.Errorf("%w: %.6f of %.6f at %v", errUnderAdmitted, handed, sup.total, now.Sub(t0))
	}
	return nil
}

func TestBucketNeverOverOrUnderAdmits(t *testing.T) {
	if err := checkBucket(10_000, func() limiter { return new(Bucket) }); err != nil {
		t.Fatal(err)
	}
}

// Broken buckets, to show that each property can fail.

// overGenerous never makes anyone wait.
type overGenerous struct{ Bucket }

func (b *overGenerous) Reserve(now time.Time, n float64, _ time.Duration) (time.Duration, bool) {
	b.Take(now, n)
	return 0, true
}

// neverGrants refuses every reservation.
type neverGrants struct{ Bucket }

func (*neverGrants) Reserve(time.Time, float64, time.Duration) (time.Duration, bool) { return 0, false }

// neverFills ignores fill rates and trickles.
type neverFills struct{ Bucket }

func (b *neverFills) Reconfigure(now time.Time, tokens, _, burst, threshold float64) {
	b.Bucket.Reconfigure(now, tokens, 0, burst, threshold)
}

func (b *neverFills) Trickle(now time.Time, _ float64, d time.Duration, burst, threshold float64) {
	b.Bucket.Trickle(now, 0, d, burst, threshold)
}

// paysTooEarly waits only half as long as the debt needs.
type paysTooEarly struct{ Bucket }

func (b *paysTooEarly) Reserve(now time.Time, n float64, maxWait time.Duration) (time.Duration, bool) {
	wait, ok := b.Bucket.Reserve(now, n, maxWait)
	return wait / 2, ok
}

func TestCheckerCatchesBrokenBuckets(t *testing.T) {
	tests := []struct {
		name string
		new  func() limiter
		want error
	}{
		{"over-generous", func() limiter { return new(overGenerous) }, errOverAdmitted},
		{"pays too early", func() limiter { return new(paysTooEarly) }, errOverAdmitted},
		{"never grants", func() limiter { return new(neverGrants) }, errUnderAdmitted},
		{"never fills", func() limiter { return new(neverFills) }, errUnderAdmitted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkBucket(10_000, tc.new)
			if !errors.Is(err, tc.want) {
				t.Fatalf("checker returned %v, want %v", err, tc.want)
			}
			t.Log(err)
		})
	}
}

// FuzzBucket drives a bucket with arbitrary operations and arguments and
// checks what must hold whatever the input: tokens stay finite, a granted
// reservation waits within [0, maxWait], a refused one takes nothing, and
// NeedsTokens fires at most once between two re-arms.
func FuzzBucket(f *testing.F) {
	f.Add([]byte{0, 10, 1, 20, 2, 30, 3, 40, 4, 50})
	f.Add([]byte{5, 255, 1, 255, 255, 255, 255, 255, 255, 255, 255, 2, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var b Bucket
		now := t0
		fired := false
		next := func() float64 { // a value from the input, sometimes extreme
			if len(ops) < 8 {
				return 0
			}
			v := math.Float64frombits(binary.LittleEndian.Uint64(ops))
			ops = ops[8:]
			return v
		}
		for len(ops) > 0 {
			op := ops[0] % 7
			ops = ops[1:]
			switch op {
			case 0:
				b.Reconfigure(now, next(), next(), next(), next())
				fired = false
			case 1:
				b.Trickle(now, next(), time.Duration(next()), next(), next())
				fired = false
			case 2:
				b.Take(now, next())
			case 3:
				maxWait := time.Duration(int64(next()))
				before := b.Tokens(now)
				wait, ok := b.Reserve(now, next(), maxWait)
				if ok && (wait < 0 || wait > max(maxWait, 0)) {
					t.Fatalf("granted wait %v outside [0, %v]", wait, maxWait)
				}
				if !ok && b.Tokens(now) != before {
					t.Fatalf("refused reservation changed tokens %v -> %v", before, b.Tokens(now))
				}
			case 4:
				now = now.Add(time.Duration(int64(next())))
			case 5:
				b.SetUnlimited(!b.Unlimited())
			case 6:
				if b.NeedsTokens() {
					if fired {
						t.Fatal("NeedsTokens fired twice without a re-arm")
					}
					fired = true
				}
			}
			if tk := b.Tokens(now); math.IsNaN(tk) || math.IsInf(tk, 0) {
				t.Fatalf("tokens not finite: %s", b.String(now))
			}
			_ = b.String(now)
		}
	})
}
