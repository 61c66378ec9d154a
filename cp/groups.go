package cp

// Groups splits hook layers 0..F-1 into groups of k consecutive layers. A
// group ends at layer l when (l+1) % k == 0 or l == F-1, so the last group may
// be partial. One submit serves one group.
type Groups struct {
	F, K int
}

// NewGroups validates F and k.
func NewGroups(f, k int) (Groups, error) {
	switch {
	case f < 1:
		return Groups{}, badInput("hook layers %d: must be at least 1", f)
	case k < 1:
		return Groups{}, badInput("group size %d: must be at least 1", k)
	}
	return Groups{F: f, K: k}, nil
}

// Count is the number of groups. It divides before it adds, so that no F
// and K (math.MaxInt layers included) overflow: (F+K-1)/K wrapped to a
// negative count.
func (g Groups) Count() int {
	if g.F <= 0 {
		return 0
	}
	return (g.F-1)/g.K + 1
}

// Of returns the group of hook layer l.
func (g Groups) Of(l int) int { return l / g.K }

// Boundary reports whether hook layer l closes its group.
func (g Groups) Boundary(l int) bool { return (l+1)%g.K == 0 || l == g.F-1 }

// Layers returns the hook layers [lo, hi) of group i (0 <= i < Count()).
// hi is lo plus what is left of F, at most K: (i+1)*K may exceed the int
// range where F and K are close to it.
func (g Groups) Layers(i int) (lo, hi int) {
	lo = i * g.K
	return lo, lo + min(g.K, g.F-lo)
}
