// Package topn keeps the first n items of a stream in a given order, in
// memory proportional to n: the status consoles list the busiest of up to
// 100,000 groups, and the heaviest statement shapes, without sorting (or
// holding) them all.
package topn

import "slices"

// Keeper keeps the n items that come first by less among those offered.
// The zero value keeps nothing; it is not safe for concurrent use.
type Keeper[T any] struct {
	n    int
	less func(a, b T) bool
	// h is a heap whose root is the last kept item (the first to go).
	h []T
}

// New returns a Keeper of at most n items (none when n ≤ 0), ordered by
// less: less(a, b) means a comes before b.
func New[T any](n int, less func(a, b T) bool) *Keeper[T] {
	return &Keeper[T]{n: max(n, 0), less: less}
}

// Offer keeps x when fewer than n items are kept or x comes before the
// last kept one, which then goes. O(log n).
func (k *Keeper[T]) Offer(x T) {
	switch {
	case k.n == 0:
	case len(k.h) < k.n:
		k.h = append(k.h, x)
		k.up(len(k.h) - 1)
	case k.less(x, k.h[0]):
		k.h[0] = x
		k.down(0)
	}
}

// Len is how many items are kept.
func (k *Keeper[T]) Len() int { return len(k.h) }

// Sorted returns the kept items in order and empties the Keeper.
func (k *Keeper[T]) Sorted() []T {
	out := k.h
	k.h = nil
	slices.SortFunc(out, func(a, b T) int {
		switch {
		case k.less(a, b):
			return -1
		case k.less(b, a):
			return 1
		}
		return 0
	})
	return out
}

// after reports whether h[i] comes after h[j]: the heap keeps the item
// that comes last at the root.
func (k *Keeper[T]) after(i, j int) bool { return k.less(k.h[j], k.h[i]) }

func (k *Keeper[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !k.after(i, p) {
			return
		}
		k.h[i], k.h[p] = k.h[p], k.h[i]
		i = p
	}
}

func (k *Keeper[T]) down(i int) {
	for {
		c := 2*i + 1
		if c >= len(k.h) {
			return
		}
		if r := c + 1; r < len(k.h) && k.after(r, c) {
			c = r
		}
		if !k.after(c, i) {
			return
		}
		k.h[i], k.h[c] = k.h[c], k.h[i]
		i = c
	}
}
