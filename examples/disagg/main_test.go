package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestDisagg runs the decode loop and the prefill loop together, as a user
// would: every request must decode from the prefill's bytes, and the
// session must end complete.
func TestDisagg(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"decode: room 1 complete in 2 chunks, 6 pages",
		"decode: room 3 complete in 2 chunks, 6 pages",
		"prefill: the decode server accepted 6 chunks, 0 failed",
		"decode: session of 6 chunks complete: true",
		"every request decoded",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in:\n%s", want, out.String())
		}
	}
}
