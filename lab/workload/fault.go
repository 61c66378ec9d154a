package workload

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/rdmafault"
	"github.com/kvstream/kvstream/system"
)

// FaultKinds are the transport faults `--fault KIND:RATE` injects, with
// what each does to a batch it hits.
var FaultKinds = map[string]string{
	"endpoint-broken": "the connection breaks in the middle of the batch: half of its writes land, the batch fails as a broken endpoint and the endpoint refuses later batches (the engine resumes on a fresh one)",
	"lost-completion": "the batch lands but its completion never comes, until its endpoint is closed (the engine writes it off at its completion deadline, a quarter of the finish timeout after Finish, and re-sends it on a fresh endpoint)",
}

// faultKind is the rdmafault kind of each of FaultKinds.
var faultKind = map[string]rdmafault.Kind{
	"endpoint-broken": rdmafault.BreakEndpoint,
	"lost-completion": rdmafault.LoseCompletion,
}

// Fault is a transport fault injected into every prefill rank's transport,
// into each posted batch with probability Rate. The zero Fault injects
// nothing.
type Fault struct {
	Kind string
	Rate float64
}

// ParseFault reads KIND:RATE (endpoint-broken:0.05, lost-completion:0.05), naming what is wrong
// with a bad value under flag.
func ParseFault(flag, s string) (Fault, error) {
	kind, rate, ok := strings.Cut(s, ":")
	if !ok {
		return Fault{}, errors.Mark(errors.Newf("%s %q: want KIND:RATE, KIND one of %s, RATE a probability per batch in [0, 1]", flag, s, faultKinds()), system.ErrBadInput)
	}
	if _, known := FaultKinds[kind]; !known {
		return Fault{}, errors.Mark(errors.Newf("%s %q: unknown fault %q, want one of %s", flag, s, kind, faultKinds()), system.ErrBadInput)
	}
	r, err := strconv.ParseFloat(rate, 64)
	if err != nil || !(r >= 0 && r <= 1) { // NaN fails both
		return Fault{}, errors.Mark(errors.Newf("%s %q: rate %q must be a probability per batch within [0, 1]", flag, s, rate), system.ErrBadInput)
	}
	return Fault{Kind: kind, Rate: r}, nil
}

func faultKinds() string {
	return strings.Join(slices.Sorted(maps.Keys(FaultKinds)), ", ")
}

// String is the fault as --fault takes it, or "" for none.
func (f Fault) String() string {
	if f.Rate == 0 {
		return ""
	}
	return f.Kind + ":" + strconv.FormatFloat(f.Rate, 'g', -1, 64)
}

// injector decides the faults of one mode's run. Each decision is a hash
// of the run's seed and mode, the batch's identity (sender, receiver, the
// first write's region and offset in it, bytes and writes) and how many times a batch of that
// identity was posted before: a re-send of a broken batch is a later post
// of the same identity, drawn independently, and no decision depends on
// the order in which concurrent submitters and ranks post, so that a run
// whose pages are placed the same repeats its faults.
type injector struct {
	fault Fault
	seed  uint64
	mu    sync.Mutex
	// posts holds, per batch identity, its posts so far and the faults
	// injected into its latest posts in a row.
	posts     map[batchKey]*posts
	injected  atomic.Int64
	pastLimit atomic.Int64
}

type batchKey struct {
	from, to   string
	region     int    // the destination region's index on its endpoint
	dst, bytes uint64 // dst: the first write's offset in that region
	writes     int
}

type posts struct {
	n   uint64
	row int
}

func newInjector(f Fault, seed uint64, perLayer bool) *injector {
	mode := uint64(0)
	if perLayer {
		mode = 1
	}
	return &injector{fault: f, seed: mix(seed, 0xfa017+mode), posts: map[batchKey]*posts{}}
}

// wrap returns tr with the faults injected, or tr when there are none.
func (in *injector) wrap(tr rdma.Transport) rdma.Transport {
	if in == nil || in.fault.Rate == 0 {
		return tr
	}
	return rdmafault.Wrap(tr, in.decide)
}

func (in *injector) decide(b rdmafault.BatchInfo) rdmafault.Fault {
	k := batchKey{from: b.From, to: b.To, region: b.DstRegion, dst: b.DstOffset, bytes: b.Bytes, writes: b.Writes}
	in.mu.Lock()
	p := in.posts[k]
	if p == nil {
		p = &posts{}
		in.posts[k] = p
	}
	h := mix(in.seed, hashString(k.from), hashString(k.to), uint64(k.region), k.dst, k.bytes, uint64(k.writes), p.n)
	p.n++
	// The top 53 bits as a uniform float in [0, 1).
	hit := float64(h>>11)/(1<<53) < in.fault.Rate
	if hit {
		p.row++
		if p.row == system.ResendLimit+1 {
			in.pastLimit.Add(1)
		}
	} else {
		p.row = 0
	}
	in.mu.Unlock()
	if !hit {
		return rdmafault.Fault{}
	}
	in.injected.Add(1)
	return rdmafault.Fault{Kind: faultKind[in.fault.Kind]}
}

// pastResendLimit counts the batch identities the injector broke (or
// whose completion it lost) more than system.ResendLimit times in a row: each such Work fails its chunk
// (the resend limit), and only those do.
func (in *injector) pastResendLimit() int {
	if in == nil {
		return 0
	}
	return int(in.pastLimit.Load())
}

// mix folds vs into h with splitmix64's finalizer after each.
func mix(h uint64, vs ...uint64) uint64 {
	for _, v := range vs {
		h ^= v
		h += 0x9e3779b97f4a7c15
		h = (h ^ h>>30) * 0xbf58476d1ce4e5b9
		h = (h ^ h>>27) * 0x94d049bb133111eb
		h ^= h >> 31
	}
	return h
}

// hashString is FNV-1a of s.
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

func (in *injector) count() int {
	if in == nil {
		return 0
	}
	return int(in.injected.Load())
}
