package workload

import (
	"math/rand/v2"
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
}

// Fault is a transport fault injected into every prefill rank's transport,
// into each posted batch with probability Rate. The zero Fault injects
// nothing.
type Fault struct {
	Kind string
	Rate float64
}

// ParseFault reads KIND:RATE (endpoint-broken:0.05), naming what is wrong
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
	var ks []string
	for k := range FaultKinds {
		ks = append(ks, k)
	}
	return strings.Join(ks, ", ")
}

// String is the fault as --fault takes it, or "" for none.
func (f Fault) String() string {
	if f.Rate == 0 {
		return ""
	}
	return f.Kind + ":" + strconv.FormatFloat(f.Rate, 'g', -1, 64)
}

// injector decides the faults of one mode's run: seeded, so that a run
// repeats its faults, and counting what it injected.
type injector struct {
	fault    Fault
	mu       sync.Mutex
	rng      *rand.Rand
	injected atomic.Int64
}

func newInjector(f Fault, seed uint64, perLayer bool) *injector {
	mode := uint64(0)
	if perLayer {
		mode = 1
	}
	return &injector{fault: f, rng: rand.New(rand.NewPCG(seed, 0xfa017+mode))}
}

// wrap returns tr with the faults injected, or tr when there are none.
func (in *injector) wrap(tr rdma.Transport) rdma.Transport {
	if in == nil || in.fault.Rate == 0 {
		return tr
	}
	return rdmafault.Wrap(tr, in.decide)
}

func (in *injector) decide(rdmafault.BatchInfo) rdmafault.Fault {
	in.mu.Lock()
	hit := in.rng.Float64() < in.fault.Rate
	in.mu.Unlock()
	if !hit {
		return rdmafault.Fault{}
	}
	in.injected.Add(1)
	return rdmafault.Fault{Kind: rdmafault.BreakEndpoint}
}

func (in *injector) count() int {
	if in == nil {
		return 0
	}
	return int(in.injected.Load())
}
