package actors

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/messages"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSubmitCoreDecisions walks every way a Work ends: each case feeds the
// wait's end, then each post's end, and checks the effects of every step.
func TestSubmitCoreDecisions(t *testing.T) {
	hung := errors.New("event wait: context canceled")
	illegal := errors.New("illegal address")
	lostDev := errors.Mark(errors.New("CUDA_ERROR_LAUNCH_FAILED"), cuda.ErrDeviceLost)
	lostPeer := errors.Mark(errors.New(`peer "d0" lost`), rdma.ErrEndpointBroken)
	broken := errors.Mark(errors.New("endpoint closed"), rdma.ErrEndpointBroken)
	refused := errors.New("batch too large")
	unreachable := errors.New("connect refused")

	type step = submitStep
	failed := func(err error) AnswerWork { return AnswerWork{Outcome: WorkFailed, Err: err} }
	cases := []struct {
		name  string
		steps []step
		// errIs, when set, is a mark the final answer's error carries.
		errIs error
	}{
		{name: "posted", steps: []step{
			{&WaitEnded{}, []Effect{PostBatch{Try: 1}}},
			{&PostEnded{Posted: true, Writes: 3}, []Effect{AnswerWork{Outcome: WorkPosted}}},
		}},
		{name: "gate closed before the post: skipped", steps: []step{
			{&WaitEnded{}, []Effect{PostBatch{Try: 1}}},
			{&PostEnded{Writes: 3}, []Effect{AnswerWork{Outcome: WorkSkipped}}},
		}},
		{name: "wait ended by the chunk's cancellation: skipped, not failed", steps: []step{
			{&WaitEnded{Err: hung, Cancelled: true}, []Effect{AnswerWork{Outcome: WorkSkipped}}},
		}},
		{name: "wait failed: failed", errIs: ErrEventWait, steps: []step{
			{&WaitEnded{Err: illegal}, []Effect{failed(errors.Mark(illegal, ErrEventWait))}},
		}},
		{name: "device lost: failed, then escalate", errIs: cuda.ErrDeviceLost, steps: []step{
			{&WaitEnded{Err: lostDev}, []Effect{failed(errors.Mark(lostDev, ErrEventWait)), Escalate{Cause: lostDev}}},
		}},
		{name: "device lost while cancelled: skipped", steps: []step{
			{&WaitEnded{Err: lostDev, Cancelled: true}, []Effect{AnswerWork{Outcome: WorkSkipped}}},
		}},
		{name: "peer lost: disconnect and fail, no restart", errIs: rdma.ErrEndpointBroken, steps: []step{
			{&WaitEnded{PeerLost: lostPeer}, []Effect{Disconnect{Peer: "d0"}, failed(lostPeer)}},
		}},
		{name: "wait failure wins over a lost peer", errIs: ErrEventWait, steps: []step{
			{&WaitEnded{Err: illegal, PeerLost: lostPeer}, []Effect{failed(errors.Mark(illegal, ErrEventWait))}},
		}},
		{name: "broken endpoint: retry once on a fresh connection", steps: []step{
			{&WaitEnded{}, []Effect{PostBatch{Try: 1}}},
			{&PostEnded{Err: broken, Writes: 3}, []Effect{Disconnect{Peer: "d0"}, PostBatch{Try: 2}}},
			{&PostEnded{Posted: true, Writes: 3}, []Effect{AnswerWork{Outcome: WorkPosted}}},
		}},
		{name: "broken twice: fail, then restart", errIs: rdma.ErrEndpointBroken, steps: []step{
			{&WaitEnded{}, []Effect{PostBatch{Try: 1}}},
			{&PostEnded{Err: broken, Writes: 3}, []Effect{Disconnect{Peer: "d0"}, PostBatch{Try: 2}}},
			{&PostEnded{Err: broken, Writes: 3}, []Effect{Disconnect{Peer: "d0"},
				failed(errors.Wrapf(broken, "post 3 writes to d0")), Restart{Peer: "d0", Cause: broken}}},
		}},
		{name: "cannot connect: fail, then restart", steps: []step{
			{&WaitEnded{}, []Effect{PostBatch{Try: 1}}},
			{&PostEnded{ConnErr: unreachable}, []Effect{failed(unreachable), Restart{Peer: "d0", Cause: unreachable}}},
		}},
		{name: "cannot reconnect after a broken endpoint: fail, then restart", steps: []step{
			{&WaitEnded{}, []Effect{PostBatch{Try: 1}}},
			{&PostEnded{Err: broken, Writes: 3}, []Effect{Disconnect{Peer: "d0"}, PostBatch{Try: 2}}},
			{&PostEnded{ConnErr: unreachable}, []Effect{failed(unreachable), Restart{Peer: "d0", Cause: unreachable}}},
		}},
		{name: "post refused for another reason: fail, no retry, no restart", steps: []step{
			{&WaitEnded{}, []Effect{PostBatch{Try: 1}}},
			{&PostEnded{Err: refused, Writes: 3}, []Effect{failed(errors.Wrapf(refused, "post 3 writes to d0"))}},
		}},
	}
	// Each case runs on a fresh core, and on one core reset after every
	// case before it, as a submitter reuses its cores: a reused core
	// decides as a fresh one.
	reused := NewSubmitCore("d1")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			runSubmitSteps(t, NewSubmitCore("d0"), tc.steps, tc.errIs)
		})
		t.Run(tc.name+"/reused", func(t *testing.T) {
			reused.reset("d0")
			runSubmitSteps(t, reused, tc.steps, tc.errIs)
		})
	}
}

// submitStep is one report fed to a SubmitCore and the effects it must
// return.
type submitStep = struct {
	in   any
	want []Effect
}

// runSubmitSteps feeds steps to c and checks the effects of each, that the
// final answer's error carries errIs (when set), and that an answered Work
// decides nothing more.
func runSubmitSteps(t *testing.T, c *SubmitCore, steps []submitStep, errIs error) {
	t.Helper()
	var last AnswerWork
	for i, s := range steps {
		got := append([]Effect(nil), c.Step(s.in)...)
		require.Len(t, got, len(s.want), "step %d: %v", i, got)
		for j := range got {
			assert.IsType(t, s.want[j], got[j], "step %d effect %d", i, j)
			if a, ok := got[j].(AnswerWork); ok {
				w := s.want[j].(AnswerWork)
				assert.Equal(t, w.Outcome, a.Outcome, "step %d", i)
				if w.Err == nil {
					assert.NoError(t, a.Err, "step %d", i)
				} else {
					assert.EqualError(t, a.Err, w.Err.Error(), "step %d", i)
				}
				last = a
				continue
			}
			assert.Equal(t, s.want[j], got[j], "step %d effect %d", i, j)
		}
	}
	if errIs != nil {
		assert.True(t, errors.Is(last.Err, errIs), "%v is not %v", last.Err, errIs)
	}
	assert.Empty(t, c.Step(&PostEnded{Posted: true}), "an answered Work decides nothing more")
}

// A reset core lets go of its last Work's effects (their errors) while it
// keeps their array, and deciding a posted Work on it then allocates no
// more than its answer.
func TestResetSubmitCoreKeepsOnlyItsArray(t *testing.T) {
	c := NewSubmitCore("d0")
	c.Step(&WaitEnded{Err: errors.New("event wait failed")})
	require.NotEmpty(t, c.out)
	c.reset("d1")
	require.Empty(t, c.out)
	for i, e := range c.out[:cap(c.out)] {
		assert.Nil(t, e, "effect %d of the last Work still referenced", i)
	}
	assert.Equal(t, "d1", c.peer)

	waited, posted := &WaitEnded{}, &PostEnded{Posted: true}
	allocs := testing.AllocsPerRun(100, func() {
		c.reset("d0")
		c.Step(waited)
		c.Step(posted)
	})
	assert.LessOrEqual(t, allocs, 1.0, "the answer (an interface holding a struct) is the one allocation")
}

// The Finish caller's context reaches the shell inside StartTimer: the core
// decides that a finish is watched, the shell only watches.
func TestChunkFinishHandsTheCallerToTheTimer(t *testing.T) {
	l := layoutMLA(t, 4, 4, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	c.Step(&messages.Bind{Forward: 1})
	f, _ := finishMsg()
	f.Ctx = ctx
	var st *StartTimer
	for _, e := range c.Step(f) {
		if x, ok := e.(StartTimer); ok {
			st = &x
		}
	}
	require.NotNil(t, st)
	assert.Equal(t, ctx, st.Caller, "the shell watches the caller's context")
	d := NewChunkCore(l, planOf(cp.PerLayer, 1, 2))
	for _, e := range d.Step(&messages.Drop{Room: 7, Timeout: time.Second}) {
		if x, ok := e.(StartTimer); ok {
			assert.Nil(t, x.Caller, "a drop has no caller to watch")
		}
	}
}
