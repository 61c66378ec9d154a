package decode

import (
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
)

// NoticeFor builds the notice of a chunk that the engine registered as spec
// and whose Finish (or Drop) returned res: the ABSOLUTE request positions
// this prefill sent (its CP rank's, DialConfig.CP, from the chunk's first
// page on: invariant 5 of docs/ARCHITECTURE.md) and their pages at this
// session's decode server. A spec the engine would refuse, or one with no
// destination at this session's peer, is an error marked ErrBadInput.
func (c *Client) NoticeFor(spec plan.ChunkSpec, res messages.Result) (Notice, error) {
	n, err := noticeFor(c.peer.ID, c.cfg.PageSize, c.cfg.CP, spec, res)
	return n, public(err)
}

func noticeFor(peer string, pageSize int, ranks cp.CP, spec plan.ChunkSpec, res messages.Result) (Notice, error) {
	rng, err := cp.ChunkRange(spec.Start, spec.End, pageSize, spec.Last)
	if err != nil {
		return Notice{}, errors.Wrapf(err, "room %d", spec.Room)
	}
	if len(spec.SrcPages) < rng.Pages {
		return Notice{}, badInput("room %d chunk [%d, %d): %d source pages, the range needs %d", spec.Room, rng.Start, rng.End, len(spec.SrcPages), rng.Pages)
	}
	if ranks.Size == 0 {
		ranks.Size = 1
	}
	_, pos, err := ranks.Owned(spec.SrcPages[:rng.Pages], rng.PageStart, spec.TotalPages)
	if err != nil {
		return Notice{}, errors.Wrapf(err, "room %d chunk [%d, %d)", spec.Room, rng.Start, rng.End)
	}
	for _, in := range spec.Infos {
		if in.Peer != peer || in.Dummy {
			continue
		}
		dst, err := cp.DstPages(in.DstPages, pos)
		if err != nil {
			return Notice{}, errors.Wrapf(err, "room %d chunk [%d, %d)", spec.Room, rng.Start, rng.End)
		}
		return Notice{Result: res, Last: spec.Last, Positions: pos, DstPages: dst}, nil
	}
	return Notice{}, badInput("room %d: no destination at peer %q among the chunk's %d decode infos", spec.Room, peer, len(spec.Infos))
}
