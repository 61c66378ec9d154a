package soak

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/lab/simsession"
	"go.uber.org/zap"
)

// VanishLine is what RunVanish prints once its session is open.
const VanishLine = "soak: vanish: session open"

// VanishConfig is the side lane's vanishing prefill (kvstream soak
// vanish).
type VanishConfig struct {
	// Decode is the decode's control-plane address; Name the session's.
	Decode, Name string
	// Workload and Seed give the layout and seed the legitimate prefills
	// say Hello with, so that the decode's pool takes the session.
	Workload Workload
	Seed     uint64
	// Heartbeat is its node's loss bound (the soak's --heartbeat).
	Heartbeat time.Duration
	// Log logs its control plane (default: nothing).
	Log *zap.Logger
}

// RunVanish opens a session with the decode, prints VanishLine to out and
// waits, without Bye, for ctx to end: the soak kills the process first,
// a prefill that vanished. It is a process of its own, not a node in the
// soak's: a process should hold one node (a node starting beside another
// that logs is a data race in protoactor's remote.Start, which sets gRPC's
// global logger), and a prefill that vanishes is a process that dies.
func RunVanish(ctx context.Context, cfg VanishConfig, out io.Writer) error {
	geom, _, err := cfg.Workload.Layout(cfg.Seed)
	if err != nil {
		return err
	}
	if cfg.Heartbeat < minHeartbeat || cfg.Heartbeat > maxHeartbeat {
		return errors.Newf("--heartbeat %v: want %v to %v", cfg.Heartbeat, minHeartbeat, maxHeartbeat)
	}
	node, err := decode.ListenConfig(decode.NodeConfig{Listen: "127.0.0.1:0", Heartbeat: decode.HeartbeatWithin(cfg.Heartbeat), Log: cfg.Log})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = node.Close(cctx)
	}()
	dial := decode.DialConfig{Decode: cfg.Decode, Buffers: simsession.LayoutOf(geom), PageSize: cfg.Workload.PageSize, Name: cfg.Name,
		Metadata: map[string]string{simsession.SeedKey: fmt.Sprint(cfg.Seed)}, ConnectTimeout: 30 * time.Second, Log: cfg.Log}
	c, err := decode.Dial(ctx, node, dial)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, VanishLine)
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = c.Close(cctx)
	return errors.Wrap(context.Cause(ctx), "soak vanish: the soak did not kill this process")
}
