package decode

import "github.com/kvstream/kvstream/decode/internal/core"

// RankKey is the session metadata key (DialConfig.Metadata) that carries a
// prefill session's CP rank when the server serves a CP group
// (Config.Group): every notice of the session is that rank's report.
const RankKey = core.RankKey

// Group says that every room is written by the ranks of one
// context-parallel group, each over its own prefill session: Size, its
// ranks (1 to MaxGroupSize); Rule, how the ranks split a request's pages
// (cp.Rule); PageSize, tokens per page, which maps a chunk's tokens to its
// pages. A chunk is complete only when every rank that owns at least one
// of its pages reported it successful and its pages landed.
type Group = core.Group

// MaxGroupSize bounds Group.Size: a group's ranks are tracked per chunk.
const MaxGroupSize = core.MaxGroupSize
