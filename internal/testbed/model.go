package testbed

import (
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
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
}

// Poison is the byte a layer's kernel writes over its output pages when it
// starts; its results replace it when it ends. No page of Fill's pattern is
// all Poison, so a transfer that read a page while its kernel ran carries
// poison (or the stale bytes from before) and fails the byte comparison.
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
	fw, err := eng.BeginForward()
	if err != nil {
		return err
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
		start, run := m.writeLayer(l, writes)
		if err := m.Stream.Launch(sim.Kernel{Name: KernelName(m.forwards, l), Duration: d, Start: start, Run: run}); err != nil {
			return err
		}
		if l < m.HookLayers {
			if err := fw.LayerEnd(l); err != nil {
				return errors.Wrapf(err, "layer %d", l)
			}
		}
	}
	return fw.End()
}

// writeLayer returns layer l's kernel: at its start it poisons the pages it
// writes and computes their bytes aside (the expensive part, hidden in the
// modeled interval); at its end it copies them in. Kernels of one stream run
// one at a time, so one staging buffer serves them all.
func (m *Model) writeLayer(l int, writes []Write) (start, run func()) {
	var pages [][]byte
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
					fillPoison(pages[n])
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
	}
	return start, run
}

func fillPoison(b []byte) {
	for i := range b {
		b[i] = Poison
	}
}
