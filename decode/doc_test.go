package decode_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/netsec"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// The package doc's snippets, as code: each function's body down to its
// snippetEnd line is one code block of doc.go (TestDocSnippets), so the
// doc shows code that compiles. They are never run: the names they use
// are their parameters.

const snippetEnd = "// (end of the doc's snippet)"

func docDecodeSide(ctx context.Context, ca, cert, key string, log *zap.Logger, transport rdma.Transport, pool []decode.Buffer, room uint64, pages []int) {
	tlsm, err := netsec.LoadTLS(netsec.Files{CA: ca, Cert: cert, Key: key})
	node, err := decode.ListenConfig(decode.NodeConfig{Listen: "10.0.0.2:9100", TLS: tlsm, Log: log}) // one per process
	srv, err := decode.New(node, transport, decode.Config{Buffers: pool})                             // registers the pool
	// Per request: allocate decode pages, publish them to the prefill's
	// scheduler (its DecodeInfo.DstPages), then:
	err = srv.Expect(room, pages)
	r, err := srv.Wait(ctx, room) // the chunks the prefill reported, once their bytes landed
	// err == nil: every chunk succeeded, the last one included: decode r's pages.
	err = srv.Release(room) // when the pages are free again
	// (end of the doc's snippet)
	_, _ = r, err
}

func docPrefillSide(ctx context.Context, tlsm *netsec.TLS, log *zap.Logger, cfg system.Config, eng *system.Engine, spec system.ChunkSpec, res system.Result) {
	node, err := decode.ListenConfig(decode.NodeConfig{Listen: "10.0.0.1:0", TLS: tlsm, Log: log})
	c, err := decode.Dial(ctx, node, decode.DialConfig{Decode: "10.0.0.2:9100", Buffers: cfg.Buffers, PageSize: cfg.PageSize})
	err = c.Attach(eng) // Engine.AddPeer; PeerLost, PeerDraining and CancelRoom when the decode server goes, drains or cancels a room
	// per chunk, after eng.Finish(ctx, room) returned res for the chunk registered as spec:
	n, err := c.NoticeFor(spec, res) // the absolute positions sent, their decode pages
	err = c.Notify(ctx, n)
	// at the end, after eng.Close (nothing writes any more):
	sum, err := c.Bye(ctx, nil) // or the reason the prefill stopped early
	// (end of the doc's snippet)
	_, _ = sum, err
}

// TestDocSnippets: the code blocks of the package doc are, in order, the
// bodies of docDecodeSide and docPrefillSide (spaces aside: gofmt aligns
// the functions' trailing comments), so a change to the API that breaks
// a snippet fails to compile.
func TestDocSnippets(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	src, err := os.ReadFile("doc_test.go")
	require.NoError(t, err)
	blocks := codeBlocks(string(doc))
	require.Len(t, blocks, 2, "doc.go's code blocks")
	for i, name := range []string{"docDecodeSide", "docPrefillSide"} {
		require.Equal(t, snippet(t, string(src), name), blocks[i], "doc.go's code block %d is not %s's body", i+1, name)
	}
}

// codeBlocks are the doc comment's code blocks (lines "//\t..."), each
// line with its runs of spaces made one.
func codeBlocks(doc string) [][]string {
	var blocks [][]string
	var cur []string
	for _, line := range strings.Split(doc, "\n") {
		if code, ok := strings.CutPrefix(line, "//\t"); ok {
			cur = append(cur, strings.Join(strings.Fields(code), " "))
			continue
		}
		if cur != nil {
			blocks, cur = append(blocks, cur), nil
		}
	}
	return blocks
}

// snippet is the body of function name in src down to its snippetEnd
// line, each line with its runs of spaces made one.
func snippet(t *testing.T, src, name string) []string {
	_, body, ok := strings.Cut(src, "\nfunc "+name+"(")
	require.True(t, ok, "no function %s", name)
	_, body, _ = strings.Cut(body, "{\n")
	body, _, ok = strings.Cut(body, "\t"+snippetEnd+"\n")
	require.True(t, ok, "%s has no snippet end", name)
	var lines []string
	for _, line := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
		lines = append(lines, strings.Join(strings.Fields(line), " "))
	}
	return lines
}
