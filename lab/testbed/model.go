package testbed

import (
	"strconv"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/system"
)

// Model runs forwards on a virtual GPU: per hook layer one kernel that
// writes that layer's KV (for every request of the batch) into the prefill
// pool, then the layers that fire no hook (the MTP layer), like a real model
// enqueues its kernels and calls the engine's hooks in between.
type Model struct {
	Stream     *sim.Stream
	Pool       *Pool
	HookLayers int
	Seed       uint64
	// LayerTime is the modeled duration of one layer's kernel for a forward
	// of the given number of tokens.
	LayerTime func(tokens int) time.Duration
	// Fill, when set, is what a forward writes into one page of buffer b
	// for request position pos (default: Fill with Seed). A resharding test
	// writes each rank's share of one logical tensor with it.
	Fill func(dst []byte, room uint64, buffer, position int)

	forwards int
	stage    []byte // a kernel's results between its Start and its Run

	// spare holds the output page lists of kernels that ran, for the next
	// launches: a list per kernel per forward (tens of MB over a long
	// run) would bring the collector, and its stop-the-world pauses, into
	// the windows where batches land.
	spareMu sync.Mutex
	spare   [][][]byte
}

// Poison is the byte a layer's kernel writes over the head of its output
// pages (PoisonHead bytes) when it starts; its results replace it when it
// ends. No page of Fill's pattern starts with PoisonHead Poison bytes, so a
// transfer that read a page while its kernel ran carries poison (or the
// stale bytes from before) and fails the byte comparison.
const Poison = 0xA5

// KernelName is the name of layer l's kernel in the model's n-th forward
// (from 1), as sim spans report it.
func KernelName(forward, layer int) string {
	return "f" + strconv.Itoa(forward) + " L" + strconv.Itoa(layer)
}

// Write is what one forward writes for one request: positions
// [PageStart, PageStart+len(SrcPages)) into prefill pages SrcPages.
type Write struct {
	Room      uint64
	PageStart int
	SrcPages  []int
	Tokens    int
}

// Forward enqueues one forward over writes and drives the engine's hooks. It
// returns when everything is enqueued (the GPU may still be running).
func (m *Model) Forward(eng *system.Engine, writes []Write) error {
	_, err := m.forward(eng, writes, false)
	return err
}

// ForwardMarked is Forward that also returns an event recorded after the
// forward's first kernel: once it completed, the previous forward's end
// and the transfers that landed right after it are well behind, so a
// forward loop that waits for it before enqueueing the next forward keeps
// its own host work (tenths of a millisecond) away from that end.
func (m *Model) ForwardMarked(eng *system.Engine, writes []Write) (cuda.Event, error) {
	return m.forward(eng, writes, true)
}

func (m *Model) forward(eng *system.Engine, writes []Write, mark bool) (started cuda.Event, err error) {
	fw, err := eng.BeginForward()
	if err != nil {
		return nil, err
	}
	m.forwards++
	tokens := 0
	for _, w := range writes {
		tokens += w.Tokens
	}
	var d time.Duration
	if m.LayerTime != nil {
		d = m.LayerTime(tokens)
	}
	maxLayer := 0
	for _, l := range m.Pool.Layers {
		maxLayer = max(maxLayer, l)
	}
	for l := 0; l <= maxLayer; l++ {
		start, prepare, run := m.writeLayer(l, writes)
		if err := m.Stream.Launch(sim.Kernel{Name: KernelName(m.forwards, l), Duration: d, Start: start, Prepare: prepare, Run: run}); err != nil {
			return nil, err
		}
		if mark && l == 0 {
			if started, err = m.Stream.Record(); err != nil {
				return nil, errors.Wrap(err, "record the forward's started event")
			}
		}
		if l < m.HookLayers {
			if err := fw.LayerEnd(l); err != nil {
				return nil, errors.Wrapf(err, "layer %d", l)
			}
		}
	}
	return started, fw.End()
}

// writeLayer returns layer l's kernel: at its start it marks the pages it
// writes as poisoned (their first bytes only: microseconds, where poisoning
// whole pages and computing their bytes there cost a quarter of a
// millisecond at every forward's boundary, inside the previous forward's
// last landing); late in the kernel it computes their bytes aside
// (Prepare); at its end it copies them in. Kernels of one stream run one at
// a time, so one staging buffer serves them all.
func (m *Model) writeLayer(l int, writes []Write) (start, prepare, run func()) {
	pages := m.pageList()
	for b, layer := range m.Pool.Layers {
		if layer != l {
			continue
		}
		for _, w := range writes {
			for _, sp := range w.SrcPages {
				pages = append(pages, m.Pool.Page(b, sp))
			}
		}
	}
	item := int(m.Pool.ItemLen)
	start = func() {
		for _, pg := range pages {
			markPoison(pg)
		}
	}
	prepare = func() {
		if need := len(pages) * item; cap(m.stage) < need {
			m.stage = make([]byte, need)
		}
		n := 0
		for b, layer := range m.Pool.Layers {
			if layer != l {
				continue
			}
			for _, w := range writes {
				for i := range w.SrcPages {
					if m.Fill != nil {
						m.Fill(m.stage[n*item:(n+1)*item], w.Room, b, w.PageStart+i)
					} else {
						Fill(m.stage[n*item:(n+1)*item], m.Seed, w.Room, b, w.PageStart+i)
					}
					n++
				}
			}
		}
	}
	run = func() {
		for i, pg := range pages {
			copy(pg, m.stage[i*item:(i+1)*item])
		}
		m.recycle(pages)
	}
	return start, prepare, run
}

// pageList returns an empty output page list, reused when one is spare.
func (m *Model) pageList() [][]byte {
	m.spareMu.Lock()
	defer m.spareMu.Unlock()
	if n := len(m.spare); n > 0 {
		pages := m.spare[n-1]
		m.spare = m.spare[:n-1]
		return pages[:0]
	}
	return nil
}

// recycle hands a ran kernel's page list back for a later launch.
func (m *Model) recycle(pages [][]byte) {
	clear(pages) // no page outlives its pool through a spare list
	m.spareMu.Lock()
	m.spare = append(m.spare, pages)
	m.spareMu.Unlock()
}

// PoisonHead is how many leading bytes of each output page a kernel
// poisons at its start: enough that a page read while the kernel ran never
// equals its final bytes (the rest keeps what the page held before, which
// differs from them too) nor passes for the pattern's first bytes.
const PoisonHead = 8

func markPoison(b []byte) {
	for i := range b[:min(len(b), PoisonHead)] {
		b[i] = Poison
	}
}

// Poisoned reports whether a page's head carries a running kernel's poison.
func Poisoned(b []byte) bool {
	head := b[:min(len(b), PoisonHead)]
	for _, x := range head {
		if x != Poison {
			return false
		}
	}
	return len(head) > 0
}
