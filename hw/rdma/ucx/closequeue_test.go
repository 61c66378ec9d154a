//go:build ucx

package ucx

import (
	"runtime"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCloseFromDoneRunsQueuedWork: a done callback closes the transport
// while work handed to the progress goroutine before the Close waits in its
// queue: a batch the callback posted (Post accepted it), and a region
// another goroutine deregisters. The teardown that follows the callback
// must not drop them: the batch completes (its done is called) and
// Deregister returns, as they do when Close comes from outside.
func TestCloseFromDoneRunsQueuedWork(t *testing.T) {
	f := newFixture(t, 1<<16)
	extra, err := f.from.Register(f.src.Addr, 4096)
	require.NoError(t, err)
	second := make(chan error, 1)
	deregistered := make(chan error, 1)
	res := make(chan error, 1)
	require.NoError(t, f.ep.Post([]rdma.Write{f.write(0, 64)}, func(err error) {
		if err != nil {
			res <- err
			return
		}
		if err := f.ep.Post([]rdma.Write{f.write(64, 64)}, func(err error) { second <- err }); err != nil {
			res <- err
			return
		}
		go func() { deregistered <- extra.Deregister() }()
		for f.from.queued.Load() < 2 { // the batch and the unmap
			runtime.Gosched()
		}
		res <- f.from.Close()
	}))
	require.NoError(t, waitErr(t, res))
	err = waitErr(t, second)
	if err != nil {
		assert.True(t, errors.Is(err, rdma.ErrEndpointBroken), "%v", err)
	}
	require.NoError(t, waitErr(t, deregistered))
	require.NoError(t, f.from.Close())
}
