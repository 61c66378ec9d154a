package reshard

import (
	"fmt"
	"testing"

	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard/reshardtest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// The byte oracle for resharding. Every prefill rank (PP stage x TP rank x CP
// rank) holds its share of a request's KV in its own page buffers; the
// reference (package reshardtest) gathers it into one logical
// [layer][kind][token][head][byte] tensor and re-splits that for every decode
// rank, element by element, with nothing from this package but the sides'
// parameters. The plan under test
// is applied the way the engine will apply it: chunk by chunk, each CP rank
// filtering its pages with cp, each route turning the chunk's runs into
// blocks that are copied into zeroed decode buffers. Every decode byte must
// equal the reference and be written exactly once; a byte outside the
// request's pages must stay untouched.

// world is one request on a pairing: the page tables and the chunking.
type world struct {
	pair     Pairing
	cp       cp.CP // Size and Rule; the rank varies
	sendRule cp.Rule
	tokens   int
	ends     []int // chunk ends in tokens; the last is tokens
	srcPool  int
	srcPages []int // position -> prefill page, shared by every prefill rank
	dstPool  int
	dstPages [][]int // decode rank index (stage*TP + tp) -> position -> page
	// corrupt, when set, may alter a prefill rank's plan before it is applied.
	corrupt func(src Rank, cpRank int, p *Plan)
	// tamper, when set, may alter the prefill buffers after they are filled.
	tamper func(src map[reshardtest.Rank]rankBufs)
}

func (w *world) pages() int {
	return (w.tokens + w.pair.Prefill.PageSize - 1) / w.pair.Prefill.PageSize
}

type rankBufs = reshardtest.Bufs

// side restates a side for the reference.
func side(s *Side) reshardtest.Side {
	return reshardtest.Side{Layers: s.Layers, KVHeads: s.KVHeads, HeadDim: s.HeadDim, ElemBytes: s.ElemBytes, MLA: s.MLA,
		TP: s.TP, Stages: s.Stages, PageSize: s.PageSize, HeadMajor: s.Order == HeadMajor}
}

// request is the world's request for the reference.
func (w *world) request() *reshardtest.Request {
	return &reshardtest.Request{Prefill: side(&w.pair.Prefill), Decode: side(&w.pair.Decode), CPSize: w.cp.Size, CPRule: w.cp.Rule,
		Tokens: w.tokens, SrcPool: w.srcPool, SrcPages: w.srcPages, DstPool: w.dstPool, DstPages: w.dstPages}
}

// apply runs every prefill rank's plan over the chunks into zeroed decode
// buffers, counting the writes of every byte. It returns an error, never
// panics, on a block out of bounds or a block that could have merged with
// the previous one.
func (w *world) apply(src map[reshardtest.Rank]rankBufs) (got []rankBufs, count [][][]uint8, err error) {
	pre, dec := &w.pair.Prefill, &w.pair.Decode
	sd := side(dec)
	item := sd.ItemLen()
	kinds, T := dec.Kinds(), w.pages()
	for st := 0; st < dec.PP(); st++ {
		lo, hi := dec.StageLayers(st)
		for range dec.TP {
			bufs := make(rankBufs, (hi-lo)*kinds)
			cnt := make([][]uint8, len(bufs))
			for i := range bufs {
				bufs[i] = make([]byte, w.dstPool*item)
				cnt[i] = make([]uint8, len(bufs[i]))
			}
			got, count = append(got, bufs), append(count, cnt)
		}
	}
	var blocks []cp.Block
	for st := 0; st < pre.PP(); st++ {
		for tp := 0; tp < pre.TP; tp++ {
			for c := 0; c < w.cp.Size; c++ {
				me := Rank{TP: tp, Stage: st}
				plan, err := NewPlan(&w.pair, me)
				if err != nil {
					return nil, nil, err
				}
				if w.corrupt != nil {
					w.corrupt(me, c, plan)
				}
				bufs := src[reshardtest.Rank{Stage: st, TP: tp, CP: c}]
				filter := cp.CP{Size: w.cp.Size, Rank: c, Rule: w.sendRule}
				start := 0
				for k, end := range w.ends {
					last := k == len(w.ends)-1
					r, err := cp.ChunkRange(start, end, pre.PageSize, last)
					if err != nil {
						return nil, nil, err
					}
					start = r.End
					owned, pos, err := filter.Owned(w.srcPages[r.PageStart:r.PageStart+r.Pages], r.PageStart, T)
					if err != nil {
						return nil, nil, err
					}
					for di := range plan.Routes {
						route := &plan.Routes[di]
						dst, err := cp.DstPages(w.dstPages[di], pos)
						if err != nil {
							return nil, nil, err
						}
						runs, err := cp.Coalesce(owned, dst)
						if err != nil {
							return nil, nil, err
						}
						for b := range bufs {
							db, ok := route.DstBuffer(b)
							if !ok {
								continue
							}
							if db >= len(got[di]) {
								return nil, nil, fmt.Errorf("prefill %+v buffer %d maps to decode %+v buffer %d of %d", me, b, route.Dest, db, len(got[di]))
							}
							blocks = route.AppendBlocks(blocks[:0], runs, 0, 0)
							if n := route.Blocks(runs); n != len(blocks) {
								return nil, nil, fmt.Errorf("route to %+v: Blocks says %d, AppendBlocks made %d", route.Dest, n, len(blocks))
							}
							from, to := bufs[b], got[di][db]
							for i, blk := range blocks {
								if blk.Src+blk.Len > uint64(len(from)) || blk.Dst+blk.Len > uint64(len(to)) {
									return nil, nil, fmt.Errorf("prefill %+v buffer %d -> decode %+v: block %+v outside %d / %d bytes", me, b, route.Dest, blk, len(from), len(to))
								}
								if i > 0 {
									if p := blocks[i-1]; p.Src+p.Len == blk.Src && p.Dst+p.Len == blk.Dst {
										return nil, nil, fmt.Errorf("prefill %+v -> decode %+v: blocks %+v and %+v could be one", me, route.Dest, p, blk)
									}
								}
								copy(to[blk.Dst:blk.Dst+blk.Len], from[blk.Src:blk.Src+blk.Len])
								for j := blk.Dst; j < blk.Dst+blk.Len; j++ {
									count[di][db][j]++
								}
							}
						}
					}
				}
			}
		}
	}
	return got, count, nil
}

// check runs the oracle: nil when the plan's writes equal the reference,
// else an error naming the first byte written a wrong number of times and
// the first byte with a wrong value (either may be missing).
func (w *world) check() error {
	req := w.request()
	src := req.Fill()
	if w.tamper != nil {
		w.tamper(src)
	}
	want, mask := req.Reference(src)
	got, count, err := w.apply(src)
	if err != nil {
		return err
	}
	dec := &w.pair.Decode
	var badCount, badByte string
	for di := range want {
		d := Rank{TP: di % dec.TP, Stage: di / dec.TP}
		for b := range want[di] {
			for j := range want[di][b] {
				n := uint8(0)
				if mask[di][b][j] {
					n = 1
				}
				if count[di][b][j] != n && badCount == "" {
					badCount = fmt.Sprintf("decode %+v buffer %d byte %d: written %d times, want %d", d, b, j, count[di][b][j], n)
				}
				if got[di][b][j] != want[di][b][j] && badByte == "" {
					badByte = fmt.Sprintf("decode %+v buffer %d byte %d: mismatch: got %d, want %d", d, b, j, got[di][b][j], want[di][b][j])
				}
			}
		}
	}
	if badCount == "" && badByte == "" {
		return nil
	}
	return fmt.Errorf("%s; %s", badCount, badByte)
}

type namedPair struct {
	name        string
	heads, p, d int
	mla         bool
}

var namedPairs = []namedPair{
	{"GQA 8 heads TP 8->16", 8, 8, 16, false},
	{"GQA 8 heads TP 16->8", 8, 16, 8, false},
	{"GQA 8 heads TP 1->2", 8, 1, 2, false},
	{"GQA 8 heads TP 4->8", 8, 4, 8, false},
	{"GQA 8 heads TP 2->4", 8, 2, 4, false},
	{"GQA 4 heads TP 8->2", 4, 8, 2, false},
	{"MLA TP 8->16", 1, 8, 16, true},
	{"MLA TP 4->1", 1, 4, 1, true},
}

// drawStages cuts layers into 1..3 PP stages.
func drawStages(t *rapid.T, layers int, label string) []int {
	n := rapid.IntRange(1, min(3, layers)).Draw(t, label)
	if n == 1 && rapid.Bool().Draw(t, label+"Nil") {
		return nil
	}
	cuts := map[int]bool{}
	for len(cuts) < n-1 {
		cuts[rapid.IntRange(1, layers-1).Draw(t, label+"Cut")] = true
	}
	s := []int{0}
	for l := 1; l < layers; l++ {
		if cuts[l] {
			s = append(s, l)
		}
	}
	return append(s, layers)
}

func drawPages(t *rapid.T, pool, n int, label string) []int {
	all := make([]int, pool)
	for i := range all {
		all[i] = i
	}
	if rapid.Bool().Draw(t, label+"Scattered") {
		all = rapid.Permutation(all).Draw(t, label)
	} else { // mostly consecutive: long runs, a few breaks
		off := rapid.IntRange(0, pool-n).Draw(t, label+"Offset")
		all = all[off:]
		if n > 1 && rapid.Bool().Draw(t, label+"Swap") {
			i := rapid.IntRange(0, n-2).Draw(t, label+"SwapAt")
			all[i], all[i+1] = all[i+1], all[i]
		}
	}
	return all[:n]
}

// drawWorld draws a world on the given pair, or on a random one (a named
// pair half of the time) when np is nil.
func drawWorld(t *rapid.T, np *namedPair) *world {
	var heads, tpP, tpD int
	var isMLA bool
	if np == nil && rapid.Bool().Draw(t, "named") {
		np = &namedPairs[rapid.IntRange(0, len(namedPairs)-1).Draw(t, "pair")]
	}
	if np != nil {
		heads, tpP, tpD, isMLA = np.heads, np.p, np.d, np.mla
	} else {
		isMLA = rapid.IntRange(0, 3).Draw(t, "mla") == 0
		heads = 1
		if !isMLA {
			heads = rapid.SampledFrom([]int{1, 2, 3, 4, 6, 8, 12}).Draw(t, "heads")
		}
		var fit []int
		for _, tp := range []int{1, 2, 3, 4, 6, 8, 12, 16} {
			if isMLA || heads%tp == 0 || tp%heads == 0 {
				fit = append(fit, tp)
			}
		}
		tpP = rapid.SampledFrom(fit).Draw(t, "tpP")
		tpD = rapid.SampledFrom(fit).Draw(t, "tpD")
	}
	layers := rapid.IntRange(1, 4).Draw(t, "layers")
	side := Side{
		Layers: layers, KVHeads: heads, MLA: isMLA,
		HeadDim: rapid.IntRange(1, 3).Draw(t, "headDim"), ElemBytes: rapid.IntRange(1, 2).Draw(t, "elemBytes"),
		PageSize: rapid.SampledFrom([]int{1, 2, 3, 4, 16}).Draw(t, "pageSize"),
	}
	pre, dec := side, side
	pre.TP, dec.TP = tpP, tpD
	pre.Order = Order(rapid.IntRange(0, 1).Draw(t, "orderP"))
	dec.Order = Order(rapid.IntRange(0, 1).Draw(t, "orderD"))
	pre.Stages = drawStages(t, layers, "stagesP")
	dec.Stages = drawStages(t, layers, "stagesD")
	w := &world{
		pair:   Pairing{Prefill: pre, Decode: dec, Replicas: ReplicaRule(rapid.IntRange(0, 1).Draw(t, "replicas"))},
		cp:     cp.CP{Size: rapid.IntRange(1, 3).Draw(t, "cp"), Rule: cp.Rule(rapid.IntRange(0, 1).Draw(t, "cpRule"))},
		tokens: rapid.IntRange(1, 96).Draw(t, "tokens"),
	}
	w.sendRule = w.cp.Rule
	T := w.pages()
	start := 0
	for k := rapid.IntRange(1, 3).Draw(t, "chunks"); k > 1 && start < w.tokens; k-- {
		end := start + rapid.IntRange(0, w.tokens-start).Draw(t, "chunkLen")
		w.ends = append(w.ends, end)
		start = end - end%side.PageSize
	}
	w.ends = append(w.ends, w.tokens)
	w.srcPool = T + rapid.IntRange(0, 3).Draw(t, "srcExtra")
	w.srcPages = drawPages(t, w.srcPool, T, "srcPages")
	w.dstPool = T + rapid.IntRange(0, 3).Draw(t, "dstExtra")
	for range dec.PP() * dec.TP {
		w.dstPages = append(w.dstPages, drawPages(t, w.dstPool, T, "dstPages"))
	}
	return w
}

// TestReshardEqualsReference is the resharding oracle on random pairings
// (named TP pairs among them), PP stage cuts, page sizes and orders,
// chunkings and CP rules: every decode byte equals the whole-tensor
// reference and is written exactly once.
func TestReshardEqualsReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := drawWorld(t, nil)
		require.NoError(t, w.check())
	})
}

// TestReshardNamedPairs runs the oracle on each pairing issue 17 names,
// with everything else (PP cuts, pages, orders, CP, chunks) drawn.
func TestReshardNamedPairs(t *testing.T) {
	for i := range namedPairs {
		np := &namedPairs[i]
		t.Run(np.name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				require.NoError(t, drawWorld(t, np).check())
			})
		})
	}
}

// fixed is a deterministic world for the planted mistakes.
func fixed(pre, dec Side, cpSize int) *world {
	pre.Layers, dec.Layers = 3, 3
	w := &world{pair: Pairing{Prefill: pre, Decode: dec}, cp: cp.CP{Size: cpSize, Rule: cp.SharedKV}, tokens: 21}
	w.sendRule = w.cp.Rule
	w.ends = []int{8, 21}
	T := w.pages()
	w.srcPool, w.dstPool = T+2, T+2
	for p := 0; p < T; p++ {
		w.srcPages = append(w.srcPages, T+1-p) // descending: one run per page
	}
	for d := 0; d < dec.PP()*dec.TP; d++ {
		pages := make([]int, T)
		for p := range pages {
			pages[p] = (p + d) % T
		}
		w.dstPages = append(w.dstPages, pages)
	}
	return w
}

// TestOracleCatchesPlantedMistakes shows the oracle failing on plans that
// are wrong in each way a reshard can be: it must not pass a wrong plan.
func TestOracleCatchesPlantedMistakes(t *testing.T) {
	gqa24 := func(*testing.T) *world {
		pre, dec := gqa(2, TokenMajor), gqa(4, TokenMajor)
		return fixed(pre, dec, 2)
	}
	for _, tc := range []struct {
		name  string
		world func(t *testing.T) *world
		err   string
	}{
		{"the correct plan passes", gqa24, ""},
		{"off-by-one head in the source", func(t *testing.T) *world {
			w := gqa24(t)
			w.corrupt = func(src Rank, _ int, p *Plan) {
				if src.TP == 1 {
					p.Route(Rank{TP: 3}).Pieces[0].Src -= 4 // one head (4 bytes) early
				}
			}
			return w
		}, "mismatch"},
		{"off-by-one head in the destination", func(t *testing.T) *world {
			w := gqa24(t)
			w.corrupt = func(src Rank, _ int, p *Plan) {
				if src.TP == 0 {
					p.Route(Rank{TP: 0}).Pieces[0].Dst += 4
				}
			}
			return w
		}, "written 0 times, want 1"},
		{"a missing layer", func(t *testing.T) *world {
			w := gqa24(t)
			w.corrupt = func(src Rank, _ int, p *Plan) {
				if src.TP == 1 {
					p.Route(Rank{TP: 2}).LayerHi--
				}
			}
			return w
		}, "decode {TP:2 Stage:0} buffer 4 byte"},
		{"a replicated head sent by both replicas", func(t *testing.T) *world {
			w := fixed(gqa(16, TokenMajor), gqa(8, HeadMajor), 1)
			w.corrupt = func(src Rank, _ int, p *Plan) {
				if src.TP == 2 { // replica 0 of head 1: decode rank 1 takes it from replica 1 % 2
					r := p.Route(Rank{TP: 1})
					require.True(t, r.Empty(), "rank 2 is not the chosen replica")
					twin, err := NewPlan(&Pairing{Prefill: w.pair.Prefill, Decode: w.pair.Decode}, Rank{TP: 3})
					require.NoError(t, err)
					*r = *twin.Route(Rank{TP: 1})
				}
			}
			return w
		}, "written 2 times, want 1"},
		{"a replicated head sent twice with different bytes", func(t *testing.T) *world {
			w := fixed(gqa(16, TokenMajor), gqa(8, TokenMajor), 1)
			w.pair.Replicas = FirstReplica // rank 2 sends head 1; the reference reads it there too
			w.tamper = func(src map[reshardtest.Rank]rankBufs) {
				for _, buf := range src[reshardtest.Rank{TP: 3}] { // replica 1 diverged
					for i := range buf {
						buf[i] ^= 0x5a
					}
				}
			}
			w.corrupt = func(src Rank, _ int, p *Plan) {
				if src.TP == 3 { // applied after rank 2: its bytes are the ones left
					r := p.Route(Rank{TP: 1})
					require.True(t, r.Empty(), "rank 3 is not the chosen replica")
					twin, err := NewPlan(&w.pair, Rank{TP: 2})
					require.NoError(t, err)
					*r = *twin.Route(Rank{TP: 1})
				}
			}
			return w
		}, "written 2 times, want 1; decode {TP:1 Stage:0} buffer 0 byte 0: mismatch"},
		{"a diverged replica that does not send changes nothing", func(t *testing.T) *world {
			w := fixed(gqa(16, TokenMajor), gqa(8, TokenMajor), 1)
			w.pair.Replicas = FirstReplica
			w.tamper = func(src map[reshardtest.Rank]rankBufs) {
				for _, buf := range src[reshardtest.Rank{TP: 3}] {
					for i := range buf {
						buf[i] ^= 0x5a
					}
				}
			}
			return w
		}, ""},
		{"an MLA latent copy sent twice", func(t *testing.T) *world {
			w := fixed(mla(2), mla(4), 1)
			w.corrupt = func(src Rank, _ int, p *Plan) {
				if src.TP == 0 {
					*p.Route(Rank{TP: 1}) = *p.Route(Rank{TP: 0})
					p.Route(Rank{TP: 1}).Dest = Rank{TP: 1}
				}
			}
			return w
		}, "written 2 times, want 1"},
		{"a CP rank sends pages it does not own", func(t *testing.T) *world {
			w := gqa24(t)
			w.sendRule = cp.Contiguous // the pages are held under the shared-KV rule
			return w
		}, "decode"},
		{"pipeline stages mapped to the wrong decode buffers", func(t *testing.T) *world {
			pre, dec := gqa(2, HeadMajor), gqa(2, HeadMajor)
			w := fixed(pre, dec, 1)
			w.pair.Decode.Stages = []int{0, 1, 3}
			w.dstPages = append(w.dstPages, w.dstPages...)
			w.corrupt = func(_ Rank, _ int, p *Plan) {
				for i := range p.Routes {
					p.Routes[i].dstFirst = 0 // as if the decode stage started at layer 0
				}
			}
			return w
		}, "decode {TP:0 Stage:1}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.world(t).check()
			if tc.err == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err, "the oracle passed a corrupted plan")
			require.Contains(t, err.Error(), tc.err)
		})
	}
}

// TestOracleRejectsPerturbedPlans: on random worlds, a plan with one route
// of one prefill rank perturbed (its last layer dropped, or every write moved
// one byte up in the destination) must fail the oracle. Both are detected by
// the write counts, not by chance byte values: the dropped layer's bytes are
// written 0 times, and so is the lowest destination byte of the moved route.
func TestOracleRejectsPerturbedPlans(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := drawWorld(t, nil)
		pre := &w.pair.Prefill
		var senders []Rank
		for st := 0; st < pre.PP(); st++ {
			for tp := 0; tp < pre.TP; tp++ {
				plan, err := NewPlan(&w.pair, Rank{TP: tp, Stage: st})
				require.NoError(t, err)
				if len(sending(plan)) > 0 {
					senders = append(senders, plan.Src)
				}
			}
		}
		require.NotEmpty(t, senders, "no prefill rank sends anything")
		victim := rapid.SampledFrom(senders).Draw(t, "victim")
		pick := rapid.IntRange(0, 1<<20).Draw(t, "route")
		dropLayer := rapid.Bool().Draw(t, "dropLayer")
		w.corrupt = func(src Rank, _ int, p *Plan) {
			if src != victim {
				return
			}
			dests := sending(p)
			r := p.Route(dests[pick%len(dests)])
			if dropLayer {
				r.LayerHi--
				return
			}
			r.Whole = false // a moved whole-page write is one piece like any other
			for i := range r.Pieces {
				r.Pieces[i].Dst++
			}
		}
		require.Error(t, w.check(), "a perturbed plan passed the oracle")
	})
}
