package simsession

import (
	"context"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/generate"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// TinyPrefill is a tiny model's prefill (generate.RunRemote) when the
// decode is another process: a generate.Decode over a decode.Client, whose
// Hello carries the run's spec (TinyKey) so that the decode process checks
// every room's tokens. Like Prefill, the session stays open after the run:
// End says goodbye with the run's outcome.
type TinyPrefill struct {
	*Prefill
	log *zap.Logger
}

var _ generate.Decode = (*TinyPrefill)(nil)

// NewTinyPrefill targets the decode process that dial names from node;
// data goes over tr.
func NewTinyPrefill(node *decode.Node, dial decode.DialConfig, tr rdma.Transport, log *zap.Logger) *TinyPrefill {
	return &TinyPrefill{Prefill: NewPrefill(node, dial, tr, 0), log: log}
}

// Open dials the decode process with the prefill pool's layout and the
// run's spec, and returns the transport and the decode pool's peer; the
// dial ends with ctx.
func (p *TinyPrefill) Open(ctx context.Context, geom testbed.Geometry, spec generate.Spec) (rdma.Transport, system.Peer, error) {
	cfg := p.dial
	cfg.Buffers, cfg.Metadata, cfg.Log = LayoutOf(geom), map[string]string{TinyKey: FormatTiny(spec)}, p.log
	c, err := p.open(ctx, cfg)
	if err != nil {
		return nil, system.Peer{}, err
	}
	return p.tr, c.Peer(), nil
}

// Notify tells the decode process of a chunk every prefill rank finished:
// the positions it wrote and their decode pages, from its registration.
// The decode process answers the room's last chunk with its token check.
func (p *TinyPrefill) Notify(spec system.ChunkSpec, res system.Result) error {
	for _, c := range p.sessions() {
		n, err := c.NoticeFor(spec, res)
		if err != nil {
			return err
		}
		if err := c.Notify(context.Background(), n); err != nil {
			return err
		}
	}
	return nil
}
