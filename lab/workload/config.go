package workload

import (
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/system"
)

// Preset is a model's KV geometry and a compute model.
type Preset struct {
	Name string
	// MLA keeps one latent KV buffer per layer; otherwise K and V buffers.
	MLA bool
	// HookLayers fire LayerEnd; ExtraLayers own buffers but fire no hook
	// (the MTP/nextn draft layer).
	HookLayers, ExtraLayers int
	// BytesPerToken is one buffer's KV bytes per token: KVHeads x HeadDim x
	// ElemBytes.
	BytesPerToken int
	// KVHeads, HeadDim and ElemBytes are the geometry behind BytesPerToken,
	// which a sharded run (--prefill-tp, --decode-tp) splits by heads: 1
	// head with MLA (the latent, replicated on every TP rank).
	KVHeads, HeadDim, ElemBytes int
	// LayerUsPerKTok is modeled compute per layer per 1000 tokens of the
	// forward.
	LayerUsPerKTok float64
	Description    string
}

// Presets are the models `--model` knows.
var Presets = map[string]Preset{
	"dsv3": {Name: "dsv3", MLA: true, HookLayers: 61, ExtraLayers: 1, BytesPerToken: 576 * 2, KVHeads: 1, HeadDim: 576, ElemBytes: 2, LayerUsPerKTok: 500,
		Description: "DeepSeek-V3-like MLA: 61 layers + 1 MTP layer (no hook), 576 bf16 values per token per layer"},
	"llama70b": {Name: "llama70b", HookLayers: 80, BytesPerToken: 8 * 128 * 2, KVHeads: 8, HeadDim: 128, ElemBytes: 2, LayerUsPerKTok: 300,
		Description: "Llama-3-70B-like GQA: 80 layers, K and V buffers of 8 KV heads x 128 dims, bf16"},
	"small": {Name: "small", MLA: true, HookLayers: 8, ExtraLayers: 1, BytesPerToken: 576 * 2, KVHeads: 1, HeadDim: 576, ElemBytes: 2, LayerUsPerKTok: 200,
		Description: "a small MLA model for quick runs: 8 layers + 1 MTP layer"},
}

// PresetNames lists the presets, sorted.
func PresetNames() []string {
	var out []string
	for n := range Presets {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Config is one sim run.
type Config struct {
	Preset Preset
	// Layers overrides the preset's hook layers (dsv3 with 78 gives the
	// commit log's 78 hooks over 79 buffers).
	Layers       int
	Requests     int
	PromptTokens int
	// ChunkTokens is the token budget of one forward (chunked prefill).
	ChunkTokens int
	PageSize    int
	GroupSize   int
	// AutoGroup (--group auto; GroupSize 0) lets the engine choose K from
	// the link, the compute model and the chunk (system.Config.AutoGroup);
	// the report says which K and why. Unsharded runs of Run only.
	AutoGroup   bool
	Submitters  int
	LinkGbps    float64
	LinkLatency time.Duration
	CP          cp.CP
	// PrefillTP and DecodeTP, when either is set, shard the run: one
	// prefill engine per prefill TP rank (each on its own stream of the
	// virtual GPU and its own modeled link) and one decode pool per decode
	// TP rank, the KV resharded by cp/reshard; the one left 0 means 1. Both
	// 0 is the unsharded run (one engine, one pool, whole pages).
	PrefillTP, DecodeTP int
	// PrefillPP and DecodePP split the layers into that many PP stages of
	// near-equal sizes on each side (0 or 1: one stage); a sharded run has
	// one engine (or pool) per stage and TP rank. A later prefill stage's
	// forward starts when the earlier stages' layers are computed.
	PrefillPP, DecodePP int
	// PageOrder is both sides' page layout in a sharded run.
	PageOrder reshard.Order
	// Resident is how many requests' KV the pools hold at once: request r
	// takes the pages request r-Resident held, once that one's last chunk
	// finished, and the forward loop waits for it if it has not (a serving
	// scheduler whose KV pool is full does the same). Zero picks four
	// forwards' worth of requests, at most Requests: the sim's memory then
	// grows with the requests in flight, not with every request of the run.
	Resident int
	// Scale divides bytes per page so that long prompts fit in memory;
	// page, block and message counts stay real and the link is modeled on
	// the real bytes. Zero picks the smallest scale that fits MemoryBudget.
	Scale        int
	MemoryBudget int64
	// TimeScale runs modeled time this many times faster than wall time.
	TimeScale float64
	// LayerUsPerKTok overrides the preset's compute model.
	LayerUsPerKTok float64
	// FinishTimeout bounds each Finish.
	FinishTimeout time.Duration
	Seed          uint64
	// Timeline collects spans for the trace and the picture.
	Timeline bool
	// NoCheckAtFinish leaves out the byte check of a chunk's decode pages
	// (the sharded run's snapshot of them) at the moment its Finish
	// returned. That check runs on the transfer workers, inside the timed
	// window: with many requests ending in one forward its CPU (about 90 ns
	// a page and buffer here) delays the other requests' Finish and was
	// most of their exposed time (16 rooms of one forward: 14.8x the floor
	// with it, 1.75x without). The transport oracle still fails the run on
	// a write that lands after its chunk's Finish or a SUCCESS before the
	// chunk's bytes landed, and every byte is still compared when its
	// request is released and at the end of the run. kvstream bench scale
	// sets it to measure the engine's exposure; the sim does not.
	NoCheckAtFinish bool
	// Progress, if set, is told about finished forwards.
	Progress func(done, total int)
	// Drain, once closed, makes the run start no more requests: the
	// chunks of those already started are still scheduled and finished,
	// and the report counts the rest as not started. Ending the run's
	// context instead launches no forward after the current one. Nil:
	// never drained.
	Drain <-chan struct{}
	// Record, if set, receives the message trace of the per-layer run.
	Record io.Writer
	// EngineOptions are added to both engines (metrics, traces).
	EngineOptions []system.Option
	// PerMode, if set, returns options for the engine of one mode (for
	// example a registry labelled with the run).
	PerMode func(perLayer bool) []system.Option

	// Fault, if set, injects transport faults into every prefill rank's
	// transport (`--fault`; the sim's own decode side only): the report counts
	// them, the Works re-sent and the chunks resumed.
	Fault Fault

	// plant, set only by this package's tests, edits the buffers the engine
	// is given before it starts: moving a buffer's Layer into an earlier
	// group makes the engine send it one group early, and moving the
	// hookless buffer to the last hook layer sends it with the last group,
	// before its kernel ended. The oracle test uses it to prove that the
	// byte check catches such an engine; being unexported, no command line
	// or embedder can set it.
	plant func([]system.Buffer)
	// plantTransport, also test-only, wraps the prefill transport as the
	// engine sees it, above the transport oracle (lab/landguard): a wrapper
	// that reports a batch complete before it landed, or drops a write,
	// plays an engine with that bug.
	plantTransport func(rdma.Transport) rdma.Transport
	// plantSlow, test-only, is the modeled link's slowdown hook: a plant
	// holds the batches it lied about on the link, so that they are still
	// in flight when the engine acts on the lie.
	plantSlow func(loopback.BatchInfo) loopback.Slowdown
	// plantShard, also test-only, edits the configuration of prefill TP
	// rank r's engine in a sharded run (plant edits every rank's buffers).
	plantShard func(r int, c *system.Config)

	// autoModel is the engine's AutoGroup once resolveGroup chose K
	// (GroupSize then holds the K the model gives).
	autoModel *system.GroupModel
}

// Defaults is a run that finishes in seconds on 2 cores.
func Defaults() Config {
	return Config{
		Preset: Presets["dsv3"], Requests: 4, PromptTokens: 16384, ChunkTokens: 8192, PageSize: 64,
		GroupSize: 8, Submitters: 4, LinkGbps: 400, LinkLatency: 10 * time.Microsecond,
		CP: cp.CP{Size: 1}, MemoryBudget: 256 << 20, TimeScale: 1, FinishTimeout: 30 * time.Second, Seed: 1,
	}
}

// geometry is what the config implies.
type geometry struct {
	hookLayers, layers int // layers = hook + extra
	buffers            int
	pagesPerRequest    int
	resident           int     // requests whose pages the pools hold at once
	pageBytes          int     // real bytes of one page of one buffer
	itemLen            int     // bytes per page per buffer in memory (scaled)
	byteScale          float64 // real bytes per byte in memory
	scale              int
	// A sharded run's sides: real (the floor) and as allocated (HeadDim
	// divided by scale).
	sharded          bool
	preReal, decReal reshard.Side
	preSide, decSide reshard.Side
}

// Check validates the configuration as a run does, before anything is
// allocated, naming the flag and the value: a command calls it to refuse
// bad flags before it opens a node or a transport.
func (c Config) Check() error {
	_, err := c.validate()
	return err
}

func (c Config) validate() (geometry, error) {
	var g geometry
	err := c.checkBounds()
	if err != nil {
		return g, err
	}
	switch {
	case c.Requests < 1:
		return g, errors.Newf("--requests %d: must be at least 1", c.Requests)
	case c.PromptTokens < 1:
		return g, errors.Newf("--prompt-tokens %d: must be at least 1", c.PromptTokens)
	case c.PageSize < 1:
		return g, errors.Newf("--page-size %d: must be at least 1", c.PageSize)
	case c.ChunkTokens < c.PageSize:
		return g, errors.Newf("--chunk-tokens %d: must be at least one page (%d tokens)", c.ChunkTokens, c.PageSize)
	case c.AutoGroup && c.GroupSize == 0:
		return g, errors.New("--group auto: only `kvstream sim` chooses K (unsharded runs)")
	case c.GroupSize < 1:
		return g, errors.Newf("--group %d: must be at least 1", c.GroupSize)
	case c.LinkGbps <= 0:
		return g, errors.Newf("--link-gbps %v: must be positive", c.LinkGbps)
	case c.TimeScale <= 0:
		return g, errors.Newf("--time-scale %v: must be positive", c.TimeScale)
	case c.Scale < 0:
		return g, errors.Newf("--scale %d: must not be negative", c.Scale)
	case c.Layers < 0:
		return g, errors.Newf("--layers %d: must not be negative", c.Layers)
	case c.Resident < 0:
		return g, errors.Newf("--resident %d: must not be negative", c.Resident)
	}
	if err := c.CP.Validate(); err != nil {
		return g, errors.Wrap(err, "--cp/--cp-rank")
	}
	g.hookLayers = c.Preset.HookLayers
	if c.Layers > 0 {
		g.hookLayers = c.Layers
	}
	g.layers = g.hookLayers + c.Preset.ExtraLayers
	g.buffers = g.layers
	if !c.Preset.MLA {
		g.buffers *= 2
	}
	g.pagesPerRequest = (c.PromptTokens + c.PageSize - 1) / c.PageSize
	g.pageBytes = c.PageSize * c.Preset.BytesPerToken
	if g.resident, err = c.residentRequests(); err != nil {
		return g, err
	}
	if c.sharded() {
		if err := c.shardedGeometry(&g); err != nil {
			return g, err
		}
		return g, c.checkModeledTime(g)
	}
	g.scale = c.Scale
	if g.scale == 0 {
		real := float64(g.pageBytes) * float64(g.pagesPerRequest*g.resident) * float64(g.buffers)
		budget := float64(c.MemoryBudget)
		if budget <= 0 {
			budget = 256 << 20
		}
		g.scale = max(1, int(math.Ceil(real/budget)))
	}
	g.itemLen = max(8, (g.pageBytes+g.scale-1)/g.scale)
	g.byteScale = float64(g.pageBytes) / float64(g.itemLen)
	// Each side's pool holds the resident requests' pages; at the smallest
	// page the sim moves (8 bytes) a huge run still would not fit: say so
	// rather than allocate it. Every factor is bounded, so no overflow.
	if pool := int64(g.itemLen) * int64(g.pagesPerRequest) * int64(g.resident) * int64(g.buffers); pool > MaxPoolBytes {
		return g, errors.Newf("--resident %d x --prompt-tokens %d: each KV pool would take %d MiB (%d pages of %d buffers at %d bytes), above the bound of %d MiB",
			g.resident, c.PromptTokens, pool>>20, int64(g.pagesPerRequest)*int64(g.resident), g.buffers, g.itemLen, MaxPoolBytes>>20)
	}
	return g, c.checkModeledTime(g)
}

// residentRequests is Resident, or its default, checked: a forward touches
// at most ceil(chunk/prompt)+1 requests (a tail, whole prompts, a head), and
// every request of a forward must be resident together, or the forward
// would wait for a slot that only its own end frees.
func (c Config) residentRequests() (int, error) {
	perForward := min(c.Requests, (c.ChunkTokens+c.PromptTokens-1)/c.PromptTokens+1)
	if c.Resident == 0 {
		return min(c.Requests, 4*perForward), nil
	}
	if c.Resident < perForward {
		return 0, errors.Newf("--resident %d: a forward of --chunk-tokens %d touches up to %d requests of --prompt-tokens %d, which must be resident together",
			c.Resident, c.ChunkTokens, perForward, c.PromptTokens)
	}
	return min(c.Requests, c.Resident), nil
}

// ParseRule reads --cp-rule.
func ParseRule(s string) (cp.Rule, error) { return cp.ParseRule(strings.ToLower(s)) }

// resolveGroup chooses K when AutoGroup asks for it: with the engine's own
// rule (system.ChooseGroup) on the model of this run's forwards (a forward
// of ChunkTokens, its layer time, the link's rate and latency, the pages at
// their real size), so that the floor, the report and the engine agree on
// K. The engine is given the same model (Config.AutoGroup) and must come to
// the same K.
func (c Config) resolveGroup() (Config, *system.GroupChoice, error) {
	if !c.AutoGroup {
		return c, nil, nil
	}
	if c.GroupSize != 0 {
		return c, nil, errors.Newf("--group %d and --group auto: give one", c.GroupSize)
	}
	if c.sharded() {
		return c, nil, errors.New("--group auto: not for sharded runs (--prefill-tp, --decode-tp, PP), whose ranks send different layers and heads")
	}
	probe := c
	probe.AutoGroup, probe.GroupSize = false, 1
	g, err := probe.validate()
	if err != nil {
		return c, nil, err
	}
	chunkPages := (min(c.ChunkTokens, c.PromptTokens*c.Requests) + c.PageSize - 1) / c.PageSize
	m := system.GroupModel{
		LinkBytesPerSec: c.LinkGbps * 1e9 / 8, Latency: c.LinkLatency,
		PagesPerForward: max(1, (chunkPages+c.CP.Size-1)/c.CP.Size),
		LayerTime:       c.layerTime(min(c.ChunkTokens, c.PromptTokens*c.Requests)),
		ItemScale:       g.byteScale,
	}
	bufs := make([]system.Buffer, 0, g.buffers)
	for b := 0; b < g.buffers; b++ {
		bufs = append(bufs, system.Buffer{ItemLen: uint64(g.itemLen), Layer: b % g.layers})
	}
	ch, err := system.ChooseGroup(m, bufs, g.hookLayers)
	if err != nil {
		return c, nil, errors.Wrap(err, "--group auto")
	}
	c.GroupSize, c.autoModel = ch.K, &m
	return c, &ch, nil
}
