package workload

import (
	"context"
	"sync"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// losingSide loses its decode peers right before forward at (0-based) is
// registered, so that every Register of it fails.
type losingSide struct {
	decodeSide
	at   int
	lost func(error)
}

func (s *losingSide) OnPeerLost(f func(error)) { s.lost = f; s.decodeSide.OnPeerLost(f) }

func (s *losingSide) expect(ri int, pc piece) {
	if pc.forward == s.at && s.lost != nil {
		s.lost(errors.New("planted loss"))
		s.lost = nil
	}
	s.decodeSide.expect(ri, pc)
}

// A Register error is the run's error when the decode side is the sim's
// own (nothing of it can be lost: an engine bug), naming the forward; with
// a remote decode side it is that side's loss, and the run stops early.
func TestRegisterError(t *testing.T) {
	cfg := oracleConfig()
	cfg.Requests, cfg.LayerUsPerKTok = 3, 1000
	for _, sharded := range []bool{false, true} {
		cfg := cfg
		if sharded {
			cfg.PrefillTP, cfg.DecodeTP = 2, 2
		}
		g, p := planOf(t, cfg)
		require.Len(t, p.forwards, 3, "the schedule this test assumes")

		_, err := runRig(context.Background(), cfg, g, p, true, zap.NewNop(), func() {}, &losingSide{decodeSide: localSide(cfg, g, p), at: 1})
		require.Error(t, err, "sharded %v", sharded)
		assert.ErrorContains(t, err, "forward 2")
		assert.ErrorContains(t, err, "planted loss")

		if sharded {
			continue // RunRemote's sharded runs are simsession's tests
		}
		remote := &remotePlane{dp: &onePool{l: &localPlane{cfg: cfg, g: g, p: p}}, cfg: cfg, g: g, p: p}
		mr, err := runRig(context.Background(), cfg, g, p, true, zap.NewNop(), func() {}, &losingSide{decodeSide: remote, at: 1})
		require.NoError(t, err)
		assert.Contains(t, mr.Aborted, "forward 2")
		assert.Contains(t, mr.Aborted, "planted loss")
		assert.Equal(t, 1, mr.ForwardsDone)
	}
}

// TestWorkersDrain: drain returns only once every piece handed over was
// finished, on every rank, and stop then ends the workers.
func TestWorkersDrain(t *testing.T) {
	gate := make(chan struct{})
	var mu sync.Mutex
	var done []piece
	ws := newWorkers(2, 3, 4, func(ri int, pc piece) {
		<-gate
		mu.Lock()
		done = append(done, pc)
		mu.Unlock()
	}, nil)
	for r := range 4 {
		ws.hand(piece{room: r, start: 10 * r})
	}
	close(gate)
	ws.drain()
	mu.Lock()
	assert.Len(t, done, 4*3, "every piece on every rank finished before drain returned")
	mu.Unlock()
	ws.stop()
}
