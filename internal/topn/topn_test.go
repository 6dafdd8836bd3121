package topn

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestKeeperKeepsTheFirstN(t *testing.T) {
	less := func(a, b int) bool { return a < b }
	for _, tc := range []struct {
		name  string
		n     int
		items []int
		want  []int
	}{
		{"none kept", 0, []int{3, 1, 2}, nil},
		{"fewer than n", 5, []int{3, 1, 2}, []int{1, 2, 3}},
		{"exactly n", 3, []int{3, 1, 2}, []int{1, 2, 3}},
		{"more than n", 2, []int{5, 4, 3, 2, 1}, []int{1, 2}},
		{"ascending", 2, []int{1, 2, 3, 4, 5}, []int{1, 2}},
		{"duplicates", 3, []int{2, 2, 1, 2, 1}, []int{1, 1, 2}},
		{"negative n", -1, []int{1}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := New(tc.n, less)
			for _, x := range tc.items {
				k.Offer(x)
			}
			if got := k.Sorted(); !slices.Equal(got, tc.want) {
				t.Fatalf("kept %v, want %v", got, tc.want)
			}
		})
	}
}

// Against a full sort, on random streams and orders.
func TestKeeperMatchesSort(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		items := make([]int, r.IntN(300))
		for i := range items {
			items[i] = r.IntN(100)
		}
		n := r.IntN(50)
		desc := round%2 == 1
		less := func(a, b int) bool { return a < b }
		if desc {
			less = func(a, b int) bool { return a > b }
		}
		k := New(n, less)
		for _, x := range items {
			k.Offer(x)
		}
		want := slices.Clone(items)
		slices.Sort(want)
		if desc {
			slices.Reverse(want)
		}
		want = want[:min(n, len(want))]
		if k.Len() != len(want) {
			t.Fatalf("round %d: Len %d, want %d", round, k.Len(), len(want))
		}
		if got := k.Sorted(); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("round %d (n=%d desc=%v): kept %v, want %v", round, n, desc, got, want)
		}
	}
}
