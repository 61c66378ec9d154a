package trace

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
	// Outcome: the mode chosen, the chunk, whether it existed, or the error.
	PerLayer bool
	Chunk    string
	Existing bool
	Err      string
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
	Err     string
}

// Waited is a submitter's ReenterAfter continuation: the event wait of one
// Work ended (Err: it failed), and the submitter posted or reported.
type Waited struct {
	Chunk string
	Seq   int
	Dest  int
	Err   string
}
