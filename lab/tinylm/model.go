package tinylm

import (
	"math"
)

// Gains of the weight draw. Random weights with the textbook 1/sqrt(fan-in)
// scale give a model whose next token hardly depends on the context (the
// residual stream is the current token's embedding) and whose top logits
// crowd together. These make attention sharp and its output large against
// the embedding, so that the KV of other positions decides tokens, and
// spread the logits, so that the top-1 margin is clear.
const (
	embedGain = 1.0
	qkGain    = 2.0 // query and key projections: sharper attention
	outGain   = 2.5 // attention output projection: context over token
	mlpGain   = 1.0
	headGain  = 4.0 // LM head: logits spread over several units
	normEps   = 1e-6
)

// Model is a model with its weights. It is read-only once drawn: safe for
// concurrent use (a decode process computes expectations on goroutines).
type Model struct {
	cfg    Config
	embed  []float64 // [Vocab][Hidden]
	final  []float64 // [Hidden]
	head   []float64 // [Vocab][Hidden]
	layers []layer
	// invFreq[i] is RoPE's angle per position of the pair i of a rotated
	// vector of width ropeWidth.
	invFreq []float64
}

// layer holds one layer's weights; matrices are [out][in], row-major.
type layer struct {
	attnNorm, mlpNorm []float64
	// GQA
	wq, wk, wv []float64 // [QHeads*HeadDim][Hidden], [KVHeads*HeadDim][Hidden] x2
	// MLA
	wqm    []float64 // [QHeads*(NoPEDim+RoPEDim)][Hidden]
	wdkv   []float64 // [LatentDim][Hidden]
	kvNorm []float64 // [LatentDim]
	wkr    []float64 // [RoPEDim][Hidden]
	wuk    []float64 // [QHeads*NoPEDim][LatentDim]
	wuv    []float64 // [QHeads*VDim][LatentDim]
	// both
	wo             []float64 // [Hidden][QHeads*(HeadDim or VDim)]
	gate, up, down []float64 // [Inter][Hidden] x2, [Hidden][Inter]
}

// New draws a model's weights from its seed.
func New(cfg Config) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Model{cfg: cfg}
	r := rng{s: cfg.Seed*0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019}
	d := cfg.Hidden
	m.embed = r.matrix(cfg.Vocab, d, embedGain*math.Sqrt(float64(d))) // rows of norm ~sqrt(d)
	m.final = ones(d)
	m.head = r.matrix(cfg.Vocab, d, headGain)
	for l := 0; l < cfg.Layers(); l++ {
		w := layer{attnNorm: ones(d), mlpNorm: ones(d)}
		switch cfg.Arch {
		case GQA:
			w.wq = r.matrix(cfg.QHeads*cfg.HeadDim, d, qkGain)
			w.wk = r.matrix(cfg.KVHeads*cfg.HeadDim, d, qkGain)
			w.wv = r.matrix(cfg.KVHeads*cfg.HeadDim, d, 1)
			w.wo = r.matrix(d, cfg.QHeads*cfg.HeadDim, outGain)
		case MLA:
			w.wqm = r.matrix(cfg.QHeads*(cfg.NoPEDim+cfg.RoPEDim), d, qkGain)
			w.wdkv = r.matrix(cfg.LatentDim, d, 1)
			w.kvNorm = ones(cfg.LatentDim)
			w.wkr = r.matrix(cfg.RoPEDim, d, qkGain)
			w.wuk = r.matrix(cfg.QHeads*cfg.NoPEDim, cfg.LatentDim, 1)
			w.wuv = r.matrix(cfg.QHeads*cfg.VDim, cfg.LatentDim, 1)
			w.wo = r.matrix(d, cfg.QHeads*cfg.VDim, outGain)
		}
		w.gate = r.matrix(cfg.Inter, d, mlpGain)
		w.up = r.matrix(cfg.Inter, d, mlpGain)
		w.down = r.matrix(d, cfg.Inter, mlpGain)
		m.layers = append(m.layers, w)
	}
	width := cfg.HeadDim
	if cfg.Arch == MLA {
		width = cfg.RoPEDim
	}
	for i := 0; i < width/2; i++ {
		m.invFreq = append(m.invFreq, math.Pow(cfg.RoPETheta, -2*float64(i)/float64(width)))
	}
	return m, nil
}

// Config returns the model's configuration.
func (m *Model) Config() Config { return m.cfg }

// Embed returns the hidden states of tokens, one row each.
func (m *Model) Embed(tokens []int) ([][]float64, error) {
	d := m.cfg.Hidden
	out := make([][]float64, len(tokens))
	for i, t := range tokens {
		if t < 0 || t >= m.cfg.Vocab {
			return nil, badInput("token %d at %d: outside the vocabulary of %d", t, i, m.cfg.Vocab)
		}
		out[i] = append([]float64(nil), m.embed[t*d:(t+1)*d]...)
	}
	return out, nil
}

// Logits returns the next-token logits of one hidden state.
func (m *Model) Logits(h []float64) []float64 {
	x := rmsNorm(h, m.final)
	out := make([]float64, m.cfg.Vocab)
	matVec(out, m.head, x)
	return out
}

// Prompt returns n tokens drawn from seed: a deterministic prompt.
func (m *Model) Prompt(seed uint64, n int) []int {
	r := rng{s: seed ^ 0xD1B54A32D192ED03}
	out := make([]int, n)
	for i := range out {
		out[i] = int(r.next() % uint64(m.cfg.Vocab))
	}
	return out
}

// rng is splitmix64: a fixed sequence from a seed.
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s += 0x9E3779B97F4A7C15
	z := r.s
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// normal draws from N(0, 1) (Box-Muller).
func (r *rng) normal() float64 {
	u1 := (float64(r.next()>>11) + 0.5) / (1 << 53)
	u2 := float64(r.next()>>11) / (1 << 53)
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
}

// matrix draws an [out][in] matrix with entries N(0, gain^2/in): a vector
// of unit RMS maps to outputs of RMS about gain.
func (r *rng) matrix(out, in int, gain float64) []float64 {
	w := make([]float64, out*in)
	s := gain / math.Sqrt(float64(in))
	for i := range w {
		w[i] = r.normal() * s
	}
	return w
}

func ones(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

// matVec sets y = W x for W [len(y)][len(x)].
func matVec(y, w, x []float64) {
	n := len(x)
	for o := range y {
		row := w[o*n : (o+1)*n]
		var s float64
		for i, v := range row {
			s += v * x[i]
		}
		y[o] = s
	}
}

// matVecRows sets y = W[lo:lo+len(y)] x: a slice of W's rows.
func matVecRows(y, w []float64, lo int, x []float64) {
	matVec(y, w[lo*len(x):(lo+len(y))*len(x)], x)
}

// addMatVecCols adds W[:, lo:lo+len(x)] x to y, for W [len(y)][cols].
func addMatVecCols(y, w []float64, cols, lo int, x []float64) {
	for o := range y {
		row := w[o*cols+lo : o*cols+lo+len(x)]
		var s float64
		for i, v := range row {
			s += v * x[i]
		}
		y[o] += s
	}
}

func rmsNorm(x, w []float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+normEps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * inv * w[i]
	}
	return out
}

// rope rotates x's pairs (2i, 2i+1) in place by pos times invFreq[i].
func (m *Model) rope(x []float64, pos int) {
	for i := 0; i+1 < len(x); i += 2 {
		a := float64(pos) * m.invFreq[i/2]
		s, c := math.Sincos(a)
		x0, x1 := x[i], x[i+1]
		x[i], x[i+1] = x0*c-x1*s, x0*s+x1*c
	}
}

func silu(x float64) float64 { return x / (1 + math.Exp(-x)) }

// softmaxInPlace turns scores into probabilities.
func softmaxInPlace(s []float64) {
	mx := math.Inf(-1)
	for _, v := range s {
		mx = max(mx, v)
	}
	var sum float64
	for i, v := range s {
		s[i] = math.Exp(v - mx)
		sum += s[i]
	}
	for i := range s {
		s[i] /= sum
	}
}
