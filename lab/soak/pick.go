package soak

import (
	"math/rand/v2"
	"slices"
)

// picker chooses a lane's kinds: each kind of positive weight until it was
// covered once (in a seeded order), then at random by weight. A short soak
// (--episodes 4) thus runs every kind.
type picker struct {
	rng       *rand.Rand
	kinds     []Kind
	mix       Mix
	uncovered []Kind
}

func newPicker(rng *rand.Rand, kinds []Kind, mix Mix) *picker {
	p := &picker{rng: rng, kinds: kinds, mix: mix}
	for _, k := range kinds {
		if mix[k] > 0 {
			p.uncovered = append(p.uncovered, k)
		}
	}
	rng.Shuffle(len(p.uncovered), func(i, j int) { p.uncovered[i], p.uncovered[j] = p.uncovered[j], p.uncovered[i] })
	return p
}

// next is the kind to run next: the first not covered yet, else one drawn
// by weight.
func (p *picker) next() Kind {
	if len(p.uncovered) > 0 {
		return p.uncovered[0]
	}
	n := p.rng.IntN(p.mix.total(p.kinds))
	for _, k := range p.kinds {
		if n -= p.mix[k]; n < 0 {
			return k
		}
	}
	return p.kinds[0] // not reached: total > 0
}

// covered says k ran as itself (its fault happened).
func (p *picker) covered(k Kind) {
	if i := slices.Index(p.uncovered, k); i >= 0 {
		p.uncovered = slices.Delete(p.uncovered, i, i+1)
	}
}

// done reports whether every kind of positive weight was covered.
func (p *picker) done() bool { return len(p.uncovered) == 0 }
