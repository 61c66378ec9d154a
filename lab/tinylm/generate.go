package tinylm

import (
	"math"

	"github.com/kvstream/kvstream/cp/reshard"
)

// Step is one greedy pick: the argmax of the logits and its margin over the
// runner-up.
type Step struct {
	Token  int
	Margin float64
	Logits []float64
}

// Pick returns the greedy step of logits (the lowest index on a tie, whose
// margin is then 0).
func Pick(logits []float64) Step {
	best, second := 0, -1
	for i := 1; i < len(logits); i++ {
		switch {
		case logits[i] > logits[best]:
			best, second = i, best
		case second < 0 || logits[i] > logits[second]:
			second = i
		}
	}
	margin := math.Inf(1)
	if second >= 0 {
		margin = logits[best] - logits[second]
	}
	return Step{Token: best, Margin: margin, Logits: logits}
}

// Generation is a greedy decode, one step per generated token.
type Generation struct {
	Steps []Step
}

// Tokens returns the generated tokens.
func (g *Generation) Tokens() []int {
	out := make([]int, len(g.Steps))
	for i, s := range g.Steps {
		out[i] = s.Token
	}
	return out
}

// MinMargin is the smallest top-1 margin over the steps (+Inf when none).
func (g *Generation) MinMargin() float64 {
	m := math.Inf(1)
	for _, s := range g.Steps {
		m = min(m, s.Margin)
	}
	return m
}

// Forward runs every layer of a side over a block of tokens at cache slots
// first.. (RoPE positions rope; nil means the slots), through each PP stage
// in turn (stages[s] are stage s's TP ranks, as NewCaches builds them), and
// returns the last token's hidden state: a prefill chunk, or one decode
// step.
func (m *Model) Forward(stages [][]*Cache, tokens []int, first int, rope []int) ([]float64, error) {
	if len(tokens) == 0 {
		return nil, badInput("forward of no token")
	}
	if rope == nil {
		rope = make([]int, len(tokens))
		for i := range rope {
			rope[i] = first + i
		}
	}
	h, err := m.Embed(tokens)
	if err != nil {
		return nil, err
	}
	if err := m.checkStages(stages); err != nil {
		return nil, err
	}
	for st, ranks := range stages {
		lo, hi := ranks[0].Side.StageLayers(st)
		for l := lo; l < hi; l++ {
			if err := m.Layer(l, h, first, rope, ranks); err != nil {
				return nil, err
			}
		}
	}
	return h[len(h)-1], nil
}

func (m *Model) checkStages(stages [][]*Cache) error {
	if len(stages) == 0 || len(stages[0]) == 0 {
		return badInput("no cache")
	}
	s := &stages[0][0].Side
	if len(stages) != s.PP() {
		return badInput("%d stages of caches, the side has %d PP stages", len(stages), s.PP())
	}
	for st, ranks := range stages {
		if len(ranks) == 0 || ranks[0].Rank.Stage != st {
			return badInput("PP stage %d: no cache of that stage", st)
		}
	}
	return nil
}

// Generate decodes n tokens greedily after a prompt of start tokens whose
// KV the caches hold: step i feeds its token (first, the prefill's pick,
// then the previous step's) at cache slot and RoPE position start+i through
// every stage, writing the token's KV into the pages and attending over the
// request's KV read from them, and picks the argmax of its logits.
func (m *Model) Generate(stages [][]*Cache, start, first, n int) (Generation, error) {
	var g Generation
	tok := first
	for i := 0; i < n; i++ {
		h, err := m.Forward(stages, []int{tok}, start+i, nil)
		if err != nil {
			return g, err
		}
		s := Pick(m.Logits(h))
		g.Steps = append(g.Steps, s)
		tok = s.Token
	}
	return g, nil
}

// referencePage is the page size of Reference's private pool.
const referencePage = 16

// Reference is the model on its own: the prompt in one forward on one rank
// (no TP, no PP, no chunking, no transfer), its KV in a private pool, then
// n greedy steps. It returns the prefill's pick (the first token) and the
// decode's steps after it.
func (m *Model) Reference(prompt []int, n int) (Step, Generation, error) {
	side := m.cfg.Side(1, nil, referencePage, reshard.TokenMajor)
	pages := (len(prompt) + n + referencePage - 1) / referencePage
	pool := NewMemPool(side.Layers*side.Kinds(), int(side.ItemLen()), pages)
	ids := make([]int, pages)
	for i := range ids {
		ids[i] = i
	}
	stages, err := NewCaches(side, [][]Pool{{pool}}, ids)
	if err != nil {
		return Step{}, Generation{}, err
	}
	h, err := m.Forward(stages, prompt, 0, nil)
	if err != nil {
		return Step{}, Generation{}, err
	}
	first := Pick(m.Logits(h))
	g, err := m.Generate(stages, len(prompt), first.Token, n)
	return first, g, err
}

// Comparison is how a generation compares with a reference.
type Comparison struct {
	// Equal: the same tokens at every step.
	Equal bool
	// FirstDiff is the first step whose tokens differ (-1: none).
	FirstDiff int
	// MaxLogitDiff is the largest absolute logit difference over the steps
	// decoded from the same inputs: up to and including the first
	// difference (after it, the inputs differ).
	MaxLogitDiff float64
}

// Compare compares got with want, step by step.
func Compare(got, want *Generation) Comparison {
	c := Comparison{Equal: len(got.Steps) == len(want.Steps), FirstDiff: -1}
	for i := 0; i < min(len(got.Steps), len(want.Steps)); i++ {
		a, b := got.Steps[i], want.Steps[i]
		for j := 0; j < min(len(a.Logits), len(b.Logits)); j++ {
			c.MaxLogitDiff = max(c.MaxLogitDiff, math.Abs(a.Logits[j]-b.Logits[j]))
		}
		if len(a.Logits) != len(b.Logits) {
			c.MaxLogitDiff = math.Inf(1)
		}
		if a.Token != b.Token {
			c.Equal, c.FirstDiff = false, i
			break
		}
	}
	if c.FirstDiff < 0 && len(got.Steps) != len(want.Steps) {
		c.FirstDiff = min(len(got.Steps), len(want.Steps))
	}
	return c
}

// Verdict is a decode side's check of the KV it received: its tokens
// against the model's own.
type Verdict struct {
	Tokens, Reference []int
	Comparison
	// FirstEqual: the prefill's first token is the model's.
	FirstEqual bool
	// MinMargin is the smallest top-1 margin of the reference (its first
	// token included): equality is not luck when it is far above
	// LogitTolerance.
	MinMargin float64
}

// OK reports whether the tokens are equal and the logits within
// LogitTolerance.
func (v *Verdict) OK() bool {
	return v.Equal && v.FirstEqual && v.MaxLogitDiff <= LogitTolerance
}

// Expected is the model's own generation of a prompt (Reference): what a
// decode side compares the tokens it decodes with. A decode process can
// compute it while the prompt's KV is still on its way.
type Expected struct {
	// PromptLen is the prompt's length: the decode starts there.
	PromptLen int
	// First is the model's pick after the prompt, Gen the steps after it.
	First Step
	Gen   Generation
}

// Expect returns the model's own generation of n tokens after prompt.
func (m *Model) Expect(prompt []int, n int) (*Expected, error) {
	first, g, err := m.Reference(prompt, n)
	if err != nil {
		return nil, err
	}
	return &Expected{PromptLen: len(prompt), First: first, Gen: g}, nil
}

// Check is what a decode side runs once a request's KV has arrived in its
// pools: it decodes n tokens from the caches (the decode side's ranks, as
// NewCaches builds them over its pools and the request's page list) for
// prompt, fed the prefill's first token, and compares them with the
// model's own generation of the same prompt (Reference).
func (m *Model) Check(stages [][]*Cache, prompt []int, first, n int) (Verdict, error) {
	e, err := m.Expect(prompt, n)
	if err != nil {
		return Verdict{}, err
	}
	return m.CheckAgainst(stages, e, first)
}

// CheckAgainst is Check against an expectation computed beforehand: it
// decodes as many tokens as e holds from the caches, after e.PromptLen
// prompt tokens, fed first.
func (m *Model) CheckAgainst(stages [][]*Cache, e *Expected, first int) (Verdict, error) {
	got, err := m.Generate(stages, e.PromptLen, first, len(e.Gen.Steps))
	if err != nil {
		return Verdict{}, err
	}
	return Verdict{Tokens: got.Tokens(), Reference: e.Gen.Tokens(), Comparison: Compare(&got, &e.Gen),
		FirstEqual: first == e.First.Token, MinMargin: min(e.First.Margin, e.Gen.MinMargin())}, nil
}
