package tally

import (
	"context"
	"runtime"
	"sync"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A poster keeping a window of batches in flight against a completer on
// another goroutine: every Wait returns only once its count is reached, and
// the window is never exceeded. A Wait that returned early (a lost check)
// lets the poster run ahead of the completer, which lags behind it.
func TestWaitKeepsTheWindow(t *testing.T) {
	const total, window = 20000, 8
	tl := New()
	posts := make(chan struct{}, total)
	var wg sync.WaitGroup
	wg.Go(func() {
		for range posts {
			runtime.Gosched() // lag behind the poster
			tl.Done(nil)
		}
	})
	ctx := context.Background()
	for posted := int64(0); posted < total; posted++ {
		if posted-tl.Count() >= window {
			require.NoError(t, tl.Wait(ctx, posted-window+1))
			require.GreaterOrEqual(t, tl.Count(), posted-window+1, "Wait returned before its count")
		}
		require.LessOrEqual(t, posted-tl.Count(), int64(window), "more than the window in flight")
		posts <- struct{}{}
	}
	close(posts)
	require.NoError(t, tl.Wait(ctx, total))
	require.Equal(t, int64(total), tl.Count())
	wg.Wait()
	require.NoError(t, tl.Err())
}

// Many completers at once: no completion is lost and the waiter wakes.
func TestWaitManyCompleters(t *testing.T) {
	const each, completers = 5000, 4
	tl := New()
	var wg sync.WaitGroup
	for range completers {
		wg.Go(func() {
			for range each {
				tl.Done(nil)
			}
		})
	}
	require.NoError(t, tl.Wait(context.Background(), each*completers))
	require.Equal(t, int64(each*completers), tl.Count())
	wg.Wait()
}

func TestWaitEndsWithItsContext(t *testing.T) {
	tl := New()
	tl.Done(nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := tl.Wait(ctx, 2)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, tl.Wait(ctx, 1), "a count already reached is not an error, whatever ctx says")
}

func TestFirstErrorKept(t *testing.T) {
	tl := New()
	first, second := errors.New("first"), errors.New("second")
	tl.Done(nil)
	require.NoError(t, tl.Err())
	tl.Done(first)
	tl.Done(second)
	tl.Done(nil)
	require.Equal(t, int64(4), tl.Count())
	require.Same(t, first, tl.Err())
}
