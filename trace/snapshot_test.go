package trace

import (
	"testing"

	"github.com/kvstream/kvstream/messages"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSnapshotEndsBeforeAnOpenRecord: a snapshot taken while a record is
// begun and not finished (DumpTrace while an actor handles a message)
// ends before it, rather than write it without its effects, which a replay
// reads as effects that differ; once finished, it is in the next snapshot.
func TestSnapshotEndsBeforeAnOpenRecord(t *testing.T) {
	r := NewRecorder(8, Header{})
	r.Add(Manager, "manager", "", &messages.Timeout{}, []string{"a"})
	slot := r.Begin(Manager, "manager", "", &messages.Timeout{})
	r.Add(Manager, "manager", "", &messages.Timeout{}, []string{"c"})
	s := r.Snapshot()
	require.Len(t, s.Records, 1)
	assert.Equal(t, 1, s.Header.Records)
	assert.Equal(t, uint64(1), s.Records[0].Seq)

	r.Finish(slot, nil) // finished with no effects
	s = r.Snapshot()
	require.Len(t, s.Records, 3)
	assert.Equal(t, []uint64{1, 2, 3}, []uint64{s.Records[0].Seq, s.Records[1].Seq, s.Records[2].Seq})

	// In a ring that wrapped, an open record in the older half ends the
	// snapshot there too.
	r = NewRecorder(3, Header{})
	r.Add(Manager, "manager", "", &messages.Timeout{}, nil)
	r.Add(Manager, "manager", "", &messages.Timeout{}, nil)
	slot = r.Begin(Manager, "manager", "", &messages.Timeout{})
	r.Add(Manager, "manager", "", &messages.Timeout{}, nil) // overwrites record 1
	s = r.Snapshot()
	assert.Equal(t, uint64(1), s.Header.Dropped)
	require.Len(t, s.Records, 1)
	assert.Equal(t, uint64(2), s.Records[0].Seq)
	r.Finish(slot, []string{"late"})
	s = r.Snapshot()
	require.Len(t, s.Records, 3)
	assert.Equal(t, []string{"late"}, s.Records[1].Effects)
}
