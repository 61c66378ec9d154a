package actors

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// layoutMLA returns an MLA layout of n buffers, hooks hook layers, group k.
func layoutMLA(t testing.TB, n, hooks, k int) *plan.Layout {
	bufs := make([]plan.Buffer, n)
	keys := make([]rdma.LocalKey, n)
	for i := range bufs {
		bufs[i] = plan.Buffer{Name: "KV", Base: uint64(0x10000 * (i + 1)), ItemLen: 16, Pages: 64, Layer: i}
		keys[i] = rdma.LocalKey(i + 1)
	}
	l, err := plan.NewLayout(bufs, keys, hooks, k, 4, cp.CP{Size: 1})
	require.NoError(t, err)
	return l
}

func planOf(mode cp.Mode, dests, owned int) *plan.Plan {
	p := &plan.Plan{Chunk: messages.Chunk{ChunkKey: messages.ChunkKey{Room: 7, Start: 0, End: 16}, Serial: 1}, Mode: mode, Owned: owned}
	for d := 0; d < dests; d++ {
		p.Dests = append(p.Dests, plan.Dest{Info: d, Peer: "d", Runs: []cp.Run{{Src: 0, Dst: 0, Len: int32(owned)}}})
	}
	return p
}

type fakeEvent struct{}

func (fakeEvent) Wait(context.Context) error { return nil }

// submits returns the Work of every Submit effect, copied (Step reuses its
// slice).
func submits(effs []Effect) []messages.Work {
	var out []messages.Work
	for _, e := range effs {
		if s, ok := e.(Submit); ok {
			out = append(out, s.Work)
		}
	}
	return out
}

func reply(effs []Effect) (messages.Result, bool) {
	for _, e := range effs {
		if r, ok := e.(AnswerFinish); ok {
			return r.Result, true
		}
	}
	return messages.Result{}, false
}

func has[T Effect](effs []Effect) bool {
	for _, e := range effs {
		if _, ok := e.(T); ok {
			return true
		}
	}
	return false
}

func finishMsg() (*messages.Finish, chan messages.Result) {
	ch := make(chan messages.Result, 1)
	return &messages.Finish{Room: 7, Timeout: time.Second, Event: fakeEvent{}, Reply: ch}, ch
}

// posted answers every Submit of effs as posted, then completes each batch.
func serve(c *ChunkCore, effs []Effect, batchErr error) []Effect {
	var out []Effect
	works := submits(effs)
	for _, w := range works {
		out = append(out, c.Step(&messages.Submitted{Seq: w.Seq, Dest: w.Dest, Posted: true, Bytes: 10, Blocks: 1})...)
	}
	for _, w := range works {
		out = append(out, c.Step(&messages.BatchDone{Seq: w.Seq, Dest: w.Dest, Err: batchErr})...)
	}
	return out
}

func TestChunkGroupsDedupAndForwardBinding(t *testing.T) {
	l := layoutMLA(t, 79, 78, 8) // the commit log: 78 hooks over 79 buffers
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 4))

	assert.Empty(t, c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}}), "unbound: ignored")
	c.Step(&messages.Bind{Forward: 1})
	c.Step(&messages.Bind{Forward: 2}) // a second Bind never rebinds
	w := submits(c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}}))
	require.Len(t, w, 1)
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, w[0].Buffers)
	assert.Empty(t, c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}}), "duplicate group")
	assert.Empty(t, c.Step(&messages.GroupReady{Forward: 2, Group: 1, Event: fakeEvent{}}), "another forward")

	// Later forwards re-fire every layer many times: the finish target stays
	// at most one submit per group plus the rest (the 3042-5538 bug).
	for f := uint64(2); f < 40; f++ {
		for g := 0; g < l.Groups.Count(); g++ {
			c.Step(&messages.GroupReady{Forward: f, Group: g, Event: fakeEvent{}})
		}
	}
	for g := 1; g < l.Groups.Count(); g++ {
		c.Step(&messages.GroupReady{Forward: 1, Group: g, Event: fakeEvent{}})
	}
	enq, _, _, _ := c.Counts()
	assert.Equal(t, 10, enq, "one submit per group")
	rest := submits(c.Step(&messages.ForwardEnd{Forward: 1, Event: fakeEvent{}}))
	require.Len(t, rest, 1)
	assert.Equal(t, messages.Rest, rest[0].Seq)
	assert.Equal(t, []int{78}, rest[0].Buffers, "the MTP buffer fires no hook and goes at the end")
	enq, _, _, _ = c.Counts()
	assert.Equal(t, 11, enq)
	assert.LessOrEqual(t, enq, l.Groups.Count()+1)
}

func TestChunkLastPartialGroup(t *testing.T) {
	l := layoutMLA(t, 10, 10, 4) // groups [0,4) [4,8) [8,10)
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	c.Step(&messages.Bind{Forward: 1})
	w := submits(c.Step(&messages.GroupReady{Forward: 1, Group: 2, Event: fakeEvent{}}))
	require.Len(t, w, 1)
	assert.Equal(t, []int{8, 9}, w[0].Buffers)
}

func TestChunkGroupsThatNeverFiredGoAtTheEnd(t *testing.T) {
	l := layoutMLA(t, 12, 12, 4)
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	c.Step(&messages.Bind{Forward: 1})
	c.Step(&messages.GroupReady{Forward: 1, Group: 1, Event: fakeEvent{}})
	rest := submits(c.Step(&messages.ForwardEnd{Forward: 1, Event: fakeEvent{}}))
	require.Len(t, rest, 1)
	assert.Equal(t, []int{0, 1, 2, 3, 8, 9, 10, 11}, rest[0].Buffers, "completion is gated on what was enqueued, not on all layers firing")
}

func TestChunkFinishWaitsEveryBatch(t *testing.T) {
	l := layoutMLA(t, 8, 8, 4)
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	c.Step(&messages.Bind{Forward: 1})
	works := submits(c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}}))
	g1 := submits(c.Step(&messages.GroupReady{Forward: 1, Group: 1, Event: fakeEvent{}}))
	works = append(works, g1...)
	assert.Empty(t, submits(c.Step(&messages.ForwardEnd{Forward: 1, Event: fakeEvent{}})), "every buffer was covered by a group")

	f, _ := finishMsg()
	effs := c.Step(f)
	assert.True(t, has[StartTimer](effs))
	_, answered := reply(effs)
	assert.False(t, answered)
	for _, w := range works {
		_, answered = reply(c.Step(&messages.Submitted{Seq: w.Seq, Posted: true}))
		assert.False(t, answered, "posted is not landed")
	}
	_, answered = reply(c.Step(&messages.BatchDone{Seq: works[0].Seq}))
	assert.False(t, answered, "one batch still in flight")
	r, answered := reply(c.Step(&messages.BatchDone{Seq: works[1].Seq}))
	require.True(t, answered)
	assert.Equal(t, messages.Succeeded, r.Status)
	assert.Equal(t, 2, r.Stats.Batches)
	assert.True(t, c.Done())
}

func TestChunkCompletionBeforeSubmittedReport(t *testing.T) {
	// The transport may report a batch complete before the submitter's
	// Submitted arrives: the core must still wait for both.
	l := layoutMLA(t, 4, 4, 4)
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	c.Step(&messages.Bind{Forward: 1})
	c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}})
	c.Step(&messages.ForwardEnd{Forward: 1, Event: fakeEvent{}})
	f, _ := finishMsg()
	c.Step(f)
	_, answered := reply(c.Step(&messages.BatchDone{Seq: 0}))
	assert.False(t, answered)
	r, answered := reply(c.Step(&messages.Submitted{Seq: 0, Posted: true}))
	require.True(t, answered)
	assert.Equal(t, messages.Succeeded, r.Status)
}

func TestChunkFinishBeforeForwardEndWaitsForIt(t *testing.T) {
	l := layoutMLA(t, 4, 3, 4)
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	c.Step(&messages.Bind{Forward: 1})
	w := append([]Effect(nil), c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}})...) // Step reuses its slice
	f, _ := finishMsg()
	assert.Empty(t, submits(c.Step(f)), "layers not enqueued yet cannot be gated: wait for the forward's end")
	_, answered := reply(serve(c, w, nil))
	assert.False(t, answered)
	rest := c.Step(&messages.ForwardEnd{Forward: 1, Event: fakeEvent{}})
	require.Len(t, submits(rest), 1)
	r, answered := reply(serve(c, rest, nil))
	require.True(t, answered)
	assert.Equal(t, messages.Succeeded, r.Status)
}

func TestChunkEmptyIsSkipped(t *testing.T) {
	l := layoutMLA(t, 4, 4, 2)
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 0)) // this CP rank owns no page of the chunk
	c.Step(&messages.Bind{Forward: 1})
	assert.Empty(t, submits(c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}})))
	assert.Empty(t, submits(c.Step(&messages.ForwardEnd{Forward: 1, Event: fakeEvent{}})))
	f, _ := finishMsg()
	r, answered := reply(c.Step(f))
	require.True(t, answered)
	assert.Equal(t, messages.Succeeded, r.Status)
	assert.Zero(t, r.Stats.Batches)
}

func TestChunkMonolithic(t *testing.T) {
	l := layoutMLA(t, 4, 3, 2)
	c := NewChunkCore(l, planOf(cp.Monolithic, 2, 3))
	c.Step(&messages.Bind{Forward: 1})
	assert.Empty(t, submits(c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}})), "monolithic ignores groups")
	w := submits(c.Step(&messages.ForwardEnd{Forward: 1, Event: fakeEvent{}}))
	require.Len(t, w, 2, "every buffer to both destinations")
	for d, x := range w {
		assert.Equal(t, d, x.Dest)
		assert.Equal(t, []int{0, 1, 2, 3}, x.Buffers)
	}
}

// Per layer to two destinations, the second a resharded peer whose PP stage
// holds only layers 2 and 3: every group goes to the first, only the groups
// with a layer the route takes to the second (no empty batch), and the rest
// (hookless buffer 3) to both.
func TestChunkSkipsDestinationsTheRouteGivesNothing(t *testing.T) {
	l := layoutMLA(t, 4, 3, 2) // groups {0, 1} and {2}; buffer 3 hookless
	p := planOf(cp.PerLayer, 2, 3)
	p.Dests[1].Route = &plan.Route{DstBuffers: []int{-1, -1, 0, 1}}
	c := NewChunkCore(l, p)
	c.Step(&messages.Bind{Forward: 1})
	w := submits(c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}}))
	require.Len(t, w, 1, "layers 0 and 1 do not go to destination 1")
	assert.Equal(t, 0, w[0].Dest)
	w = submits(c.Step(&messages.GroupReady{Forward: 1, Group: 1, Event: fakeEvent{}}))
	require.Len(t, w, 2)
	assert.Equal(t, []int{0, 1}, []int{w[0].Dest, w[1].Dest})
	w = submits(c.Step(&messages.ForwardEnd{Forward: 1, Event: fakeEvent{}}))
	require.Len(t, w, 2)
	assert.Equal(t, []int{3}, w[1].Buffers)
	e, _, _, _ := c.Counts()
	assert.Equal(t, 5, e, "the finish target counts only the Work sent")
}

func TestChunkNeverBoundSendsAtFinish(t *testing.T) {
	l := layoutMLA(t, 4, 4, 2)
	c := NewChunkCore(l, planOf(cp.Monolithic, 1, 3))
	f, _ := finishMsg()
	effs := c.Step(f)
	w := submits(effs)
	require.Len(t, w, 1)
	assert.Equal(t, f.Event, w[0].Event, "gated by the event recorded at finish")
	r, answered := reply(serve(c, effs, nil))
	require.True(t, answered)
	assert.Equal(t, messages.Succeeded, r.Status)
	// A forward beginning after the finish does not bind it.
	assert.Empty(t, c.Step(&messages.Bind{Forward: 9}))
}

func TestChunkSubmitFailureFailsClosed(t *testing.T) {
	l := layoutMLA(t, 8, 8, 4)
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	c.Step(&messages.Bind{Forward: 1})
	c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}})
	effs := c.Step(&messages.Submitted{Seq: 0, Err: errors.New("post refused")})
	assert.True(t, has[CancelWork](effs), "a failure stops the chunk's other work")
	assert.Empty(t, submits(c.Step(&messages.GroupReady{Forward: 1, Group: 1, Event: fakeEvent{}})), "nothing more after a failure")
	assert.Empty(t, submits(c.Step(&messages.ForwardEnd{Forward: 1, Event: fakeEvent{}})))
	f, _ := finishMsg()
	r, answered := reply(c.Step(f))
	require.True(t, answered)
	assert.Equal(t, messages.Failed, r.Status)
	assert.ErrorContains(t, r.Err, "post refused")
	assert.ErrorContains(t, r.Err, "room 7 chunk 0 group 0")
}

func TestChunkWaitFailurePropagates(t *testing.T) {
	l := layoutMLA(t, 4, 4, 4)
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	c.Step(&messages.Bind{Forward: 1})
	c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}})
	c.Step(&messages.Submitted{Seq: 0, Err: errors.Mark(errors.New("illegal address"), ErrEventWait)})
	f, _ := finishMsg()
	r, answered := reply(c.Step(f))
	require.True(t, answered)
	assert.Equal(t, messages.Failed, r.Status)
	assert.True(t, errors.Is(r.Err, ErrEventWait))
}

func TestChunkFailedBatchWaitsForOthersThenFails(t *testing.T) {
	l := layoutMLA(t, 8, 8, 4)
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	c.Step(&messages.Bind{Forward: 1})
	c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}})
	c.Step(&messages.GroupReady{Forward: 1, Group: 1, Event: fakeEvent{}})
	c.Step(&messages.ForwardEnd{Forward: 1, Event: fakeEvent{}})
	c.Step(&messages.Submitted{Seq: 0, Posted: true})
	c.Step(&messages.Submitted{Seq: 1, Posted: true})
	f, _ := finishMsg()
	c.Step(f)
	_, answered := reply(c.Step(&messages.BatchDone{Seq: 0, Err: errors.New("completion error")}))
	assert.False(t, answered, "batch 1 may still land: quiesce before answering")
	r, answered := reply(c.Step(&messages.BatchDone{Seq: 1}))
	require.True(t, answered)
	assert.Equal(t, messages.Failed, r.Status, "nothing after a failure is a success")
}

func TestChunkTimeoutTearsDownThenFails(t *testing.T) {
	l := layoutMLA(t, 4, 4, 4)
	start := func() *ChunkCore {
		c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
		c.Step(&messages.Bind{Forward: 1})
		c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}})
		c.Step(&messages.ForwardEnd{Forward: 1, Event: fakeEvent{}})
		c.Step(&messages.Submitted{Seq: 0, Posted: true}) // in flight, never completes
		f, _ := finishMsg()
		var timer time.Duration
		for _, e := range c.Step(f) {
			if st, ok := e.(StartTimer); ok {
				timer = st.After
			}
		}
		assert.Equal(t, time.Second-100*time.Millisecond, timer, "a tenth of the timeout is kept for the teardown")
		return c
	}

	c := start()
	effs := c.Step(&messages.Timeout{})
	assert.True(t, has[Teardown](effs), "whatever is in flight is torn down")
	_, answered := reply(effs)
	assert.False(t, answered, "no answer before the teardown reported back")
	assert.Empty(t, c.Step(&messages.Timeout{}), "one teardown")
	assert.Empty(t, c.Step(&messages.BatchDone{Seq: 0, Err: errors.New("torn down")}), "still waiting for the teardown report")
	effs = c.Step(&messages.TornDown{})
	r, answered := reply(effs)
	require.True(t, answered)
	assert.IsType(t, ChunkEnded{}, effs[0], "the room stops counting the chunk before Finish returns")
	assert.Equal(t, messages.Failed, r.Status)
	assert.True(t, errors.Is(r.Err, ErrTimeout))
	assert.False(t, errors.Is(r.Err, rdma.ErrNotQuiesced))
	assert.ErrorContains(t, r.Err, "batches 0/1 completed")
	assert.Equal(t, []Effect{Stray{Seq: 0, Dest: 0, What: "BatchDone"}}, c.Step(&messages.BatchDone{Seq: 0}),
		"a done chunk ignores late messages, and says one that answers nothing (a second completion)")

	c = start()
	c.Step(&messages.Timeout{})
	r, _ = reply(c.Step(&messages.TornDown{Err: errors.Mark(errors.New("drain timed out"), rdma.ErrNotQuiesced)}))
	assert.True(t, errors.Is(r.Err, ErrTimeout))
	assert.True(t, errors.Is(r.Err, rdma.ErrNotQuiesced), "the caller learns its pages may still be written")
}

func TestChunkDropDrains(t *testing.T) {
	l := layoutMLA(t, 8, 8, 4)
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	c.Step(&messages.Bind{Forward: 1})
	c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}})
	c.Step(&messages.GroupReady{Forward: 1, Group: 1, Event: fakeEvent{}})
	effs := c.Step(&messages.Drop{Room: 7, Timeout: time.Second})
	assert.True(t, has[CancelWork](effs), "no new posts after a drop")
	c.Step(&messages.Submitted{Seq: 0, Posted: true})
	c.Step(&messages.Submitted{Seq: 1}) // skipped: the gate was closed
	assert.False(t, c.Done(), "a posted batch is still in flight")
	effs = c.Step(&messages.BatchDone{Seq: 0})
	require.True(t, c.Done())
	var ended *messages.Result
	for _, e := range effs {
		if x, ok := e.(ChunkEnded); ok {
			ended = &x.Result
		}
	}
	require.NotNil(t, ended)
	assert.Equal(t, messages.Dropped, ended.Status)
}

// A chunk being finished while its forward still runs, then dropped,
// answers DROPPED once what it posted landed, as a dropped chunk that was
// not being finished does: its gate is closed, nothing it could still owe
// goes out. It used to wait for its forward's end too (a Finish that
// succeeds must), so a Drop of a request whose forward stopped without an
// End held its caller until the drop's timeout.
func TestChunkDropDuringFinishAnswersBeforeTheForwardEnds(t *testing.T) {
	l := layoutMLA(t, 8, 8, 4)
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	c.Step(&messages.Bind{Forward: 1})
	w := append([]Effect(nil), c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}})...)
	f, finished := finishMsg()
	c.Step(f)
	_, answered := reply(serve(c, w, nil))
	require.False(t, answered, "a Finish waits for the forward's end")
	effs := c.Step(&messages.Drop{Room: 7, Timeout: time.Second})
	r, answered := reply(effs)
	require.True(t, answered, "dropped with nothing in flight: answer at once, not at the forward's end")
	assert.Equal(t, messages.Dropped, r.Status)
	assert.True(t, errors.Is(r.Err, ErrDropped), "%v", r.Err)
	assert.True(t, c.Done())
	assert.Empty(t, finished, "the answer is an effect, not yet sent")
}

// A chunk that failed while its Finish waited (one batch failed, another
// still in flight), then was dropped, answers DROPPED: the Finish's error
// then says ErrDropped, as the Finish contract says of a DROPPED result,
// beside why the chunk failed. It used to carry only the failure.
func TestChunkFailedThenDroppedSaysDropped(t *testing.T) {
	l := layoutMLA(t, 8, 8, 4)
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	c.Step(&messages.Bind{Forward: 1})
	c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}})
	c.Step(&messages.GroupReady{Forward: 1, Group: 1, Event: fakeEvent{}})
	c.Step(&messages.ForwardEnd{Forward: 1, Event: fakeEvent{}})
	f, _ := finishMsg()
	c.Step(f)
	c.Step(&messages.Submitted{Seq: 0, Posted: true})
	c.Step(&messages.Submitted{Seq: 1, Posted: true})
	c.Step(&messages.BatchDone{Seq: 0, Err: errors.New("remote access error")})
	c.Step(&messages.Drop{Room: 7, Timeout: time.Second})
	r, answered := reply(c.Step(&messages.BatchDone{Seq: 1}))
	require.True(t, answered)
	assert.Equal(t, messages.Dropped, r.Status)
	assert.True(t, errors.Is(r.Err, ErrDropped), "%v", r.Err)
	assert.ErrorContains(t, r.Err, "remote access error")
}

func TestChunkCancelByCaller(t *testing.T) {
	l := layoutMLA(t, 4, 4, 4)
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	c.Step(&messages.Bind{Forward: 1})
	f, _ := finishMsg()
	c.Step(f)
	r, answered := reply(c.Step(&messages.Cancel{Reason: context.Canceled}))
	require.True(t, answered, "nothing in flight: answer at once")
	assert.Equal(t, messages.Failed, r.Status)
	assert.True(t, errors.Is(r.Err, ErrCancelled))
}

func fanOutTo(effs []Effect) []messages.Chunk {
	var out []messages.Chunk
	for _, e := range effs {
		if f, ok := e.(FanOut); ok {
			for _, t := range f.To {
				out = append(out, t.Chunk)
			}
		}
	}
	return out
}

func TestForwardCoreBindsOnlyPending(t *testing.T) {
	c := NewForwardCore()
	a := messages.Chunk{ChunkKey: messages.ChunkKey{Room: 1}, Serial: 1}
	b := messages.Chunk{ChunkKey: messages.ChunkKey{Room: 2}, Serial: 2}
	c.Step(&messages.Pending{Chunk: a})
	assert.Equal(t, []messages.Chunk{a}, fanOutTo(c.Step(&messages.Begin{Forward: 1})))
	c.Step(&messages.Pending{Chunk: b}) // registered during forward 1: binds to forward 2
	assert.Equal(t, []messages.Chunk{a}, fanOutTo(c.Step(&messages.Boundary{Forward: 1, Group: 0, Event: fakeEvent{}})),
		"forward 1's group reaches forward 1's chunks only")
	c.Step(&messages.Begin{Forward: 2})
	assert.Equal(t, []messages.Chunk{b}, fanOutTo(c.Step(&messages.Boundary{Forward: 2, Group: 0, Event: fakeEvent{}})))
	assert.Equal(t, []messages.Chunk{a}, fanOutTo(c.Step(&messages.End{Forward: 1, Event: fakeEvent{}})))
	assert.Empty(t, c.Active(1), "an ended forward is forgotten")
	c.Step(&messages.Forget{Chunk: b})
	assert.Empty(t, c.Step(&messages.Boundary{Forward: 2, Group: 1}), "a finished chunk is forgotten")
	effs := c.Step(&messages.Begin{Forward: 3, Bound: make(chan int, 1)})
	require.Len(t, effs, 1)
	assert.Equal(t, 0, effs[0].(AnswerBegin).N, "a forward with no chunk says so")
}

func TestRoomCoreFIFO(t *testing.T) {
	c := NewRoomCore(5)
	ch := func(start int, serial uint64) messages.Chunk {
		return messages.Chunk{ChunkKey: messages.ChunkKey{Room: 5, Start: start, End: start + 16}, Serial: serial}
	}
	added := make(chan messages.Added, 4)
	add := func(x messages.Chunk) []Effect {
		return c.Step(&messages.AddChunk{Chunk: x, PerLayer: true, Reply: added})
	}
	effs := add(ch(0, 1))
	assert.True(t, has[SpawnChunk](effs))
	effs = add(ch(0, 2)) // same key again: never overwrite the active context
	assert.False(t, has[SpawnChunk](effs))
	var a AnswerRegister
	for _, e := range effs {
		if x, ok := e.(AnswerRegister); ok {
			a = x
		}
	}
	assert.True(t, a.Added.Existing)
	assert.Equal(t, ch(0, 1), a.Added.Chunk)
	add(ch(16, 3))
	assert.Equal(t, []messages.Chunk{ch(0, 1), ch(16, 3)}, c.Queue())

	rc := make(chan messages.Result, 1)
	effs = c.Step(&messages.Finish{Room: 5, Reply: rc})
	var sent Send
	for _, e := range effs {
		if x, ok := e.(Send); ok {
			sent = x
		}
	}
	assert.Equal(t, ch(0, 1), sent.To, "finish pops the front")
	assert.Equal(t, []messages.Chunk{ch(16, 3)}, c.Queue())
	add(ch(32, 4))

	dr := make(chan []messages.Result, 1)
	effs = c.Step(&messages.Drop{Room: 5, Reply: dr})
	n := 0
	for _, e := range effs {
		if _, ok := e.(Send); ok {
			n++
		}
	}
	assert.Equal(t, 3, n, "drop drains every queued chunk and the one being finished")
	assert.Empty(t, c.Queue())
	assert.False(t, has[AnswerDrop](c.Step(&messages.ChunkDone{Result: messages.Result{Chunk: ch(16, 3)}})))
	effs = c.Step(&messages.ChunkDone{Result: messages.Result{Chunk: ch(32, 4)}})
	assert.False(t, has[AnswerDrop](effs), "the chunk being finished has not quiesced yet")
	effs = c.Step(&messages.ChunkDone{Result: messages.Result{Chunk: ch(0, 1)}})
	assert.True(t, has[AnswerDrop](effs), "drop answers once every dropped chunk quiesced, the finishing one too")
	assert.True(t, has[Idle](effs))

	effs = c.Step(&messages.Finish{Room: 5, Reply: rc})
	r, ok := reply(effs)
	require.True(t, ok)
	assert.True(t, errors.Is(r.Err, ErrBadInput))
}

// A Drop scoped to a decode peer (a decode's cancel) reaches only a room
// that has a live chunk toward that peer, the one being finished included.
func TestRoomCoreDropScopedToPeer(t *testing.T) {
	c := NewRoomCore(5)
	ch := func(start int, serial uint64) messages.Chunk {
		return messages.Chunk{ChunkKey: messages.ChunkKey{Room: 5, Start: start, End: start + 16}, Serial: serial}
	}
	added := make(chan messages.Added, 4)
	c.Step(&messages.AddChunk{Chunk: ch(0, 1), Peers: []string{"d1"}, Reply: added})
	c.Step(&messages.Finish{Room: 5, Reply: make(chan messages.Result, 1)}) // the chunk toward d1 is being finished
	c.Step(&messages.AddChunk{Chunk: ch(16, 2), Peers: []string{"d2"}, Reply: added})

	dr := make(chan []messages.Result, 1)
	effs := c.Step(&messages.Drop{Room: 5, Peer: "d3", Reply: dr})
	require.True(t, has[AnswerDrop](effs), "no chunk toward d3: answered at once")
	for _, e := range effs {
		if a, ok := e.(AnswerDrop); ok {
			require.Len(t, a.Results, 1)
			assert.True(t, errors.Is(a.Results[0].Err, ErrNoChunk), "%v", a.Results[0].Err)
			assert.ErrorContains(t, a.Results[0].Err, "toward peer d3")
		}
	}
	assert.False(t, has[Send](effs), "nothing of the room is dropped")
	assert.Equal(t, []messages.Chunk{ch(16, 2)}, c.Queue())

	effs = c.Step(&messages.Drop{Room: 5, Peer: "d1", Reply: dr})
	n := 0
	for _, e := range effs {
		if _, ok := e.(Send); ok {
			n++
		}
	}
	assert.Equal(t, 2, n, "a chunk toward d1 (being finished): the whole room is dropped")
	assert.False(t, has[AnswerDrop](effs))
}

// A second Drop of a room (another caller's, or a second decode peer's
// cancel: each rank of a decode TP group cancels the room toward itself)
// while the chunks a first Drop took out of the queue are still quiescing
// waits for them too: it used to answer at once, as for a room with no
// chunk, and CancelRoom took that for "nothing of the room goes to the
// peer" and returned nil while its writes could still land.
func TestRoomCoreSecondDropWaitsForTheFirstsChunks(t *testing.T) {
	c := NewRoomCore(5)
	x := messages.Chunk{ChunkKey: messages.ChunkKey{Room: 5, End: 16}, Serial: 1}
	c.Step(&messages.AddChunk{Chunk: x, Peers: []string{"d1", "d2"}, Reply: make(chan messages.Added, 1)})
	first, second, third := make(chan []messages.Result, 1), make(chan []messages.Result, 1), make(chan []messages.Result, 1)
	effs := c.Step(&messages.Drop{Room: 5, Peer: "d1", Reply: first})
	require.True(t, has[Send](effs))
	require.False(t, has[AnswerDrop](effs), "the chunk has not quiesced")

	effs = c.Step(&messages.Drop{Room: 5, Peer: "d2", Reply: second})
	assert.False(t, has[AnswerDrop](effs), "a second Drop answered while the first one's chunk still quiesced")
	effs = c.Step(&messages.Drop{Room: 5, Reply: third})
	assert.False(t, has[AnswerDrop](effs), "a third, unscoped Drop answered while the chunk still quiesced")

	res := messages.Result{Chunk: x, Status: messages.Dropped}
	effs = c.Step(&messages.ChunkDone{Result: res})
	var answered []chan<- []messages.Result
	for _, e := range effs {
		if a, ok := e.(AnswerDrop); ok {
			answered = append(answered, a.To)
			assert.Equal(t, []messages.Result{res}, a.Results)
		}
	}
	assert.ElementsMatch(t, []chan<- []messages.Result{first, second, third}, answered, "each Drop answers once the chunk ended")
	assert.True(t, has[Idle](effs))
}

func TestManagerCoreStopsOnlyQuietRooms(t *testing.T) {
	c := NewManagerCore()
	added := make(chan messages.Added, 1)
	effs := c.Step(&messages.AddChunk{Chunk: messages.Chunk{ChunkKey: messages.ChunkKey{Room: 3}}, Reply: added})
	assert.True(t, has[SpawnRoom](effs))
	rc := make(chan messages.Result, 1)
	c.Step(&messages.Finish{Room: 3, Reply: rc})
	assert.Empty(t, c.Step(&messages.RoomIdle{Room: 3, Seen: 1}), "the Finish is still in flight to the room")
	assert.True(t, has[StopRoom](c.Step(&messages.RoomIdle{Room: 3, Seen: 2})))
	r, ok := reply(c.Step(&messages.Finish{Room: 3, Reply: rc}))
	require.True(t, ok)
	assert.True(t, errors.Is(r.Err, ErrBadInput))
	assert.True(t, errors.Is(r.Err, ErrNoChunk))
	assert.ErrorContains(t, r.Err, "room 3: no chunk to finish")
}

// TestChunkLateCompletionInEveryOrder: a batch written off at its
// completion deadline and re-sent may still see its own completion (ok,
// failed as the Close fails it, or never), before or after the Quiesced,
// the re-send's Submitted and its BatchDone. In every order the chunk
// answers SUCCESS exactly when the re-send's Submitted and BatchDone both
// came, never counts the late completion as the re-send's, and reports no
// stray.
func TestChunkLateCompletionInEveryOrder(t *testing.T) {
	broken := errors.Mark(errors.New("endpoint torn down"), rdma.ErrEndpointBroken)
	for _, late := range []struct {
		name string
		msg  *messages.BatchDone // nil: it never comes
	}{
		{"ok", &messages.BatchDone{Seq: messages.Rest}},
		{"failed", &messages.BatchDone{Seq: messages.Rest, Err: broken, Broken: true}},
		{"never", nil},
	} {
		events := []string{"quiesced", "submitted", "done"}
		if late.msg != nil {
			events = append(events, "late")
		}
		for _, order := range permutations(events) {
			name := late.name + "/" + strings.Join(order, ",")
			if slices.Index(order, "quiesced") > min(slices.Index(order, "submitted"), slices.Index(order, "done")) {
				continue // the re-send is submitted once the endpoint is quiet
			}
			c := NewChunkCore(layoutMLA(t, 4, 4, 4), planOf(cp.Monolithic, 1, 4))
			f, _ := finishMsg()
			require.Len(t, submits(c.Step(f)), 1, name)
			effs := c.Step(&messages.Submitted{Seq: messages.Rest, Posted: true, Bytes: 10, Blocks: 1})
			require.Contains(t, effs, WatchBatch{Seq: messages.Rest, Try: 0, After: CompletionDeadline(time.Second)}, name)
			require.True(t, has[Resend](c.Step(&messages.BatchOverdue{Seq: messages.Rest})), name)
			seen := map[string]bool{}
			for _, ev := range order {
				var msg any
				switch ev {
				case "quiesced":
					msg = &messages.Quiesced{Seq: messages.Rest}
				case "submitted":
					msg = &messages.Submitted{Seq: messages.Rest, Posted: true, Bytes: 10, Blocks: 1}
				case "done":
					msg = &messages.BatchDone{Seq: messages.Rest, Try: 1}
				case "late":
					msg = late.msg
				}
				effs := c.Step(msg)
				landed := seen["submitted"] && seen["done"]
				seen[ev] = true
				if ev == "quiesced" {
					w := submits(effs)
					require.Len(t, w, 1, name)
					require.Equal(t, 1, w[0].Try, name)
				}
				r, answered := reply(effs)
				// Once, when the re-send's last report came.
				require.Equal(t, !landed && seen["submitted"] && seen["done"], answered, "%s: answered after %s", name, ev)
				if answered {
					require.Equal(t, messages.Succeeded, r.Status, "%s: %v", name, r.Err)
					require.Equal(t, 1, r.Stats.Resent, name)
					require.Equal(t, 1, r.Stats.Overdue, name)
				}
				require.False(t, has[Stray](effs), "%s: stray after %s", name, ev)
			}
			require.True(t, c.Done(), name)
		}
	}
}

// permutations returns every order of xs.
func permutations(xs []string) [][]string {
	if len(xs) <= 1 {
		return [][]string{append([]string(nil), xs...)}
	}
	var out [][]string
	for i := range xs {
		rest := append(append([]string(nil), xs[:i]...), xs[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]string{xs[i]}, p...))
		}
	}
	return out
}

// TestChunkSecondDropArmsItsTimer: a room sends a second Drop to a chunk a
// first Drop is still quiescing (another decode peer's cancel, the serving
// stack's own Drop), and the chunk arms that Drop's timer too: ignored, the
// second Drop was bounded only by the first one's, and one with a shorter
// timeout outlived its caller's bound.
func TestChunkSecondDropArmsItsTimer(t *testing.T) {
	l := layoutMLA(t, 8, 8, 4)
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	c.Step(&messages.Bind{Forward: 1})
	c.Step(&messages.GroupReady{Forward: 1, Group: 0, Event: fakeEvent{}})
	c.Step(&messages.Submitted{Seq: 0, Posted: true}) // a batch in flight
	effs := c.Step(&messages.Drop{Room: 7, Timeout: 30 * time.Second})
	require.True(t, has[StartTimer](effs))
	require.False(t, c.Done(), "a batch is in flight")
	effs = c.Step(&messages.Drop{Room: 7, Timeout: time.Second})
	var after []time.Duration
	for _, e := range effs {
		if s, ok := e.(StartTimer); ok {
			after = append(after, s.After)
		}
	}
	assert.Equal(t, []time.Duration{time.Second - TeardownReserve(time.Second)}, after, "the second Drop (1s) is bounded by its own timer, not only by the first one's 30s")
}
