package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
)

// decodeLoop is the decode server: it registers its pool, and for each
// request allocates pages, routes them to the prefill, waits for the room
// and uses the pages.
func decodeLoop(ctx context.Context, node *decode.Node, fabric *loopback.Fabric, routes chan<- route, ready chan<- string, out io.Writer) error {
	closeRoutes := sync.OnceFunc(func() { close(routes) }) // the prefill schedules until it is closed
	defer closeRoutes()
	tr, err := fabric.NewTransport("decode")
	if err != nil {
		return err
	}
	defer tr.Close()
	// The decode pool: one buffer per layer, in memory that never moves.
	pool, err := hostmem.Alloc(layers * itemLen * poolPages)
	if err != nil {
		return err
	}
	defer pool.Free()
	bufs := make([]decode.Buffer, layers)
	for l := range bufs {
		bufs[l] = decode.Buffer{Name: fmt.Sprintf("KV%d", l), Base: pool.Addr + uint64(l*itemLen*poolPages), ItemLen: itemLen, Pages: poolPages}
	}
	srv, err := decode.New(node, tr, decode.Config{Buffers: bufs})
	if err != nil {
		return err
	}
	defer srv.Close(context.Background())
	ready <- srv.Addr()

	// The page allocator: decode pages are handed out in a scattered order
	// (a real pool's free list is), which the prefill must follow exactly.
	free := make([]int, 0, poolPages)
	for p := poolPages - 1; p >= 0; p -= 2 {
		free = append(free, p)
	}
	var rooms []route
	for r := uint64(1); r <= requests; r++ {
		n := (prompt + pageSize - 1) / pageSize
		pages := free[:n:n]
		free = free[n:]
		// Only the prefill this request is routed to may report the room
		// (its certificate name with TLS; its name in the clear).
		if err := srv.ExpectFrom(r, pages, "prefill-0"); err != nil {
			return err
		}
		rooms = append(rooms, route{room: r, pages: pages})
		routes <- route{room: r, pages: pages}
	}
	closeRoutes()

	want := make([]byte, itemLen)
	for _, rt := range rooms {
		room, err := srv.Wait(ctx, rt.room)
		if err != nil {
			return fmt.Errorf("room %d: do not decode: %w", rt.room, err)
		}
		// "Decode": read the KV the prefill computed from the room's pages.
		for pos, p := range rt.pages {
			for l := 0; l < layers; l++ {
				kv(want, rt.room, l, pos)
				off := (l*poolPages + p) * itemLen
				if !bytes.Equal(want, pool.Bytes[off:off+itemLen]) {
					return fmt.Errorf("room %d position %d layer %d (decode page %d): bytes differ", rt.room, pos, l, p)
				}
			}
		}
		fmt.Fprintf(out, "decode: room %d complete in %d chunks, %d pages\n", rt.room, len(room.Chunks), len(rt.pages))
		if err := srv.Release(rt.room); err != nil {
			return err
		}
	}
	ss, err := srv.Accept(ctx)
	if err != nil {
		return err
	}
	rep, err := ss.Wait(ctx)
	if err != nil {
		return fmt.Errorf("session: %w", err)
	}
	fmt.Fprintf(out, "decode: session of %d chunks complete: %v\n", rep.Chunks, rep.Complete)
	return nil
}
