package actors

import (
	"github.com/kvstream/kvstream/messages"
)

// ManagerCore routes registrations, finishes and drops to room actors. A room
// actor lives while it holds chunks; it is retired (StopRoom: the shell stops
// it, or keeps its process for a later room) only when it reported idle after
// handling every message the manager routed to it, so that no message is
// ever routed to a retired room.
type ManagerCore struct {
	rooms map[uint64]uint64 // room -> messages routed to it
	out   []Effect
}

// NewManagerCore returns an empty manager core.
func NewManagerCore() *ManagerCore { return &ManagerCore{rooms: map[uint64]uint64{}} }

// Rooms returns how many room actors are alive.
func (c *ManagerCore) Rooms() int { return len(c.rooms) }

// Step feeds one message; the returned slice is reused by the next call.
func (c *ManagerCore) Step(msg any) []Effect {
	// Cleared, not only truncated: a Route holds its message (a Finish's
	// context and reply channel, an AddChunk's start and job) until
	// overwritten.
	clear(c.out)
	c.out = c.out[:0]
	switch m := msg.(type) {
	case *messages.AddChunk:
		c.route(m.Chunk.Room, m, true)
	case *messages.Finish:
		if !c.route(m.Room, m, false) {
			c.out = append(c.out, AnswerFinish{To: m.Reply, Result: messages.Result{
				Status: messages.Failed,
				Err:    noChunk(m.Room, "finish"),
			}})
		}
	case *messages.Drop:
		if !c.route(m.Room, m, false) {
			c.out = append(c.out, AnswerDrop{To: m.Reply, Results: []messages.Result{{
				Status: messages.Failed,
				Err:    noChunk(m.Room, "drop"),
			}}})
		}
	case *messages.RoomIdle:
		if sent, ok := c.rooms[m.Room]; ok && sent == m.Seen {
			delete(c.rooms, m.Room)
			c.out = append(c.out, StopRoom{Room: m.Room})
		}
	}
	return c.out
}

func (c *ManagerCore) route(room uint64, msg any, spawn bool) bool {
	sent, ok := c.rooms[room]
	if !ok {
		if !spawn {
			return false
		}
		c.out = append(c.out, SpawnRoom{Room: room})
	}
	c.rooms[room] = sent + 1
	c.out = append(c.out, Route{Room: room, Msg: msg})
	return true
}
