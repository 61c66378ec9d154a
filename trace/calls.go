package trace

import "github.com/kvstream/kvstream/cp/reshard"

// Façade calls have no actor message of their own but a replay through the
// engine needs them: they are recorded as these messages of actor Engine.

// RegisterCall is one Register call and its outcome.
type RegisterCall struct {
	Room       uint64
	Start, End int
	Last       bool
	SrcPages   []int
	TotalPages int
	Infos      []InfoCall
	// Chunk is the chunk the call registered or found ("" when refused).
	Chunk string
	// The outcome, recorded as the record's effect (a Registered line)
	// since the record is begun before the engine's manager answers:
	// DecodeCall fills these from it.
	PerLayer bool   `json:"-" trace:"-"`
	Existing bool   `json:"-" trace:"-"`
	Err      string `json:"-" trace:"-"`
	Plan     uint64 `json:"-" trace:"-"`
}

// Registered is a registration's outcome, the effect of its RegisterCall
// record: the mode chosen and whether the chunk existed, or the error.
type Registered struct {
	PerLayer bool
	Existing bool
	Err      string
	// Plan is the digest of the plan the registration built (plan.Plan's
	// Digest), 0 when it built none.
	Plan uint64 `json:",omitempty"`
}

// InfoCall is one decode destination of a registration.
type InfoCall struct {
	Peer     string
	DstPages []int
	Dummy    bool
}

// AddPeerCall is one AddPeer call: the peer's geometry (its addresses and
// keys are runtime values a replay recreates).
type AddPeerCall struct {
	ID      string
	ItemLen []uint64
	Pages   []int
	// Sharding is the peer's side and rank when it reshards (nil: it
	// receives the buffers one for one).
	Sharding *Sharding `json:",omitempty"`
	Err      string
}

// RemovePeerCall is one RemovePeer call: the peer forgotten, or why not.
type RemovePeerCall struct {
	ID  string
	Err string
}

// Sharding is one side's sharding of the model (plan.Sharding): the side
// and its rank.
type Sharding struct {
	Side reshard.Side
	Rank reshard.Rank
}

// Waited is a submitter's ReenterAfter continuation: the event wait of one
// Work ended (Err: it failed), and the submitter posted or reported.
type Waited struct {
	Chunk string
	Seq   int
	Dest  int
	Err   string
}
