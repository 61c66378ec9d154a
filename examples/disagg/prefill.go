package main

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/system"
)

// piece is one request's chunk in one forward: tokens [start, end).
type piece struct {
	rt         route
	start, end int
	src        []int // prefill pages of positions [start/pageSize, ...)
	spec       system.ChunkSpec
}

func (p piece) last() bool { return p.end == prompt }

// prefillLoop is the prefill server: its scheduler registers each forward's
// chunks, its forward loop runs the model and calls LayerEnd, and a
// transfer worker per room finishes each chunk and tells the decode side.
func prefillLoop(ctx context.Context, node *decode.Node, fabric *loopback.Fabric, decodeAddr string, routes <-chan route, out io.Writer) (err error) {
	tr, err := fabric.NewTransport("prefill")
	if err != nil {
		return err
	}
	defer tr.Close()
	pool, err := hostmem.Alloc(layers * itemLen * poolPages)
	if err != nil {
		return err
	}
	defer pool.Free()
	bases := make([]uint64, layers)
	for l := range bases {
		bases[l] = pool.Addr + uint64(l*itemLen*poolPages)
	}
	cfg := system.Config{Buffers: system.MLABuffers(bases, itemLen, poolPages), HookLayers: layers, GroupSize: group, PageSize: pageSize}

	// The session with the decode server: its pool becomes the engine's
	// peer, and its loss fails the engine's work for it at once.
	sess, err := decode.Dial(ctx, node, decode.DialConfig{Decode: decodeAddr, Buffers: cfg.Buffers, PageSize: cfg.PageSize, Name: "prefill-0"})
	if err != nil {
		return err
	}
	defer sess.Close(context.Background())
	gpu := sim.New(sim.Options{})
	defer gpu.Close()
	stream := gpu.NewStream("compute")
	eng, err := system.New(cfg, system.WithStream(stream), system.WithTransport(tr))
	if err != nil {
		return err
	}
	defer eng.Close()
	if err := sess.Attach(eng); err != nil {
		return err
	}

	// Transfer workers: one per room, finishing its chunks in send order.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	work := map[uint64]chan piece{}
	worker := func(in <-chan piece) {
		defer wg.Done()
		for p := range in {
			res, ferr := eng.Finish(ctx, p.rt.room) // returns once the bytes landed, or FAILED
			// The notice names the request positions sent and their decode
			// pages (absolute positions, this CP rank's only).
			n, nerr := sess.NoticeFor(p.spec, res)
			if nerr == nil {
				nerr = sess.Notify(ctx, n)
			}
			mu.Lock()
			for _, e := range []error{ferr, nerr} {
				if e != nil && firstErr == nil {
					firstErr = fmt.Errorf("room %d chunk [%d, %d): %w", p.rt.room, p.start, p.end, e)
				}
			}
			mu.Unlock()
		}
	}

	// The scheduler: every request that arrived takes part in each forward
	// with its next chunk (chunked prefill).
	var pending []piece
	next := uint64(0)
	for rt := range routes {
		base := int(next) * ((prompt + pageSize - 1) / pageSize)
		next++
		for s := 0; s < prompt; s += chunk {
			e := min(s+chunk, prompt)
			p := piece{rt: rt, start: s, end: e}
			for x := s / pageSize; x < (e+pageSize-1)/pageSize; x++ {
				p.src = append(p.src, base+x)
			}
			pending = append(pending, p)
		}
		work[rt.room] = make(chan piece, prompt/chunk+1)
		wg.Add(1)
		go worker(work[rt.room])
	}
	for forward := 0; len(pending) > 0; forward++ {
		var batch, later []piece
		taken := map[uint64]bool{}
		for _, p := range pending {
			if taken[p.rt.room] {
				later = append(later, p)
				continue
			}
			taken[p.rt.room] = true
			batch = append(batch, p)
		}
		pending = later
		for i, p := range batch {
			batch[i].spec = system.ChunkSpec{Room: p.rt.room, Start: p.start, End: p.end, Last: p.last(),
				SrcPages: p.src, TotalPages: len(p.rt.pages),
				Infos: []system.DecodeInfo{{Peer: sess.Peer().ID, DstPages: p.rt.pages}}}
			if _, err := eng.Register(ctx, batch[i].spec); err != nil {
				return err
			}
		}
		if err := runForward(eng, stream, pool, batch); err != nil {
			return err
		}
		for _, p := range batch {
			work[p.rt.room] <- p
		}
		fmt.Fprintf(out, "prefill: forward %d enqueued %d chunks\n", forward+1, len(batch))
	}
	for _, w := range work {
		close(w)
	}
	wg.Wait()
	// Nothing writes the decode pool once the engine closed: say goodbye.
	if err := eng.Close(); err != nil {
		return err
	}
	if firstErr != nil {
		_, _ = sess.Bye(ctx, firstErr)
		return firstErr
	}
	sum, err := sess.Bye(ctx, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "prefill: the decode server accepted %d chunks, %d failed\n", sum.Chunks, sum.Failed)
	return nil
}

// runForward is the model's forward loop: per layer one kernel writes that
// layer's KV for every chunk of the batch, then LayerEnd tells the engine
// (O(1); one event per group of layers).
func runForward(eng *system.Engine, stream *sim.Stream, pool *hostmem.Block, batch []piece) error {
	fw, err := eng.BeginForward()
	if err != nil {
		return err
	}
	for l := 0; l < layers; l++ {
		if err := stream.Launch(sim.Kernel{Name: fmt.Sprintf("L%d", l), Duration: kernel, Run: func() {
			for _, p := range batch {
				for i, src := range p.src {
					off := (l*poolPages + src) * itemLen
					kv(pool.Bytes[off:off+itemLen], p.rt.room, l, p.start/pageSize+i)
				}
			}
		}}); err != nil {
			return err
		}
		if err := fw.LayerEnd(l); err != nil {
			return err
		}
	}
	return fw.End()
}
