package system_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/system"
)

// outline is the package documentation's outline (doc.go), statement for
// statement, so that the compiler checks it against the API:
// TestDocOutline fails when a line of the outline is not one of these. It is
// compiled, not run (Example runs the flow): a forward of layers layers for
// one chunk, then the room's Finish, or its Drop when abort is set.
func outline(ctx context.Context, cfg system.Config, computeStream cuda.Stream, tr rdma.Transport,
	decodePeer system.Peer, chunk system.ChunkSpec, room uint64, layers int, abort bool) (system.Result, error) {
	eng, err := system.New(cfg, system.WithStream(computeStream), system.WithTransport(tr))
	if err != nil {
		return system.Result{}, err
	}
	fail := func(err error) (system.Result, error) {
		_ = eng.Close()
		return system.Result{}, err
	}
	err = eng.AddPeer(decodePeer)
	if err != nil {
		return fail(err)
	}
	reg, err := eng.Register(ctx, chunk)
	if err != nil {
		return fail(err)
	}
	_, _ = reg.Mode, reg.Reason // per layer or monolithic, and why
	fw, err := eng.BeginForward()
	if err != nil {
		return fail(err)
	}
	for l := range layers {
		err = fw.LayerEnd(l)
		if err != nil {
			return fail(err)
		}
	}
	err = fw.End()
	if err != nil {
		return fail(err)
	}
	if abort {
		err = eng.Drop(ctx, room)
		return fail(err)
	}
	res, err := eng.Finish(ctx, room)
	if err != nil {
		return fail(err)
	}
	err = eng.Close()
	return res, err
}

var _ = outline

// TestDocOutline: every line of doc.go's outline (a tab-indented comment
// line, its trailing comment left out) is a line of outline above, so the
// package's first page shows calls that compile.
func TestDocOutline(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("doc_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var code []string
	for l := range strings.Lines(string(self)) {
		code = append(code, strings.TrimSpace(l))
	}
	n := 0
	for l := range strings.Lines(string(doc)) {
		line, ok := strings.CutPrefix(strings.TrimRight(l, "\n"), "//\t")
		if !ok {
			continue
		}
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if !slices.Contains(code, line) {
			t.Errorf("doc.go's outline line %q is not a statement of outline", line)
		}
		n++
	}
	if n < 8 {
		t.Errorf("doc.go's outline: %d lines found, want the whole flow", n)
	}
}
