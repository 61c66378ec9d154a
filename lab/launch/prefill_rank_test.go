package launch

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/simsession"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestRankGoodbyesStopWithTheRank: goodbyes spawned (by OnDrain, on the
// node's goroutines) while the rank stops either run before closeByes
// returns or not at all, and none starts after it (run under -race: a
// WaitGroup Add racing its Wait is reported).
func TestRankGoodbyesStopWithTheRank(t *testing.T) {
	k := &rank{}
	var ran, after atomic.Int64
	var closed atomic.Bool
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				k.spawnBye(func() {
					ran.Add(1)
					if closed.Load() {
						after.Add(1)
					}
				})
			}
		})
	}
	k.closeByes()
	closed.Store(true)
	wg.Wait()
	k.spawnBye(func() { after.Add(1) })
	k.byes.Wait() // a goodbye started despite closeByes would be counted
	assert.Zero(t, after.Load(), "a goodbye ran after closeByes returned")
	t.Logf("%d goodbyes ran before the rank stopped", ran.Load())
}

// TestSessionWithAnInstanceThatDrainsAtOnce: a decode instance that says
// it drains between its answer to the rank's Hello and the rank's OnDrain
// (a rolling restart's SIGTERM while the rank dials it) has the rank's
// goodbye callback run at once, on the rank's own goroutine. The rank held
// its lock there, and the callback took it again: the rank deadlocked for
// good. Now the session is returned, and the goodbye comes.
func TestSessionWithAnInstanceThatDrainsAtOnce(t *testing.T) {
	dnode, err := decode.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	rankNode, err := decode.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("decode")
	require.NoError(t, err)
	wl := smallWorkload()
	d, err := simsession.StartGroupDecode(dnode, tr, 64<<20, decode.Group{Size: 1, PageSize: wl.PageSize}, 0, "decode-0", func(decode.Room, error) {}, zap.NewNop())
	require.NoError(t, err)
	local := cluster.NewLocal()
	res := cluster.NewResolver(local)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Close(ctx)
		_ = dnode.Close(ctx)
		_ = rankNode.Close(ctx)
		_ = tr.Close()
		res.Close()
		_ = local.Close()
	})
	_, err = local.Register(context.Background(), cluster.Member{ID: "decode-0", Role: cluster.RoleDecode, Addr: dnode.Addr()})
	require.NoError(t, err)

	// The dial returns only once the client heard the instance drain.
	drained := make(chan error, 1)
	dialDecode = func(ctx context.Context, node *decode.Node, cfg decode.DialConfig) (*decode.Client, error) {
		c, err := decode.Dial(ctx, node, cfg)
		if err != nil {
			return nil, err
		}
		go func() { drained <- d.Server.Drain(context.Background()) }()
		for c.Draining() == "" {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Millisecond):
			}
		}
		return c, nil
	}
	t.Cleanup(func() { dialDecode = decode.Dial })

	k := &rank{cfg: wl, id: "g0-r0", node: rankNode, res: res, log: zap.NewNop(), out: NewEmitter(io.Discard),
		sessions: map[string]*decode.Client{}, active: map[string]int{}}
	got := make(chan error, 1)
	go func() {
		_, err := k.session(context.Background(), "decode-0", testbed.MLA(2, 64, 8))
		got <- err
	}()
	wait := time.NewTimer(time.Minute)
	defer wait.Stop()
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-wait.C:
		t.Fatal("the rank did not return its session: it deadlocked on its own lock")
	}
	// The goodbye the drain asked for comes: the instance's drain ends.
	select {
	case err := <-drained:
		require.NoError(t, err)
	case <-wait.C:
		t.Fatal("no goodbye: the instance's drain did not end")
	}
	k.closeByes()
}

// A decode instance slow to answer a dial (or partitioned: the dial waits
// out its timeout) holds up only the batches for it: the rank dialed under
// the lock every batch's begin and end take, so its batches for every
// other instance waited behind that dial. A second batch for the slow
// instance waits for the same dial's outcome.
func TestSlowDialHoldsUpOnlyItsInstance(t *testing.T) {
	local := cluster.NewLocal()
	res := cluster.NewResolver(local)
	t.Cleanup(func() { res.Close(); _ = local.Close() })
	_, err := local.Register(context.Background(), cluster.Member{ID: "slow", Role: cluster.RoleDecode, Addr: "127.0.0.1:1"})
	require.NoError(t, err)
	release, entered := make(chan struct{}), make(chan struct{}, 4)
	dialDecode = func(context.Context, *decode.Node, decode.DialConfig) (*decode.Client, error) {
		entered <- struct{}{}
		<-release
		return nil, errors.New("refused on purpose")
	}
	t.Cleanup(func() { dialDecode = decode.Dial })
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })

	k := &rank{cfg: smallWorkload(), id: "g0-r0", res: res, log: zap.NewNop(), out: NewEmitter(io.Discard),
		sessions: map[string]*decode.Client{}, active: map[string]int{}}
	geom := testbed.MLA(2, 64, 8)
	got := make(chan error, 2)
	go func() { _, err := k.session(context.Background(), "slow", geom); got <- err }()
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("the dial did not start")
	}
	go func() { _, err := k.session(context.Background(), "slow", geom); got <- err }()

	other := make(chan struct{})
	go func() {
		k.begin("fast")
		k.end("fast")
		_ = k.row()
		close(other)
	}()
	select {
	case <-other:
	case <-time.After(10 * time.Second):
		t.Fatal("a batch for another instance waited for the slow instance's dial")
	}
	once.Do(func() { close(release) })
	for range 2 {
		select {
		case err := <-got:
			require.ErrorContains(t, err, "refused on purpose")
		case <-time.After(time.Minute):
			t.Fatal("a session call for the slow instance did not return")
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	assert.Empty(t, k.sessions, "a failed dial leaves no session")
	assert.Empty(t, k.dialing, "nor a dial in progress")
}
