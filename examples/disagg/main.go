package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"sync"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
)

// The model and the requests.
const (
	layers    = 4   // MLA: one KV buffer per layer
	itemLen   = 512 // bytes of one page of one layer
	pageSize  = 16  // tokens per page
	prompt    = 96  // tokens per request: 6 pages
	chunk     = 64  // tokens per forward per request (chunked prefill)
	requests  = 3   //
	poolPages = 64  // pages per buffer, in each pool
	group     = 2   // layers per submit (K)
	kernel    = time.Millisecond
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// route is what the serving stack's router passes from the decode side to
// the prefill side for one request: its room and the decode pages the KV
// goes to (position p to pages[p]).
type route struct {
	room  uint64
	pages []int
}

func run(ctx context.Context, w io.Writer) error {
	out := &lockedWriter{w: w} // both loops report
	node, err := decode.Listen("127.0.0.1:0", nil)
	if err != nil {
		return err
	}
	defer node.Close(context.Background())
	fabric := loopback.NewFabric(loopback.Options{})

	routes := make(chan route, requests)
	decoded := make(chan error, 1)
	ready := make(chan string, 1) // the decode server's address
	go func() { decoded <- decodeLoop(ctx, node, fabric, routes, ready, out) }()
	addr := ""
	select {
	case addr = <-ready:
	case err := <-decoded:
		return err
	}
	if err := prefillLoop(ctx, node, fabric, addr, routes, out); err != nil {
		return err
	}
	if err := <-decoded; err != nil {
		return err
	}
	fmt.Fprintln(out, "every request decoded from the bytes the prefill computed")
	return nil
}

// kv is what the model writes for a room, layer and request position: a
// pattern that tells them all apart, so that the decode side can check.
func kv(dst []byte, room uint64, layer, pos int) {
	for i := range dst {
		dst[i] = byte(int(room)*101 + layer*31 + pos*7 + i)
	}
}

// lockedWriter serializes the two loops' lines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
