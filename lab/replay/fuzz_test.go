package replay

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvstream/kvstream/trace"
)

// FuzzReplayCores: whatever a trace file holds (an engine's or a decode
// server's), once the reader accepted its header and records the core
// replay allocates within their bounds and never panics: it ends with an
// outcome or an error.
func FuzzReplayCores(f *testing.F) {
	for _, name := range []string{"partial_last_group", "chunked_fifo_late_chunk", "timeout"} {
		if raw, err := os.ReadFile(filepath.Join("..", "..", "tests", "testdata", "traces", name+".jsonl")); err == nil {
			f.Add(raw)
		}
	}
	// Decode servers' traces, which Cores replays through a decode core.
	for _, name := range []string{"lost_prefill", "group"} {
		if raw, err := os.ReadFile(filepath.Join("..", "..", "decode", "testdata", "traces", name+".jsonl")); err == nil {
			f.Add(raw)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rd, err := trace.NewReader(bytes.NewReader(data))
		if err != nil {
			return
		}
		out, err := Cores(rd)
		if err == nil && out == nil {
			t.Fatal("no outcome and no error")
		}
		if err == nil && out.Divergence != nil {
			_ = out.String()
		}
	})
}
